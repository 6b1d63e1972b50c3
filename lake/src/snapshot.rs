//! A table as of one version: the replay of its log (a checkpoint, then the commits after
//! it) into the files that make up the table, the files removed and not yet vacuumed, and
//! each application's committed progress. Action reconciliation follows the protocol: the
//! newest `add` or `remove` of a path wins, the newest `txn` of an application wins, the
//! newest `metaData` and `protocol` win.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::action::{Action, Add, Metadata, PartitionValues, Protocol, Remove, Txn};

/// Table properties verdict reads, with the protocol's names.
pub mod config {
    /// Write a checkpoint every this many commits.
    pub const CHECKPOINT_INTERVAL: &str = "delta.checkpointInterval";
    /// How long the log keeps commits (and so how far back time travel reaches).
    pub const LOG_RETENTION: &str = "delta.logRetentionDuration";
    /// How long a removed file's bytes stay for the readers that planned before its
    /// removal, before vacuum may delete them.
    pub const DELETED_FILE_RETENTION: &str = "delta.deletedFileRetentionDuration";
    /// Whether checkpoints (and log cleanup) are written at all.
    pub const ENABLE_EXPIRED_LOG_CLEANUP: &str = "delta.enableExpiredLogCleanup";
    /// Whether the table is append-only: no commit may remove data (a `remove` with
    /// `dataChange`); rearranging it (compaction, `dataChange` false) is allowed.
    pub const APPEND_ONLY: &str = "delta.appendOnly";
}

/// The protocol's defaults for the properties above.
pub const DEFAULT_CHECKPOINT_INTERVAL: i64 = 10;
/// `interval 30 days`.
pub const DEFAULT_LOG_RETENTION: Duration = Duration::from_secs(30 * 86_400);
/// `interval 1 weeks`.
pub const DEFAULT_DELETED_FILE_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Parses a Delta interval property (`interval 7 days`, `interval 1 hour`, `30 minutes`).
pub fn parse_interval(text: &str) -> Option<Duration> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_prefix("interval").unwrap_or(&text).trim();
    let (n, unit) = text.split_once(char::is_whitespace)?;
    let n: u64 = n.trim().parse().ok()?;
    let unit = unit.trim().trim_end_matches('s');
    let secs = match unit {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n.checked_mul(secs)?))
}

/// A table as of one version.
#[derive(Debug, Clone)]
pub struct Snapshot {
    version: i64,
    protocol: Protocol,
    metadata: Metadata,
    files: BTreeMap<String, Add>,
    tombstones: BTreeMap<String, Remove>,
    txns: HashMap<String, Txn>,
    timestamp_ms: Option<i64>,
}

/// Why a log does not replay into a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version {version}: {reason}")]
pub struct ReplayError {
    /// The version at which it failed.
    pub version: i64,
    /// What is wrong.
    pub reason: String,
}

impl Snapshot {
    /// Replays the actions of version `version` (a checkpoint's, or the first commits')
    /// into a new snapshot; it must hold the `protocol` and `metaData`.
    pub fn from_actions(
        version: i64,
        actions: impl IntoIterator<Item = Action>,
    ) -> Result<Self, ReplayError> {
        let mut protocol = None;
        let mut metadata = None;
        let mut s = Self {
            version,
            protocol: Protocol::default(),
            metadata: Metadata {
                id: String::new(),
                name: None,
                description: None,
                format: Default::default(),
                schema_string: String::new(),
                partition_columns: Vec::new(),
                configuration: BTreeMap::new(),
                created_time: None,
            },
            files: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            txns: HashMap::new(),
            timestamp_ms: None,
        };
        for a in actions {
            match a {
                Action::Protocol(p) => protocol = Some(p),
                Action::MetaData(m) => metadata = Some(m),
                other => s.apply_one(other),
            }
        }
        let fail = |reason: &str| ReplayError {
            version,
            reason: reason.to_owned(),
        };
        s.protocol = protocol.ok_or_else(|| fail("the log holds no protocol action"))?;
        s.metadata = metadata.ok_or_else(|| fail("the log holds no metaData action"))?;
        s.protocol
            .check_readable()
            .map_err(|reason| ReplayError { version, reason })?;
        Ok(s)
    }

    /// Applies the commit of the next version.
    pub fn apply(
        &mut self,
        version: i64,
        actions: impl IntoIterator<Item = Action>,
    ) -> Result<(), ReplayError> {
        if version != self.version + 1 {
            return Err(ReplayError {
                version,
                reason: format!("the log skips from version {} to {version}", self.version),
            });
        }
        for a in actions {
            if let Action::Protocol(p) = &a {
                p.check_readable()
                    .map_err(|reason| ReplayError { version, reason })?;
            }
            self.apply_one(a);
        }
        self.version = version;
        Ok(())
    }

