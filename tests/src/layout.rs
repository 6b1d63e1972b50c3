//! The workspace's layout, read from its sources: which file of a crate names which other,
//! and the circles among them. A file names another by a path into it (`use
//! crate::range::Range`, `super::params::Args`, `levels::REVIEW` from the module that
//! declares `levels`, inline or in a `use`); a circle is a set of files each reachable from
//! the others, which no one can read or change alone. Comments and a file's tests (from its
//! first `#[cfg(test)]`) are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path within its crate (`["reports", "params"]`; the crate root is empty).
pub type Module = Vec<String>;

/// Each module of the crate whose sources are under `src` (its `lib.rs` or `main.rs` and
/// the files below), and the modules it names.
pub fn module_graph(src: &Path) -> std::io::Result<BTreeMap<Module, BTreeSet<Module>>> {
    let mut files = BTreeMap::new();
    collect(src, src, &mut files)?;
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path)?;
        let mut named = BTreeSet::new();
        for reference in references(&code_of(&text)) {
            if let Some(target) = resolve(module, &reference, &modules)
                && &target != module
            {
                named.insert(target);
            }
        }
        graph.insert(module.clone(), named);
    }
    Ok(graph)
}

/// The circles of `graph` (its strongly connected sets of more than one module), each
/// sorted, in order.
pub fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    // Tarjan's algorithm, iterative over an explicit stack of (module, next edge).
    let index_of: BTreeMap<&Module, usize> =
        graph.keys().enumerate().map(|(i, m)| (m, i)).collect();
    let nodes: Vec<&Module> = graph.keys().collect();
    let edges: Vec<Vec<usize>> = nodes
        .iter()
        .map(|m| {
            graph[*m]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut next, mut stack, mut out) = (0, Vec::new(), Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut edge)) = work.last_mut() {
            if let Some(&w) = edges[v].get(*edge) {
                *edge += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut circle = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    circle.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if circle.len() > 1 {
                    circle.sort();
                    out.push(circle);
                }
            }
        }
    }
    out.sort();
    out
}

/// A module as people write it: `crate::reports::params` (`crate` for the root).
pub fn shown(module: &Module) -> String {
    std::iter::once("crate")
        .chain(module.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(root).unwrap_or(&path).with_extension("");
        let mut module: Module = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|l| l == "mod") {
            module.pop();
        }
        if module == ["lib"] || module == ["main"] {
            module.clear();
        }
        // A binary's own files under `src/bin` are crates of their own.
        if module.first().is_some_and(|f| f == "bin") {
            continue;
        }
        out.insert(module, path);
    }
    Ok(())
}

/// `text` without its tests (from the first `#[cfg(test)]`) and without comments.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal (a URL) is rare in paths' lines; a line whose
            // code starts with `//` is a comment either way.
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path of two segments or more in `code` (`a::b`, `a::b::{c, d::e}` as `a::b::c`
/// and `a::b::d`), as its segments.
fn references(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // The start of a word not preceded by `::` or another word character.
        let after_path = i >= 2 && &bytes[i - 2..i] == b"::";
        let starts = word(bytes[i]) && (i == 0 || !(word(bytes[i - 1]) || after_path));
        if !starts {
            i += 1;
            continue;
        }
        let (path, end) = path_at(code, i);
        i = end.max(i + 1);
        // A group: `path::{a, b::c, …}` names path::a and path::b.
        if code[end..].starts_with("::{") {
            let inner_start = end + 3;
            let mut depth = 1;
            let mut j = inner_start;
            while j < bytes.len() && depth > 0 {
                match bytes[j] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
            let inner = &code[inner_start..j.saturating_sub(1)];
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                if !(c == ',' && depth == 0) {
                    item.push(c);
                }
            }
            items.push(item);
            for item in items {
                let first = item
                    .trim()
                    .split("::")
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                match first.as_str() {
                    // After a trailing comma.
                    "" => {}
                    "self" | "*" => out.push(path.clone()),
                    _ => {
                        let mut full = path.clone();
                        full.push(first);
                        out.push(full);
                    }
                }
            }
            i = j;
            continue;
        }
        if path.len() >= 2 {
            out.push(path);
        }
    }
    out
}

