//! Helpers for the rollup tests: raw hours written the way ingest writes them, the rollup
//! computed independently (a plain fold over the events), and a rollup file read back.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::datatypes::{Int64Type, TimestampMillisecondType, UInt8Type, UInt16Type, UInt32Type};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use verdict_ingest::flush::{StoreCalls, flush_after_progress};
use verdict_ingest::{ConsumedEvent, KafkaSource, RawTable};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::{DecisionEvent, DecisionSource, Verdict};

/// One rollup row's group: key id, tier, route class, region.
pub type Group = ([u8; 16], u8, u8, u16);

/// One rollup row's values, in the column order of `denied_hourly` after the group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Agg {
    pub hour_ms: i64,
    pub allowed: u64,
    pub denied: u64,
    pub would_deny: u64,
    pub denied_by_bucket: u64,
    pub denied_by_window: u64,
    pub would_deny_by_window: u64,
    pub degraded: u64,
    pub min_remaining_tokens: u32,
    pub min_remaining_window: u32,
    pub first_denial: i64,
    pub last_denial: i64,
    pub policy_version: u64,
    pub window_quota: u32,
}

/// The rollup of `events` (all of one hour), computed by folding over them: the groups
/// with at least one denial or would-deny.
pub fn fold_rollup(hour: HourPartition, events: &[DecisionEvent]) -> BTreeMap<Group, Agg> {
    let mut all: BTreeMap<Group, Agg> = BTreeMap::new();
    for e in events {
        let group = (e.key_id.0, e.tier.0, e.route_class.0, e.region.0);
        let a = all.entry(group).or_insert(Agg {
            hour_ms: hour.start_ms(),
            min_remaining_tokens: u32::MAX,
            min_remaining_window: u32::MAX,
            first_denial: i64::MAX,
            last_denial: i64::MIN,
            ..Agg::default()
        });
        let refused = e.verdict != Verdict::Allowed;
        match e.verdict {
            Verdict::Allowed => a.allowed += 1,
            Verdict::Denied => a.denied += 1,
            Verdict::WouldDeny => a.would_deny += 1,
        }
        if refused {
            a.denied_by_bucket += u64::from(e.denied_by.bucket);
            a.denied_by_window += u64::from(e.denied_by.window);
            a.would_deny_by_window +=
                u64::from(e.verdict == Verdict::WouldDeny && e.denied_by.window);
            a.first_denial = a.first_denial.min(e.event_time_ms);
            a.last_denial = a.last_denial.max(e.event_time_ms);
        }
        a.degraded += u64::from(e.source != DecisionSource::CounterStore);
        a.min_remaining_tokens = a.min_remaining_tokens.min(e.remaining_tokens);
        a.min_remaining_window = a.min_remaining_window.min(e.remaining_window);
        a.policy_version = a.policy_version.max(e.policy_version);
        a.window_quota = a.window_quota.max(e.window_quota);
    }
    all.retain(|_, a| a.denied + a.would_deny > 0);
    all
}

/// `events` as Kafka would hold them: partition `p` of `partitions` gets every event whose
/// index is `p` modulo `partitions`, at consecutive offsets from 0.
pub fn spread(events: &[DecisionEvent], partitions: i32) -> BTreeMap<i32, Vec<ConsumedEvent>> {
    let mut by_partition: BTreeMap<i32, Vec<ConsumedEvent>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let partition = (i % partitions as usize) as i32;
        let list = by_partition.entry(partition).or_default();
        let offset = list.len() as i64;
        list.push(ConsumedEvent {
            event: *e,
            partition,
            offset,
        });
    }
    by_partition
}

/// Writes `events` as raw files of `hour`, the way ingest does: [`spread`] over
/// `partitions`, in files of `per_file` consecutive offsets.
pub async fn write_raw_hour(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    hour: HourPartition,
    events: &[DecisionEvent],
    partitions: i32,
    per_file: usize,
) -> Vec<Path> {
    write_raw_files(store, topic, hour, spread(events, partitions), per_file).await
}

/// Commits the object `raw/<hour's folder>/<name>` (already in the store, `size` bytes) to
/// the raw table as a file of `hour`, as another writer of the table would.
pub async fn commit_raw_object(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    name: &str,
    size: usize,
) {
    let path = format!("{}/{name}", hour.partition_path());
    let partition = verdict_lake::tables::hour_partition(&hour);
    commit_add(store, &verdict_lake::tables::RAW, path, partition, size).await;
}

/// Commits the file `path` (relative to the table's root) of `size` bytes, in
/// `partition`, alone to the table `def`.
pub async fn commit_add(
    store: &Arc<dyn ObjectStore>,
    def: &verdict_lake::TableDef,
    path: String,
    partition: verdict_lake::PartitionValues,
    size: usize,
) {
    let now = chrono::Utc::now().timestamp_millis();
    let add = verdict_lake::Add::new(path, partition, size as i64, now);
    let (table, mut snapshot) = def.open(Arc::clone(store)).await.expect("opening a table");
    table
        .commit(
            &mut snapshot,
            verdict_lake::Commit::new("WRITE", vec![verdict_lake::Action::Add(add)]),
        )
        .await
        .expect("committing a file");
}

