//! Which raw files make up one hour of the raw table.
//!
//! A reader takes every `.parquet` object in the hour's folder whose name parses as a raw
//! file name, except those whose offset range lies inside another file's range for the
//! same topic partition (DESIGN.md, "Readers never double count"): compaction writes the
//! covering file before it deletes the covered ones, so in between a reader counts each
//! row once.

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use verdict_schemas::layout::{HourPartition, RawFileName};

/// One raw file of an hour, with its parsed name.
#[derive(Debug, Clone)]
pub struct RawFile {
    /// The object, as listed.
    pub meta: ObjectMeta,
    /// Its name, parsed.
    pub name: RawFileName,
}

/// The files a reader takes for `hour`, ordered by path, and the objects in the folder
/// that are not raw files (left alone, reported for the log).
#[derive(Debug, Clone, Default)]
pub struct HourFiles {
    /// The files that make up the hour, each row in exactly one of them.
    pub files: Vec<RawFile>,
    /// Files left out because another file covers their offsets.
    pub covered: Vec<RawFile>,
    /// Objects in the folder whose names are not raw file names.
    pub foreign: Vec<Path>,
}

impl HourFiles {
    /// Total bytes of the files taken.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.meta.size).sum()
    }

    /// A fingerprint of the files taken (names and sizes), to tell later whether the hour
    /// changed: FNV-1a over the sorted `name size` lines, as 16 hex digits.
    pub fn fingerprint(&self) -> String {
        fingerprint(
            self.files
                .iter()
                .map(|f| format!("{} {}", f.name, f.meta.size)),
        )
    }
}

/// A stable fingerprint of some lines (FNV-1a 64 over each line and a newline), as 16 hex
/// digits: the same lines in the same order give the same fingerprint on every build.
pub fn fingerprint(lines: impl IntoIterator<Item = String>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Keeps the files no other file covers. `files` may come in any order; the result is
/// ordered by path.
pub fn effective(mut files: Vec<RawFile>) -> (Vec<RawFile>, Vec<RawFile>) {
    files.sort_by(|a, b| a.meta.location.cmp(&b.meta.location));
    let covered_at: Vec<bool> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            files
                .iter()
                .enumerate()
                .any(|(j, g)| i != j && f.name.is_covered_by(&g.name) && f.name != g.name)
        })
        .collect();
    let mut kept = Vec::new();
    let mut covered = Vec::new();
    for (f, is_covered) in files.into_iter().zip(covered_at) {
        if is_covered {
            covered.push(f);
        } else {
            kept.push(f);
        }
    }
    (kept, covered)
}

/// Lists `hour`'s raw folder and picks the files a reader takes.
pub async fn hour_files(
    store: &dyn ObjectStore,
    hour: &HourPartition,
) -> object_store::Result<HourFiles> {
    let prefix = Path::from(hour.raw_prefix());
    let listed: Vec<ObjectMeta> = store.list(Some(&prefix)).try_collect().await?;
    let mut raw = Vec::new();
    let mut foreign = Vec::new();
    for meta in listed {
        match meta.location.filename().map(str::parse::<RawFileName>) {
            Some(Ok(name)) => raw.push(RawFile { meta, name }),
            _ => foreign.push(meta.location),
        }
    }
    let (files, covered) = effective(raw);
    Ok(HourFiles {
        files,
        covered,
        foreign,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: i32, first: i64, last: i64) -> RawFile {
        let name = RawFileName::new("t", p, first, last).unwrap();
        RawFile {
            meta: ObjectMeta {
                location: Path::from(format!("raw/date=2026-11-30/hour=14/{name}")),
                last_modified: chrono::DateTime::UNIX_EPOCH,
                size: 100,
                e_tag: None,
                version: None,
            },
            name,
        }
    }

    #[test]
    fn a_file_inside_another_files_range_of_the_same_partition_is_left_out() {
        let (kept, covered) = effective(vec![
            file(0, 10, 19),
            file(0, 0, 9),
            file(0, 0, 29),
            file(1, 5, 9),
            file(0, 30, 39),
        ]);
        let names: Vec<String> = kept.iter().map(|f| f.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "t+00000+00000000000000000000+00000000000000000029.parquet",
                "t+00000+00000000000000000030+00000000000000000039.parquet",
                "t+00001+00000000000000000005+00000000000000000009.parquet",
            ]
        );
        assert_eq!(covered.len(), 2);
    }

    #[test]
    fn the_fingerprint_changes_with_a_file_or_a_size() {
        let a = HourFiles {
            files: vec![file(0, 0, 9)],
            ..HourFiles::default()
        };
        let mut b = a.clone();
        b.files.push(file(0, 10, 19));
        let mut c = a.clone();
        c.files[0].meta.size = 101;
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
    }
}
