//! Where the transaction log's files live and what their names say:
//! `<table>/_delta_log/<version, 20 digits>.json` for a commit,
//! `<version>.checkpoint.parquet` for a checkpoint (the protocol's classic single file, which
//! verdict writes), `<version>.checkpoint.<part>.<parts>.parquet` for one part of a
//! multi-part checkpoint (another writer's, read part by part), and `_last_checkpoint`
//! pointing at the newest checkpoint. Versions are zero-padded so that names sort as
//! versions do. A v2 checkpoint (`<version>.checkpoint.<uuid>.json` or `.parquet`, the
//! `v2Checkpoint` table feature) is recognised to be refused by name ([`v2_checkpoint`]).

use object_store::path::Path;

/// The log's folder under a table's root.
pub const LOG_DIR: &str = "_delta_log";
/// The pointer to the newest checkpoint.
pub const LAST_CHECKPOINT: &str = "_last_checkpoint";

/// What a file in the log folder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogFile {
    /// The commit of a version.
    Commit(i64),
    /// A single-file checkpoint of a version.
    Checkpoint(i64),
    /// Part `part` (from 1) of a checkpoint of a version in `parts` files.
    CheckpointPart {
        /// The version.
        version: i64,
        /// Which part, from 1.
        part: u32,
        /// How many parts the checkpoint has.
        parts: u32,
    },
}

impl LogFile {
    /// The version the file is about.
    pub fn version(&self) -> i64 {
        match self {
            Self::Commit(v) | Self::Checkpoint(v) => *v,
            Self::CheckpointPart { version, .. } => *version,
        }
    }

