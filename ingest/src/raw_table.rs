//! The raw table's writes: a chunk of events consumed from one Kafka partition is split by
//! the hour of its event times (late events land in their own hour's folder), each hour
//! becomes one file with a name no other writer can take, and the files join the table in
//! one Delta commit ([`RawTable`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;
use rand::RngCore;
use verdict_lake::tables::{RAW, hour_partition};
use verdict_lake::{Add, Clock, Commit, LakeError, Snapshot, Table};
use verdict_schemas::{HourPartition, LayoutError};

use crate::raw_file::{ConsumedEvent, HourFile};

/// Where a chunk of events came from: one partition of one topic of one Kafka cluster. The
/// raw table's `txn` application id is made of it, so that the regions' own Kafka clusters,
/// with the same topic and partition numbers, write one table without colliding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KafkaSource {
    /// The Kafka cluster's name (unique among the clusters feeding the lake).
    pub cluster: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl KafkaSource {
    /// A source.
    pub fn new(cluster: &str, topic: &str, partition: i32) -> Self {
        Self {
            cluster: cluster.to_owned(),
            topic: topic.to_owned(),
            partition,
        }
    }

    /// The application id of its progress in the raw table's log:
    /// `verdict-ingest/<cluster>/<topic>/<partition>`.
    pub fn app_id(&self) -> String {
        format!(
            "verdict-ingest/{}/{}/{}",
            self.cluster, self.topic, self.partition
        )
    }

    /// The name of a raw file holding offsets `first..=last` of this source:
    /// `<cluster>-<topic>-<partition>-<first>-<last>-<random>.parquet`. The random part makes
    /// it unique to this writing, so a worker that lost its partition and writes the same
    /// offsets again never overwrites a committed file.
    pub fn file_name(&self, first: i64, last: i64) -> String {
        self.unique_name(first, last, "parquet")
    }

    /// `<cluster>-<topic>-<partition>-<first>-<last>-<random>.<extension>`: the name of a file
    /// of offsets `first..=last` of this source, unique to this writing.
    pub fn unique_name(&self, first: i64, last: i64, extension: &str) -> String {
        let mut nonce = [0u8; 8];
        rand::rng().fill_bytes(&mut nonce);
        format!(
            "{}{first:020}-{last:020}-{}.{extension}",
            self.name_prefix(),
            hex::encode(nonce)
        )
    }

    /// `<cluster>-<topic>-<partition>-`: how the name of every file of this source starts.
    pub fn name_prefix(&self) -> String {
        format!("{}-{}-{:05}-", self.cluster, self.topic, self.partition)
    }

    /// The first and last offsets in `name` if it is the name of a file of this source
    /// ([`KafkaSource::unique_name`]).
    pub fn offsets_in(&self, name: &str) -> Option<(i64, i64)> {
        let rest = name.strip_prefix(&self.name_prefix())?;
        let (first, rest) = rest.split_once('-')?;
        let (last, _) = rest.split_once('-')?;
        if first.len() != 20 || last.len() != 20 {
            return None;
        }
        Some((first.parse().ok()?, last.parse().ok()?))
    }
}

/// Events of one chunk, grouped by the hour of their event time, and those whose time has
/// no hour (to be quarantined by the caller).
#[derive(Debug, Default)]
pub struct HourSplit {
    /// Events by hour, hours in order.
    pub hours: BTreeMap<HourPartition, Vec<ConsumedEvent>>,
    /// Events whose event time is outside the calendar.
    pub unplaceable: Vec<(ConsumedEvent, LayoutError)>,
}

/// Groups events by the hour of their event time.
pub fn split_by_hour(events: impl IntoIterator<Item = ConsumedEvent>) -> HourSplit {
    let mut split = HourSplit::default();
    for c in events {
        match HourPartition::from_event_time_ms(c.event.event_time_ms) {
            Ok(h) => split.hours.entry(h).or_default().push(c),
            Err(e) => split.unplaceable.push((c, e)),
        }
    }
    split
}

/// The `add` of a raw file written at `now_ms`.
pub fn raw_add(file: &HourFile, now_ms: i64, data_change: bool) -> Add {
    let add = Add::new(
        file.table_path(),
        hour_partition(&file.hour),
        file.bytes.len() as i64,
        now_ms,
    )
    .with_stats(file.stats.clone());
    Add { data_change, ..add }
}

/// The raw table: its log and the snapshot this writer works on.
#[derive(Debug, Clone)]
pub struct RawTable {
    table: Table,
    snapshot: Snapshot,
}

impl RawTable {
    /// The raw table in `store` (the lake's root), created if it has no log yet, reading
    /// the system's clock.
    pub async fn open(store: Arc<dyn ObjectStore>) -> Result<Self, LakeError> {
        Self::open_at(store, Arc::new(verdict_schemas::SystemClock)).await
    }

    /// [`RawTable::open`], reading the time from `clock`: its commits, and the flushes'
    /// files and progress, are stamped with it.
    pub async fn open_at(store: Arc<dyn ObjectStore>, clock: Clock) -> Result<Self, LakeError> {
        let (table, snapshot) = RAW.open_table(RAW.table_at(store, clock)).await?;
        Ok(Self { table, snapshot })
    }

    /// The table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The snapshot this writer last saw.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Brings the snapshot up to the latest version.
    pub async fn refresh(&mut self) -> Result<&Snapshot, LakeError> {
        self.table.update(&mut self.snapshot).await?;
        Ok(&self.snapshot)
    }

    /// Commits `commit` on the writer's snapshot (see [`Table::commit`]).
    pub async fn commit(&mut self, commit: Commit) -> Result<i64, LakeError> {
        self.table.commit(&mut self.snapshot, commit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time: i64, offset: i64) -> ConsumedEvent {
        ConsumedEvent::allowed(1, time, 3, offset)
    }

    #[test]
    fn late_events_go_to_their_own_hour_and_absurd_times_are_set_aside() {
        let h14 = 1_796_047_200_000;
        let split = split_by_hour([
            at(h14 + 5, 10),
            at(h14 - 1, 11),
            at(h14 + 7, 12),
            at(i64::MAX, 13),
        ]);
        let hours: Vec<String> = split.hours.keys().map(ToString::to_string).collect();
        assert_eq!(hours, ["2026-11-30T13", "2026-11-30T14"]);
        assert_eq!(
            split.hours.values().map(Vec::len).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(split.unplaceable.len(), 1);
        assert_eq!(split.unplaceable[0].0.offset, 13);
    }

    #[test]
    fn sources_name_their_progress_and_files_uniquely() {
        let s = KafkaSource::new("eu-west", "verdict.decisions.v1", 3);
        assert_eq!(s.app_id(), "verdict-ingest/eu-west/verdict.decisions.v1/3");
        let (a, b) = (s.file_name(10, 12), s.file_name(10, 12));
        assert!(
            a.starts_with(
                "eu-west-verdict.decisions.v1-00003-00000000000000000010-00000000000000000012-"
            ),
            "{a}"
        );
        assert_ne!(
            a, b,
            "a second writing of the same offsets gets another name"
        );
    }
}
