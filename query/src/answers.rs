//! The named reports' answers, kept while what they read is unchanged: an analyst's page
//! asks the same reports each time it is opened, and the limit review over a week of raw
//! decisions takes seconds.
//!
//! An answer is found again only for the same SQL (a report's SQL carries its range as
//! literal times, so a default range that moves with the clock is another SQL), reading
//! the same files (each file's path, size, time and tag, as the query's plan lists them
//! from the tables' Delta snapshots: a flush, a compaction or a rollup into the range is
//! another list) under the same policy document (the `policies` table, and the names
//! reports resolve). Commits outside the range leave its answers kept, so a range of
//! closed hours stays kept while ingest commits new minutes. Ad-hoc SQL is never kept: it
//! may read the clock. Only JSON answers are kept, bounded in total bytes (with their
//! file lists), the least recently used leaving first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use verdict_limiter::PolicySnapshot;

/// At most this many answers are kept, whatever their size.
const MAX_ENTRIES: usize = 256;

/// What an answer was computed from.
#[derive(Debug, Clone)]
pub struct AnswerKey {
    sql: String,
    files: Vec<String>,
    policy: Option<Arc<PolicySnapshot>>,
}

impl AnswerKey {
    /// The key of `sql` reading `files` (each described by path, size, time and tag) under
    /// `policy` (`None`: no policy source).
    pub fn new(sql: &str, files: Vec<String>, policy: Option<Arc<PolicySnapshot>>) -> Self {
        Self {
            sql: sql.to_string(),
            files,
            policy,
        }
    }

    /// What the key names, as 32 hex digits (BLAKE3 of the SQL, the files and the policy
    /// document): a stored part carries it, so a reader takes the part only for the same
    /// SQL over the same files under the same policy.
    pub fn fingerprint(&self) -> String {
        let mut h = blake3::Hasher::new();
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(self.sql.as_bytes());
        for file in &self.files {
            field(file.as_bytes());
        }
        match &self.policy {
            Some(p) => field(&serde_json::to_vec(p.document()).unwrap_or_default()),
            None => field(b"no policy"),
        }
        hex::encode(&h.finalize().as_bytes()[..16])
    }

    /// Bytes the key holds.
    fn size(&self) -> usize {
        self.sql.len() + self.files.iter().map(String::len).sum::<usize>()
    }

    fn same(&self, other: &Self) -> bool {
        self.sql == other.sql
            && self.files == other.files
            && match (&self.policy, &other.policy) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.document() == b.document(),
                _ => false,
            }
    }
}

#[derive(Debug)]
struct Entry {
    key: AnswerKey,
    body: Bytes,
    rows: usize,
}

impl Entry {
    fn size(&self) -> usize {
        self.key.size() + self.body.len()
    }
}

/// The kept answers.
#[derive(Debug)]
pub struct Answers {
    max_bytes: usize,
    kept: Mutex<(VecDeque<Entry>, usize)>,
}

impl Answers {
    /// Keeps up to `max_bytes` of answers (0: none).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            kept: Mutex::new((VecDeque::new(), 0)),
        }
    }

    /// Whether answers are kept at all.
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The answer kept for `key` (its body and rows), now the most recently used.
    pub fn get(&self, key: &AnswerKey) -> Option<(Bytes, usize)> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let i = kept.0.iter().position(|e| e.key.same(key))?;
        let entry = kept.0.remove(i)?;
        let found = (entry.body.clone(), entry.rows);
        kept.0.push_back(entry);
        Some(found)
    }

    /// Keeps `body` as the answer for `key`; an answer (with its key) larger than a
    /// quarter of the room is not kept, and the least recently used leave to make room.
    pub fn put(&self, key: AnswerKey, body: Bytes, rows: usize) {
        let entry = Entry { key, body, rows };
        let size = entry.size();
        if size > self.max_bytes / 4 {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, bytes) = &mut *kept;
        if let Some(i) = entries.iter().position(|e| e.key.same(&entry.key))
            && let Some(old) = entries.remove(i)
        {
            *bytes -= old.size();
        }
        while !entries.is_empty()
            && (*bytes + size > self.max_bytes || entries.len() >= MAX_ENTRIES)
        {
            if let Some(old) = entries.pop_front() {
                *bytes -= old.size();
            }
        }
        *bytes += size;
        entries.push_back(entry);
    }

    /// Answers kept and their bytes (with their keys).
    pub fn size(&self) -> (usize, usize) {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        (kept.0.len(), kept.1)
    }
}

/// A file as a kept answer's key lists it: path, size, modification time and tag.
pub fn describe(m: &object_store::ObjectMeta) -> String {
    format!(
        "{} {} {} {}",
        m.location,
        m.size,
        m.last_modified.timestamp_millis(),
        m.e_tag.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sql` reading one file, `f<n>` (the key is 4 bytes).
    fn key(sql: &str, file: u8) -> AnswerKey {
        AnswerKey::new(sql, vec![format!("f{file}")], None)
    }

    #[test]
    fn an_answer_is_found_only_for_the_same_sql_reading_the_same_files() {
        let a = Answers::new(1 << 20);
        a.put(key("q1", 3), Bytes::from_static(b"one"), 1);
        assert_eq!(a.get(&key("q1", 3)), Some((Bytes::from_static(b"one"), 1)));
        assert_eq!(a.get(&key("q1", 4)), None, "another file in the range");
        assert_eq!(a.get(&key("q2", 3)), None, "another query");
    }

    #[test]
    fn a_fingerprint_names_the_sql_the_files_and_the_policy() {
        let policy = |version| {
            let mut doc = verdict_limiter::policy::parse_toml(include_str!(
                "../fixtures/policies/prove.toml"
            ))
            .unwrap();
            doc.version = version;
            Some(Arc::new(PolicySnapshot::build(doc).unwrap()))
        };
        let print = |sql: &str, files: &[&str], p| {
            AnswerKey::new(sql, files.iter().map(|f| f.to_string()).collect(), p).fingerprint()
        };
        let one = print("q", &["a", "b"], policy(1));
        assert_eq!(one.len(), 32);
        assert_eq!(one, print("q", &["a", "b"], policy(1)), "the same three");
        assert_ne!(one, print("q2", &["a", "b"], policy(1)), "another query");
        assert_ne!(one, print("q", &["a", "b", "c"], policy(1)), "another file");
        assert_ne!(
            one,
            print("q", &["ab"], policy(1)),
            "the files' bounds count"
        );
        assert_ne!(one, print("q", &["a", "b"], policy(2)), "another policy");
        assert_ne!(one, print("q", &["a", "b"], None), "no policy");
    }

    #[test]
    fn the_least_recently_used_leave_first_and_large_answers_are_not_kept() {
        // Each entry is 10 bytes: a 4-byte key and a 6-byte body.
        let a = Answers::new(40);
        for name in ["qa", "qb", "qc", "qd"] {
            a.put(key(name, 1), Bytes::from(vec![0; 6]), 1);
        }
        assert_eq!(a.size(), (4, 40));
        assert!(a.get(&key("qa", 1)).is_some(), "qa is now the most recent");
        a.put(key("qe", 1), Bytes::from(vec![0; 6]), 1);
        assert_eq!(a.size(), (4, 40), "one left to make room");
        assert!(
            a.get(&key("qb", 1)).is_none(),
            "qb, the least recently used"
        );
        assert!(a.get(&key("qa", 1)).is_some());
        a.put(key("qf", 1), Bytes::from(vec![0; 7]), 1);
        assert!(a.get(&key("qf", 1)).is_none(), "over a quarter of the room");
        assert!(!Answers::new(0).enabled());
    }
}