/// Commits an object put at `<table root>/<path>` to the table `def` (partitioned by
/// `date`, the day of `date`) as an `add` of `size` bytes.
pub async fn commit_table_object(
    store: &Arc<dyn ObjectStore>,
    def: &verdict_lake::TableDef,
    date: chrono::NaiveDate,
    path: &str,
    size: usize,
) {
    let partition = verdict_lake::tables::date_partition(date);
    commit_add(store, def, path.to_owned(), partition, size).await;
}

/// The file `denied_hourly` holds for `hour` now, as an object of the lake.
pub async fn rollup_file(store: &Arc<dyn ObjectStore>, hour: HourPartition) -> Path {
    let def = &verdict_lake::tables::DENIED_HOURLY;
    let snapshot = def
        .table(Arc::clone(store))
        .snapshot()
        .await
        .expect("the denied_hourly table");
    let state = verdict_rollup::state_in(&snapshot, &hour)
        .unwrap_or_else(|| panic!("{hour} is not rolled up"));
    verdict_lake::log::data_path(&Path::from(def.root), &state.path)
}

/// The file `overage` holds for `date` now, as an object of the lake.
pub async fn overage_file(store: &Arc<dyn ObjectStore>, date: chrono::NaiveDate) -> Path {
    let def = &verdict_lake::tables::OVERAGE;
    let snapshot = def
        .table(Arc::clone(store))
        .snapshot()
        .await
        .expect("the overage table");
    let dir = verdict_jobs::overage::day_dir(date);
    let add = snapshot
        .files_under(&dir)
        .next()
        .unwrap_or_else(|| panic!("no overage for {date}"));
    verdict_lake::log::data_path(&Path::from(def.root), &add.path)
}

/// Writes each partition's events as raw files of `hour` of `per_file` consecutive
/// records, each file one flush of the partition (its files and one commit with its
/// progress, [`flush_after_progress`]), continuing after what earlier calls wrote.
pub async fn write_raw_files(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    hour: HourPartition,
    by_partition: BTreeMap<i32, Vec<ConsumedEvent>>,
    per_file: usize,
) -> Vec<Path> {
    let mut raw = RawTable::open(Arc::clone(store))
        .await
        .expect("opening the raw table");
    let mut written = Vec::new();
    for (partition, list) in by_partition {
        let source = KafkaSource::new("local", topic, partition);
        for chunk in list.chunks(per_file) {
            assert!(
                chunk
                    .iter()
                    .all(|c| HourPartition::from_event_time_ms(c.event.event_time_ms) == Ok(hour)),
                "an event outside {hour}"
            );
            let report =
                flush_after_progress(&mut raw, &source, chunk.to_vec(), &StoreCalls::default())
                    .await
                    .expect("writing a raw file");
            written.extend(report.paths);
        }
    }
    written
}

/// Reads a rollup file back into groups and values (the file's rows must be in group
/// order, each group once).
pub async fn read_rollup(store: &Arc<dyn ObjectStore>, path: &Path) -> BTreeMap<Group, Agg> {
    let body: Bytes = store
        .get(path)
        .await
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .bytes()
        .await
        .unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(body)
        .unwrap()
        .build()
        .unwrap();
    let mut out = BTreeMap::new();
    let mut previous: Option<Group> = None;
    for batch in reader {
        let b: RecordBatch = batch.unwrap();
        let c = |i: usize| b.column(i);
        let keys = c(1)
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .unwrap();
        for r in 0..b.num_rows() {
            assert!(keys.is_valid(r));
            let group: Group = (
                keys.value(r).try_into().unwrap(),
                c(2).as_primitive::<UInt8Type>().value(r),
                c(3).as_primitive::<UInt8Type>().value(r),
                c(4).as_primitive::<UInt16Type>().value(r),
            );
            assert!(
                previous < Some(group),
                "rows out of order or doubled at {group:?}"
            );
            previous = Some(group);
            let u64_at = |i: usize| c(i).as_primitive::<Int64Type>().value(r).unsigned_abs();
            let u32_at = |i: usize| c(i).as_primitive::<UInt32Type>().value(r);
            let ts_at = |i: usize| c(i).as_primitive::<TimestampMillisecondType>().value(r);
            out.insert(
                group,
                Agg {
                    hour_ms: ts_at(0),
                    allowed: u64_at(5),
                    denied: u64_at(6),
                    would_deny: u64_at(7),
                    denied_by_bucket: u64_at(8),
                    denied_by_window: u64_at(9),
                    would_deny_by_window: u64_at(10),
                    degraded: u64_at(11),
                    min_remaining_tokens: u32_at(12),
                    min_remaining_window: u32_at(13),
                    first_denial: ts_at(14),
                    last_denial: ts_at(15),
                    policy_version: u64_at(16),
                    window_quota: u32_at(17),
                },
            );
        }
    }
    out
}