/// The path starting at byte `start` of `code` (segments joined by `::`), and where it ends.
fn path_at(code: &str, start: usize) -> (Vec<String>, usize) {
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut segments = Vec::new();
    let mut i = start;
    loop {
        let from = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        if i == from {
            break;
        }
        segments.push(code[from..i].to_owned());
        if code[i..].starts_with("::") && i + 2 < bytes.len() && word(bytes[i + 2]) {
            i += 2;
        } else {
            break;
        }
    }
    (segments, i)
}

/// The module of `modules` that `path`, written in `module`, names: the longest prefix of
/// its absolute form that is a module. `None` for a path outside the crate.
fn resolve(module: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut base, rest): (Module, &[String]) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (module.clone(), &path[1..]),
        "super" => {
            let mut base = module.clone();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        first => {
            // A child module, named from the module that declares it.
            let mut child = module.clone();
            child.push(first.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            (module.clone(), path)
        }
    };
    let mut best = modules.contains(&base).then(|| base.clone());
    for segment in rest {
        base.push(segment.clone());
        if modules.contains(&base) {
            best = Some(base.clone());
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the tests crate lies in the workspace")
            .to_path_buf()
    }

    fn said(circles: &[Vec<Module>]) -> String {
        circles
            .iter()
            .map(|c| c.iter().map(shown).collect::<Vec<_>>().join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// No crate of the workspace has a circle of files: each is read from the bottom up.
    #[test]
    fn no_crate_has_a_circle_of_files() {
        let root = workspace();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members: Vec<&str> = manifest
            .split("members = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("the workspace lists its members")
            .split(',')
            .map(|m| m.trim().trim_matches('"'))
            .filter(|m| !m.is_empty())
            .collect();
        assert!(members.len() >= 10, "{members:?}");
        let mut found = Vec::new();
        for member in &members {
            let graph = module_graph(&root.join(member).join("src")).unwrap();
            for circle in circles(&graph) {
                found.push(format!("{member}: {}", said(&[circle])));
            }
        }
        assert!(found.is_empty(), "circles of files:\n{}", found.join("\n"));
    }

    /// The query crate's layout: the parts name no report, the guard and the ranges are
    /// pure, and a report names its own parameters and the first levels it reads only.
    #[test]
    fn the_query_crate_is_planned_around_its_reports() {
        let graph = module_graph(&workspace().join("query/src")).unwrap();
        assert!(graph.len() > 40, "read only {} modules", graph.len());
        let names = |m: &[&str]| -> Vec<String> {
            let module: Module = m.iter().map(|s| s.to_string()).collect();
            graph[&module].iter().map(shown).collect()
        };
        assert!(
            !names(&["parts"])
                .iter()
                .any(|n| n.starts_with("crate::reports")),
            "{:?}",
            names(&["parts"])
        );
        assert_eq!(names(&["range"]), vec!["crate::error"]);
        assert_eq!(names(&["guard"]), vec!["crate::error"]);
        for n in names(&["reports", "top_denied"]) {
            assert!(
                [
                    "crate::error",
                    "crate::reports::params",
                    "crate::reports::levels"
                ]
                .contains(&n.as_str()),
                "{n}"
            );
        }
    }

    /// The reader of paths finds what a circle is made of: a module and its child naming
    /// each other through `super` and a group.
    #[test]
    fn a_circle_through_a_parent_and_its_child_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::create_dir(src.join("a")).unwrap();
        std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
        std::fs::write(
            src.join("a.rs"),
            "mod c;\nuse c::{Thing, other::More,};\n// use crate::b::X;\n",
        )
        .unwrap();
        std::fs::write(src.join("a/c.rs"), "use super::Parent;\n").unwrap();
        std::fs::write(
            src.join("b.rs"),
            "fn f() { crate::a::f() }\n#[cfg(test)]\nmod tests { use crate::b; }\n",
        )
        .unwrap();
        let graph = module_graph(src).unwrap();
        let m = |s: &[&str]| -> Module { s.iter().map(|x| x.to_string()).collect() };
        assert_eq!(graph[&m(&["a"])], [m(&["a", "c"])].into());
        assert_eq!(graph[&m(&["b"])], [m(&["a"])].into());
        assert_eq!(circles(&graph), vec![vec![m(&["a"]), m(&["a", "c"])]]);
    }
}