    /// Parses a log file's name (the last segment of a path); `None` for anything else
    /// (`_last_checkpoint`, v2 checkpoints, temporary files).
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.rsplit('/').next().unwrap_or(name);
        let digits = |s: &str| {
            (s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        if let Some(v) = name.strip_suffix(".json") {
            return digits(v).map(Self::Commit);
        }
        if let Some(v) = name.strip_suffix(".checkpoint.parquet") {
            return digits(v).map(Self::Checkpoint);
        }
        // `<version>.checkpoint.<part, 10 digits>.<parts, 10 digits>.parquet`.
        let rest = name.strip_suffix(".parquet")?;
        let mut fields = rest.split('.');
        let (version, word, part, parts) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        let ten = |s: &str| {
            (s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        let (part, parts) = (ten(part)?, ten(parts)?);
        (fields.next().is_none() && word == "checkpoint" && (1..=parts).contains(&part))
            .then_some(())?;
        Some(Self::CheckpointPart {
            version: digits(version)?,
            part,
            parts,
        })
    }

    /// Its path under the table's root.
    pub fn path(&self, root: &Path) -> Path {
        match self {
            Self::Commit(v) => log_path(root, &format!("{v:020}.json")),
            Self::Checkpoint(v) => log_path(root, &format!("{v:020}.checkpoint.parquet")),
            Self::CheckpointPart {
                version,
                part,
                parts,
            } => log_path(
                root,
                &format!("{version:020}.checkpoint.{part:010}.{parts:010}.parquet"),
            ),
        }
    }
}

/// The version of a v2 checkpoint's file name (`<version>.checkpoint.<uuid>.json` or
/// `.parquet`, the `v2Checkpoint` table feature), which verdict does not read.
pub fn v2_checkpoint(name: &str) -> Option<i64> {
    let name = name.rsplit('/').next().unwrap_or(name);
    let rest = name
        .strip_suffix(".json")
        .or_else(|| name.strip_suffix(".parquet"))?;
    let mut fields = rest.split('.');
    let (version, word, id) = (fields.next()?, fields.next()?, fields.next()?);
    let uuid = id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    (fields.next().is_none() && word == "checkpoint" && uuid && version.len() == 20)
        .then(|| version.parse().ok())
        .flatten()
}

/// `<root>/_delta_log/<name>`.
pub fn log_path(root: &Path, name: &str) -> Path {
    root.clone().join(LOG_DIR).join(name)
}

/// `<root>/_delta_log/`.
pub fn log_dir(root: &Path) -> Path {
    root.clone().join(LOG_DIR)
}

/// The object path of a data file whose `add` says `path` (URI-encoded, relative to the
/// table's root).
pub fn data_path(root: &Path, path: &str) -> Path {
    let decoded = percent_decode(path);
    let mut out = root.clone();
    for part in decoded.split('/').filter(|p| !p.is_empty()) {
        out = out.join(part);
    }
    out
}

/// The object of a data file's `add` in the table at `root`, as a listing would give it.
pub fn data_object(root: &Path, add: &crate::action::Add) -> object_store::ObjectMeta {
    object_store::ObjectMeta {
        location: data_path(root, &add.path),
        last_modified: chrono::DateTime::from_timestamp_millis(add.modification_time)
            .unwrap_or_default(),
        size: u64::try_from(add.size).unwrap_or(0),
        e_tag: None,
        version: None,
    }
}

/// The relative, URI-encoded path an `add` gives for an object under the table's root.
/// Only the characters a URI path may not hold are encoded (verdict's own names hold none).
pub fn relative_path(root: &Path, location: &Path) -> Option<String> {
    let parts: Vec<String> = location
        .prefix_match(root)?
        .map(|p| percent_encode(p.as_ref()))
        .collect();
    (!parts.is_empty()).then(|| parts.join("/"))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~=+:@!$&'()*,;".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_names_parse_and_sort_as_versions() {
        let root = Path::from("raw");
        let c = LogFile::Commit(7);
        assert_eq!(
            c.path(&root).as_ref(),
            "raw/_delta_log/00000000000000000007.json"
        );
        assert_eq!(LogFile::parse(c.path(&root).as_ref()), Some(c));
        let k = LogFile::Checkpoint(10);
        assert_eq!(
            LogFile::parse("00000000000000000010.checkpoint.parquet"),
            Some(k)
        );
        let part = LogFile::CheckpointPart {
            version: 10,
            part: 1,
            parts: 2,
        };
        assert_eq!(
            LogFile::parse("00000000000000000010.checkpoint.0000000001.0000000002.parquet"),
            Some(part)
        );
        assert_eq!(LogFile::parse(part.path(&root).as_ref()), Some(part));
        let v2 = "00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json";
        assert_eq!(v2_checkpoint(v2), Some(10));
        for other in [
            "_last_checkpoint",
            "7.json",
            v2,
            "00000000000000000010.checkpoint.0000000003.0000000002.parquet",
            "00000000000000000007.json.tmp",
            "00000000000000000007.crc",
        ] {
            assert_eq!(LogFile::parse(other), None, "{other}");
        }
        assert_eq!(
            v2_checkpoint("00000000000000000010.checkpoint.parquet"),
            None
        );
        assert!(LogFile::Commit(9).path(&root).as_ref() < LogFile::Commit(10).path(&root).as_ref());
    }

    #[test]
    fn data_paths_are_relative_to_the_root_and_uri_encoded() {
        let root = Path::from("rollup/denied_hourly");
        let loc = Path::from("rollup/denied_hourly/date=2026-11-30/hour=14/f.parquet");
        let rel = relative_path(&root, &loc).unwrap();
        assert_eq!(rel, "date=2026-11-30/hour=14/f.parquet");
        assert_eq!(data_path(&root, &rel), loc);
        // As another engine may spell a partition value with a space and a colon.
        let spark = "hour=2026-11-30%2014%3A00%3A00/part-0.parquet";
        assert_eq!(
            data_path(&root, spark),
            root.clone()
                .join("hour=2026-11-30 14:00:00")
                .join("part-0.parquet")
        );
        assert_eq!(relative_path(&root, &Path::from("raw/x.parquet")), None);
    }
}