    fn apply_one(&mut self, action: Action) {
        match action {
            Action::Protocol(p) => self.protocol = p,
            Action::MetaData(m) => self.metadata = m,
            Action::Add(a) => {
                self.tombstones.remove(&a.path);
                self.files.insert(a.path.clone(), a);
            }
            Action::Remove(r) => {
                self.files.remove(&r.path);
                self.tombstones.insert(r.path.clone(), r);
            }
            Action::Txn(t) => {
                self.txns.insert(t.app_id.clone(), t);
            }
            Action::CommitInfo(c) => self.timestamp_ms = c.timestamp.or(self.timestamp_ms),
        }
    }

    /// The version.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// When the version was committed (its `commitInfo`), Unix ms, if the log says.
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.timestamp_ms
    }

    /// The protocol.
    pub fn protocol(&self) -> &Protocol {
        &self.protocol
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The files that make up the table, by path.
    pub fn files(&self) -> impl ExactSizeIterator<Item = &Add> {
        self.files.values()
    }

    /// The file at `path`, if it is in the table.
    pub fn file(&self, path: &str) -> Option<&Add> {
        self.files.get(path)
    }

    /// The files of one partition (all its partition values equal).
    pub fn files_in<'a>(&'a self, partition: &'a PartitionValues) -> impl Iterator<Item = &'a Add> {
        self.files
            .values()
            .filter(move |a| &a.partition_values == partition)
    }

    /// The files whose path starts with `dir` (`date=2026-12-01/hour=05/`: one folder of
    /// a partition, where a table partitioned by `date` keeps each hour's files).
    pub fn files_under<'a>(&'a self, dir: &'a str) -> impl Iterator<Item = &'a Add> {
        self.files
            .range::<str, _>((std::ops::Bound::Included(dir), std::ops::Bound::Unbounded))
            .take_while(move |(p, _)| p.starts_with(dir))
            .map(|(_, a)| a)
    }

    /// The files removed and not yet forgotten (vacuum deletes their bytes once they are
    /// older than the retention).
    pub fn tombstones(&self) -> impl Iterator<Item = &Remove> {
        self.tombstones.values()
    }

    /// Forgets the tombstones removed before `before_ms`: a checkpoint keeps only those
    /// vacuum may still need to know about.
    pub fn expire_tombstones(&mut self, before_ms: i64) {
        self.tombstones
            .retain(|_, r| r.deletion_timestamp.unwrap_or(0) >= before_ms);
    }

    /// The progress application `app_id` has committed.
    pub fn txn_version(&self, app_id: &str) -> Option<i64> {
        self.txns.get(app_id).map(|t| t.version)
    }

    /// Every application's committed progress.
    pub fn txns(&self) -> impl Iterator<Item = &Txn> {
        self.txns.values()
    }

    /// A table property, as text.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.metadata.configuration.get(key)?.as_deref()
    }

    /// `delta.checkpointInterval`.
    pub fn checkpoint_interval(&self) -> i64 {
        self.property(config::CHECKPOINT_INTERVAL)
            .and_then(|v| v.trim().parse().ok())
            .filter(|n: &i64| *n > 0)
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL)
    }

    /// `delta.logRetentionDuration`.
    pub fn log_retention(&self) -> Duration {
        self.property(config::LOG_RETENTION)
            .and_then(parse_interval)
            .unwrap_or(DEFAULT_LOG_RETENTION)
    }

    /// `delta.appendOnly`: no commit may remove data.
    pub fn append_only(&self) -> bool {
        self.property(config::APPEND_ONLY)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// `delta.deletedFileRetentionDuration`.
    pub fn deleted_file_retention(&self) -> Duration {
        self.property(config::DELETED_FILE_RETENTION)
            .and_then(parse_interval)
            .unwrap_or(DEFAULT_DELETED_FILE_RETENTION)
    }

    /// Every action a checkpoint of this version holds: protocol, metadata, the txns, the
    /// files, the tombstones.
    pub fn checkpoint_actions(&self) -> impl Iterator<Item = Action> + '_ {
        [
            Action::Protocol(self.protocol.clone()),
            Action::MetaData(self.metadata.clone()),
        ]
        .into_iter()
        .chain(self.txns.values().cloned().map(Action::Txn))
        .chain(self.files.values().cloned().map(Action::Add))
        .chain(self.tombstones.values().cloned().map(Action::Remove))
    }

    /// Rows the files' statistics count (files without statistics count nothing).
    pub fn num_records(&self) -> u64 {
        self.files.values().filter_map(Add::num_records).sum()
    }

    /// Bytes of the files.
    pub fn size_bytes(&self) -> u64 {
        self.files
            .values()
            .map(|a| u64::try_from(a.size).unwrap_or(0))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::CommitInfo;

    pub(crate) fn add(path: &str) -> Add {
        let partition = [("date".to_string(), Some("2026-11-30".to_string()))].into();
        Add::new(path, partition, 100, 1).with_stats(r#"{"numRecords":10}"#)
    }

    fn base() -> Vec<Action> {
        vec![
            Action::Protocol(Protocol::default()),
            Action::MetaData(Metadata {
                id: "t".into(),
                name: None,
                description: None,
                format: Default::default(),
                schema_string: "{}".into(),
                partition_columns: vec!["date".into()],
                configuration: [
                    (
                        config::CHECKPOINT_INTERVAL.to_string(),
                        Some("25".to_string()),
                    ),
                    (
                        config::DELETED_FILE_RETENTION.to_string(),
                        Some("interval 2 hours".to_string()),
                    ),
                ]
                .into(),
                created_time: None,
            }),
        ]
    }

    #[test]
    fn the_newest_action_of_a_path_or_an_app_wins() {
        let mut s = Snapshot::from_actions(0, base()).unwrap();
        s.apply(
            1,
            [
                Action::Add(add("a")),
                Action::Add(add("b")),
                Action::Txn(Txn {
                    app_id: "x".into(),
                    version: 9,
                    last_updated: None,
                }),
            ],
        )
        .unwrap();
        s.apply(
            2,
            [
                Action::Remove(add("a").remove(50, false)),
                Action::Add(add("c")),
                Action::Txn(Txn {
                    app_id: "x".into(),
                    version: 19,
                    last_updated: None,
                }),
                Action::CommitInfo(CommitInfo {
                    timestamp: Some(77),
                    operation: None,
                    operation_parameters: None,
                    engine_info: None,
                    read_version: None,
                    is_blind_append: None,
                }),
            ],
        )
        .unwrap();
        let paths: Vec<&str> = s.files().map(|a| a.path.as_str()).collect();
        assert_eq!(paths, ["b", "c"]);
        assert_eq!(s.tombstones().count(), 1);
        assert_eq!(s.txn_version("x"), Some(19));
        assert_eq!(s.txn_version("y"), None);
        assert_eq!((s.version(), s.timestamp_ms()), (2, Some(77)));
        assert_eq!(s.num_records(), 20);
        assert_eq!(s.checkpoint_interval(), 25);
        assert_eq!(s.deleted_file_retention(), Duration::from_secs(7_200));
        assert_eq!(s.log_retention(), DEFAULT_LOG_RETENTION);
        // Re-adding a removed path brings it back.
        s.apply(3, [Action::Add(add("a"))]).unwrap();
        assert_eq!(s.tombstones().count(), 0);
        s.expire_tombstones(0);
        let e = s.apply(5, []).unwrap_err();
        assert!(e.reason.contains("skips from version 3 to 5"), "{e}");
    }

    #[test]
    fn a_log_without_metadata_or_for_newer_readers_does_not_replay() {
        let e = Snapshot::from_actions(0, [Action::Protocol(Protocol::default())]).unwrap_err();
        assert!(e.reason.contains("no metaData"), "{e}");
        let mut actions = base();
        actions[0] = Action::Protocol(Protocol {
            min_reader_version: 3,
            min_writer_version: 7,
            reader_features: Some(vec!["deletionVectors".into()]),
            writer_features: None,
        });
        assert!(Snapshot::from_actions(0, actions).is_err());
    }

    #[test]
    fn intervals_parse_as_delta_writes_them() {
        assert_eq!(
            parse_interval("interval 7 days"),
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(
            parse_interval("interval 1 hour"),
            Some(Duration::from_secs(3_600))
        );
        assert_eq!(
            parse_interval("30 minutes"),
            Some(Duration::from_secs(1_800))
        );
        assert_eq!(
            parse_interval("INTERVAL 2 WEEKS"),
            Some(Duration::from_secs(14 * 86_400))
        );
        assert_eq!(parse_interval("interval soon"), None);
        assert_eq!(parse_interval("interval 3 fortnights"), None);
    }
}
