//! The key directory: which API key is which key id, at which tier. Authentication is not
//! the limiter's business: a key in this directory already exists; a request without one,
//! or with one the directory does not know, gets 401 and the limiter never runs.
//!
//! The file is CSV with a header, one key per line: `api_key,key_id,tier` (key id: 32 hex
//! digits; tier: a tier name of the policy). Lines starting with `#` are comments. The
//! file is re-read when it changes; a file with a bad line is refused whole (the line and
//! field named) and the last directory stays.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use verdict_schemas::KeyId;

/// One known key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// The key id the limiter counts under.
    pub key_id: KeyId,
    /// The tier's name, as in the policy (shared: a lookup copies a pointer, not the name).
    pub tier: Arc<str>,
}

/// Why a directory file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The file could not be read.
    #[error("reading key directory {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("key directory {path} line {line}: {field}: {problem}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// Parses a directory. `path` only names the file in errors.
pub fn parse(path: &str, text: &str) -> Result<HashMap<String, KeyEntry>, KeysError> {
    let mut out = HashMap::new();
    let err = |line: usize, field: &'static str, problem: String| KeysError::Line {
        path: path.to_owned(),
        line,
        field,
        problem,
    };
    let mut header_seen = false;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !header_seen {
            header_seen = true;
            if line.replace(' ', "") != "api_key,key_id,tier" {
                return Err(err(
                    n,
                    "header",
                    format!("expected \"api_key,key_id,tier\", got {line:?}"),
                ));
            }
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [api_key, key_id, tier] = fields.as_slice() else {
            return Err(err(
                n,
                "line",
                format!(
                    "expected 3 fields (api_key,key_id,tier), got {}",
                    fields.len()
                ),
            ));
        };
        if api_key.is_empty() {
            return Err(err(n, "api_key", "must not be empty".into()));
        }
        let key_id: KeyId = key_id
            .parse()
            .map_err(|e| err(n, "key_id", format!("{e}")))?;
        if tier.is_empty() {
            return Err(err(n, "tier", "must not be empty".into()));
        }
        let entry = KeyEntry {
            key_id,
            tier: Arc::from(*tier),
        };
        if out.insert((*api_key).to_owned(), entry).is_some() {
            return Err(err(n, "api_key", "listed twice".into()));
        }
    }
    Ok(out)
}

/// The directory in force, swapped atomically when the file changes.
#[derive(Debug, Clone, Default)]
pub struct KeyDirectory {
    current: Arc<arc_swap::ArcSwap<HashMap<String, KeyEntry>>>,
}

impl KeyDirectory {
    /// A directory of `keys`.
    pub fn new(keys: HashMap<String, KeyEntry>) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(keys)),
        }
    }

    /// Reads a directory file.
    ///
    /// # Errors
    /// When the file cannot be read or a line is malformed.
    pub fn load(path: &std::path::Path) -> Result<Self, KeysError> {
        Ok(Self::new(read(path)?.1))
    }

    /// The entry of `api_key` (a copy of the key id and of the tier's pointer: no
    /// allocation on the request path).
    pub fn get(&self, api_key: &str) -> Option<KeyEntry> {
        self.current.load().get(api_key).cloned()
    }

    /// How many keys are known.
    pub fn len(&self) -> usize {
        self.current.load().len()
    }

    /// True when no key is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn read(path: &std::path::Path) -> Result<(String, HashMap<String, KeyEntry>), KeysError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
        path: name.clone(),
        source,
    })?;
    let keys = parse(&name, &text)?;
    Ok((text, keys))
}

/// Re-reads `path` every `every`; a changed, valid file replaces the directory.
pub fn spawn_key_refresher(
    path: PathBuf,
    dir: KeyDirectory,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let name = path.display().to_string();
    watch_file(path, every, move |text| match parse(&name, text) {
        Ok(keys) => {
            tracing::info!(keys = keys.len(), "key directory updated");
            dir.current.store(Arc::new(keys));
        }
        Err(e) => tracing::warn!(error = %e, "key directory not refreshed; the last stays"),
    })
}

/// Re-reads the file at `path` every `every` and hands its text to `changed` whenever it
/// differs from the text handed last (or read at the start): a file an operator edits while
/// the gateway runs (the key directory, the rate limit service's descriptors). A file that
/// cannot be read is said in the log and tried again at the next tick.
pub fn watch_file(
    path: PathBuf,
    every: Duration,
    mut changed: impl FnMut(&str) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = std::fs::read_to_string(&path).ok();
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            let p = path.clone();
            match tokio::task::spawn_blocking(move || std::fs::read_to_string(&p)).await {
                Ok(Ok(text)) if last.as_deref() != Some(text.as_str()) => {
                    changed(&text);
                    last = Some(text);
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(file = %path.display(), error = %e, "could not re-read the file; what it said last stays");
                }
                Err(e) => tracing::warn!(error = %e, "a file's refresh task failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_parses_and_bad_lines_are_named() {
        let text = "# keys\napi_key,key_id,tier\nk1, 0000000000000000000000000000000a ,free\n\nk2,0000000000000000000000000000000b,pro\n";
        let d = parse("keys.csv", text).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(&*d["k1"].tier, "free");
        assert_eq!(
            d["k2"].key_id.to_string(),
            "0000000000000000000000000000000b"
        );

        let e = |t: &str| parse("keys.csv", t).unwrap_err().to_string();
        assert_eq!(
            e("key,tier\n"),
            "key directory keys.csv line 1: header: expected \"api_key,key_id,tier\", got \"key,tier\""
        );
        assert!(
            e("api_key,key_id,tier\nk1,zz,free\n")
                .starts_with("key directory keys.csv line 2: key_id:")
        );
        assert_eq!(
            e("api_key,key_id,tier\nk1,0000000000000000000000000000000a\n"),
            "key directory keys.csv line 2: line: expected 3 fields (api_key,key_id,tier), got 2"
        );
        assert_eq!(
            e(
                "api_key,key_id,tier\nk1,0000000000000000000000000000000a,free\nk1,0000000000000000000000000000000b,free\n"
            ),
            "key directory keys.csv line 3: api_key: listed twice"
        );
    }
}
