//! The scheduled jobs against the S3 server, on a fake clock: late data makes an hour due
//! again; retention deletes exactly the partitions past their windows (and a dry run
//! deletes nothing); compaction under a reader that keeps counting the hour; the daily
//! overage equals a fold over the events; two schedulers at once do no harm; a final rollup
//! day compacted into one file.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::file::metadata::ParquetMetaDataReader;
use verdict_ingest::ConsumedEvent;
use verdict_jobs::late::{Why, due_hours};
use verdict_jobs::{Job, Jobs, JobsConfig, Windows};
use verdict_lake::Prefixed;
use verdict_lake::tables::{DEMAND_HOURLY, DENIED_HOURLY, OVERAGE, RAW, RECONCILE_ROUNDS};
use verdict_rollup::{Rollup, hour_files};
use verdict_schemas::layout::RAW_PREFIX;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_schemas::{DecisionEvent, HourPartition, Verdict};
use verdict_tests::rollup_check::{
    commit_raw_object, commit_table_object, fold_rollup, overage_file, read_rollup, rollup_file,
    spread, write_raw_files,
};
use verdict_tests::{s3_store, unique_name};

const BUCKET: &str = "verdict-jobs-test";
const TOPIC: &str = "decisions";
const MS_PER_HOUR: i64 = 3_600_000;

async fn lake(name: &str) -> Arc<dyn ObjectStore> {
    Arc::new(Prefixed::new(s3_store(BUCKET).await, &unique_name(name)))
}

fn config() -> JobsConfig {
    JobsConfig {
        threads: 2,
        ..JobsConfig::default()
    }
}

/// `n` events of the hour starting at `start_ms`.
fn hour_of_events(
    start_ms: i64,
    n: usize,
    keys: u32,
    seed: u64,
) -> (HourPartition, Vec<DecisionEvent>) {
    let cfg = SynthConfig {
        seed,
        start_ms,
        late_share: 0.0,
        ..SynthConfig::hour(n as u64, keys)
    };
    let hour = HourPartition::from_event_time_ms(start_ms).unwrap();
    let events = SynthTraffic::new(cfg)
        .take(n)
        .filter(|e| HourPartition::from_event_time_ms(e.event_time_ms) == Ok(hour))
        .collect();
    (hour, events)
}

/// Each partition's events with offsets moved up by `shift` (events produced later).
fn shifted(by: BTreeMap<i32, Vec<ConsumedEvent>>, shift: i64) -> BTreeMap<i32, Vec<ConsumedEvent>> {
    by.into_iter()
        .map(|(p, list)| {
            let list = list
                .into_iter()
                .map(|c| ConsumedEvent {
                    offset: c.offset + shift,
                    ..c
                })
                .collect();
            (p, list)
        })
        .collect()
}

async fn assert_rollup_equals_fold(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    events: &[DecisionEvent],
) {
    let expected = fold_rollup(hour, events);
    let got = read_rollup(store, &rollup_file(store, hour).await).await;
    assert_eq!(got.len(), expected.len(), "rollup rows of {hour}");
    for (group, want) in &expected {
        assert_eq!(got.get(group), Some(want), "{hour}: group {group:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_data_makes_a_rolled_up_hour_due_again() {
    let store = lake("late").await;
    let start = 1_796_047_200_000; // 2026-11-30T14:00Z
    let (hour, events) = hour_of_events(start, 40_000, 800, 1);
    let (first, late) = events.split_at(30_000);
    write_raw_files(&store, TOPIC, hour, spread(first, 2), 10_000).await;

    let jobs = Jobs::new(Arc::clone(&store), config());
    let rollup = Rollup::new(Arc::clone(&store), 2);
    let w = Windows::default();
    let before_lateness = hour.end_ms() + 60_000;
    assert!(
        due_hours(&rollup, before_lateness, &w)
            .await
            .unwrap()
            .is_empty(),
        "an hour is not rolled up before its lateness has passed"
    );
    let now = hour.end_ms() + 11 * 60_000;
    let due = due_hours(&rollup, now, &w).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].hour, &due[0].why), (hour, &Why::NeverRolledUp));
    let o = jobs.run_once(Job::Rollup, now, false).await.unwrap();
    assert_eq!(o.written, 1);
    assert_rollup_equals_fold(&store, hour, first).await;
    assert_eq!(
        jobs.run_once(Job::Rollup, now, false)
            .await
            .unwrap()
            .written,
        0
    );

    // Late events of the same hour arrive in a later flush (higher offsets).
    write_raw_files(
        &store,
        TOPIC,
        hour,
        shifted(spread(late, 2), 1_000_000),
        10_000,
    )
    .await;
    let later = now + 3_600_000;
    let due = due_hours(&rollup, later, &w).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(matches!(due[0].why, Why::Changed { .. }), "{due:?}");
    assert_eq!(
        jobs.run_once(Job::Rollup, later, false)
            .await
            .unwrap()
            .written,
        1
    );
    assert_rollup_equals_fold(&store, hour, &events).await;
    assert!(due_hours(&rollup, later, &w).await.unwrap().is_empty());
}

async fn put_empty(store: &Arc<dyn ObjectStore>, path: String) {
    store
        .put(&Path::from(path), PutPayload::from_static(b"0123456789"))
        .await
        .unwrap();
}

async fn exists_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> bool {
    let found: Vec<_> = store
        .list(Some(&Path::from(prefix)))
        .try_collect()
        .await
        .unwrap();
    !found.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_exactly_the_partitions_past_their_windows() {
    let store = lake("retention").await;
    // The fake clock: 2026-11-30T12:00Z.
    let now = 1_796_040_000_000;
    let at = |days: i64| HourPartition::from_event_time_ms(now - days * 24 * MS_PER_HOUR).unwrap();
    let day = |days: i64| at(days).date().format("%Y-%m-%d").to_string();
    // Raw hours that started 6, 7 and 8 days ago (one committed file each); rollups 5
    // years ± 1 day (5 years = 1826 days); quarantine 6 and 9 days; overage 5 years + 2 days.
    for d in [6, 7, 8] {
        put_empty(&store, format!("{}/f.parquet", at(d).raw_prefix())).await;
        commit_raw_object(&store, at(d), "f.parquet", 10).await;
    }
    let table = RAW.table(Arc::clone(&store));
    for d in [1825, 1827] {
        let path = format!("{}/denied_hourly-0.parquet", at(d).partition_path());
        put_empty(&store, format!("{}/{path}", DENIED_HOURLY.root)).await;
        commit_table_object(&store, &DENIED_HOURLY, at(d).date(), &path, 10).await;
    }
    for d in [6, 9] {
        put_empty(&store, format!("quarantine/date={}/q.jsonl", day(d))).await;
    }
    let overage = format!("date={}/overage-0.parquet", day(1828));
    put_empty(&store, format!("overage/{overage}")).await;
    commit_table_object(&store, &OVERAGE, at(1828).date(), &overage, 10).await;
    // The reconcile's rounds: kept a day longer than raw (8 days), days 7 and 9.
    for d in [7, 9] {
        let rounds = format!("date={}/rounds-0.parquet", day(d));
        put_empty(&store, format!("reconcile_rounds/{rounds}")).await;
        commit_table_object(&store, &RECONCILE_ROUNDS, at(d).date(), &rounds, 10).await;
    }

    let jobs = Jobs::new(Arc::clone(&store), config());
    let dry = jobs.run_once(Job::Retention, now, true).await.unwrap();
    assert_eq!((dry.removed, dry.bytes_removed), (5, 50), "{dry:?}");
    assert!(
        exists_under(&store, &at(8).raw_prefix()).await,
        "a dry run deleted"
    );

    let plan = verdict_jobs::retention::plan(&store, now, &Windows::default())
        .await
        .unwrap();
    let mut doomed: Vec<String> = plan
        .iter()
        .map(|e| format!("{} {}", e.table, e.prefix))
        .collect();
    doomed.sort();
    let mut want = vec![
        format!("raw {}", at(8).raw_prefix()),
        format!("denied_hourly {}", at(1827).denied_hourly_prefix()),
        format!("quarantine quarantine/date={}", day(9)),
        format!("overage overage/date={}", day(1828)),
        format!("reconcile_rounds reconcile_rounds/date={}", day(9)),
    ];
    want.sort();
    assert_eq!(doomed, want);

    let done = jobs.run_once(Job::Retention, now, false).await.unwrap();
    assert_eq!(done.removed, 5);
    // What the dry run said vacuum would delete is what the run's vacuum deleted: the
    // files removed by this run wait out the tables' retention of removed files.
    assert_eq!(
        (done.vacuumed, done.bytes_vacuumed),
        (dry.vacuumed, dry.bytes_vacuumed),
        "dry {dry:?}, done {done:?}"
    );
    // The raw hour left the table in one commit; its bytes stay for the queries planned
    // before it until vacuum, past the table's hour of retention, deletes them.
    let raw_hours = |s: &verdict_lake::Snapshot| verdict_rollup::hours_in(s);
    let latest = table.snapshot().await.unwrap();
    assert_eq!(raw_hours(&latest), [at(7), at(6)]);
    assert!(exists_under(&store, &at(8).raw_prefix()).await);
    let later = now + 2 * MS_PER_HOUR;
    let doomed = verdict_lake::vacuum::plan(&table, &latest, None, later)
        .await
        .unwrap();
    assert_eq!(doomed.files.len(), 1, "{:?}", doomed.files);
    verdict_lake::vacuum::run(&table, &doomed).await.unwrap();
    // Likewise the rollup's and the overage's expired partitions.
    for def in [&DENIED_HOURLY, &OVERAGE, &RECONCILE_ROUNDS] {
        let t = def.table(Arc::clone(&store));
        let s = t.snapshot().await.unwrap();
        assert!(
            !s.files().any(|a| a.path.contains(&day(1827))
                || a.path.contains(&day(1828))
                || a.path.contains(&day(9))),
            "{}: an expired partition is still in the table",
            def.name
        );
        let doomed = verdict_lake::vacuum::plan(&t, &s, None, later)
            .await
            .unwrap();
        assert_eq!(doomed.files.len(), 1, "{}: {:?}", def.name, doomed.files);
        verdict_lake::vacuum::run(&t, &doomed).await.unwrap();
    }
    for gone in [
        at(8).raw_prefix(),
        at(1827).denied_hourly_prefix(),
        format!("quarantine/date={}", day(9)),
        format!("overage/date={}", day(1828)),
        format!("reconcile_rounds/date={}", day(9)),
    ] {
        assert!(!exists_under(&store, &gone).await, "{gone} is still there");
    }
    for kept in [
        at(6).raw_prefix(),
        at(7).raw_prefix(),
        at(1825).denied_hourly_prefix(),
        format!("quarantine/date={}", day(6)),
        format!("reconcile_rounds/date={}", day(7)),
    ] {
        assert!(exists_under(&store, &kept).await, "{kept} was deleted");
    }
    assert!(
        jobs.metrics()
            .render()
            .contains("verdict_job_removed_total{job=\"retention\"} 5"),
        "{}",
        jobs.metrics().render()
    );
}

/// The rows a reader counts in `hour` now: the files of the raw table's latest snapshot,
/// their footers' row counts. `None` if a file was gone by the time it was read (vacuum
/// never deletes a file that recent, so this fails the test's count).
async fn reader_count(store: &Arc<dyn ObjectStore>, hour: HourPartition) -> Option<i64> {
    let files = hour_files(store, &hour).await.unwrap();
    let mut total = 0;
    for f in &files.files {
        let body: Bytes = match store.get(&f.meta.location).await {
            Ok(r) => r.bytes().await.ok()?,
            Err(object_store::Error::NotFound { .. }) => return None,
            Err(e) => panic!("reading {}: {e}", f.meta.location),
        };
        total += ParquetMetaDataReader::new()
            .parse_and_finish(&body)
            .unwrap()
            .file_metadata()
            .num_rows();
    }
    Some(total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_under_a_counting_reader_never_changes_the_count() {
    let store = lake("compact").await;
    let start = 1_796_047_200_000;
    let (hour, events) = hour_of_events(start, 48_000, 600, 2);
    // 14 files, one commit each: partition 0 in 8 flushes, partition 1 in 2, partition 2
    // in 4; and a flush of partition 2 in progress, its file written and not committed.
    let mut by = spread(&events, 3);
    let p1 = by.remove(&1).unwrap();
    let p2 = by.remove(&2).unwrap();
    write_raw_files(&store, TOPIC, hour, by, 2_000).await;
    write_raw_files(&store, TOPIC, hour, [(1, p1)].into(), 8_000).await;
    let in_flight = verdict_ingest::raw_file::build_hour_file(
        "local",
        "in-flight.parquet".into(),
        hour,
        p2[..100].to_vec(),
    )
    .unwrap()
    .unwrap();
    write_raw_files(&store, TOPIC, hour, [(2, p2)].into(), 4_000).await;
    store
        .put(
            &Path::from(in_flight.path()),
            PutPayload::from(in_flight.bytes.clone()),
        )
        .await
        .unwrap();

    let total = events.len() as i64;
    assert_eq!(reader_count(&store, hour).await, Some(total));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (store, stop, reads) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&reads));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = reader_count(&store, hour).await {
                    assert_eq!(n, total, "a reader counted {n} rows during compaction");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // Let the reader get going, then compact with it running.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let jobs = Jobs::new(Arc::clone(&store), config());
    let now = hour.end_ms() + 3_600_000;
    let o = jobs.run_once(Job::Compact, now, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    reader.await.expect("the reader's count never changed");
    assert!(reads.load(Ordering::Relaxed) > 2, "the reader hardly ran");
    assert_eq!((o.written, o.removed), (1, 14), "{o:?}");

    let files = hour_files(&store, &hour).await.unwrap();
    assert_eq!(files.files.len(), 1, "one file for the hour");
    assert!(
        !files.files[0].add.data_change,
        "compaction changes no data"
    );
    assert!(
        store.head(&Path::from(in_flight.path())).await.is_ok(),
        "the flush in progress keeps its file"
    );
    assert_eq!(reader_count(&store, hour).await, Some(total));
    // The hour still rolls up to the same answer.
    jobs.run_once(Job::Rollup, now, false).await.unwrap();
    assert_rollup_equals_fold(&store, hour, &events).await;
    // Nothing left to do on a second run.
    assert_eq!(
        jobs.run_once(Job::Compact, now, false)
            .await
            .unwrap()
            .written,
        0
    );
}

/// The overage of `events` by (key, tier, route class): enforced and shadow refusals in
/// which the hourly window refused.
fn fold_overage(events: &[DecisionEvent]) -> BTreeMap<([u8; 16], u8, u8), (u64, u64)> {
    let mut out: BTreeMap<_, (u64, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.denied_by.window) {
        let slot = out
            .entry((e.key_id.0, e.tier.0, e.route_class.0))
            .or_default();
        match e.verdict {
            Verdict::Denied => slot.0 += 1,
            Verdict::WouldDeny => slot.1 += 1,
            Verdict::Allowed => {}
        }
    }
    out.retain(|_, (d, w)| *d + *w > 0);
    out
}

async fn read_overage(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
) -> BTreeMap<([u8; 16], u8, u8), (u64, u64)> {
    use arrow::array::{AsArray, FixedSizeBinaryArray};
    use arrow::datatypes::{Int64Type, UInt8Type};
    let body = store.get(path).await.unwrap().bytes().await.unwrap();
    let mut out = BTreeMap::new();
    for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(body)
        .unwrap()
        .build()
        .unwrap()
    {
        let b = b.unwrap();
        let keys = b
            .column(1)
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .unwrap();
        for r in 0..b.num_rows() {
            out.insert(
                (
                    keys.value(r).try_into().unwrap(),
                    b.column(2).as_primitive::<UInt8Type>().value(r),
                    b.column(3).as_primitive::<UInt8Type>().value(r),
                ),
                (
                    b.column(4)
                        .as_primitive::<Int64Type>()
                        .value(r)
                        .unsigned_abs(),
                    b.column(5)
                        .as_primitive::<Int64Type>()
                        .value(r)
                        .unsigned_abs(),
                ),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_at_once_leave_the_same_tables_as_one() {
    let store = lake("two-schedulers").await;
    // Two hours of one day, each in 5 small files per partition.
    let day_start = 1_796_083_200_000; // 2026-12-01T00:00Z
    let mut all = Vec::new();
    let mut hours = Vec::new();
    for (i, seed) in [(0i64, 3u64), (1, 4)] {
        let (hour, events) = hour_of_events(day_start + i * MS_PER_HOUR, 20_000, 400, seed);
        let by = shifted(spread(&events, 2), i * 1_000_000);
        write_raw_files(&store, TOPIC, hour, by, 2_000).await;
        hours.push((hour, events.clone()));
        all.extend(events);
    }
    let now = day_start + 26 * MS_PER_HOUR;
    let a = Jobs::new(Arc::clone(&store), config());
    let b = Jobs::new(Arc::clone(&store), config());
    let run_all = |jobs: Jobs| async move {
        for job in Job::ALL {
            jobs.run_once(job, now, false)
                .await
                .unwrap_or_else(|e| panic!("{job}: {e}"));
        }
    };
    tokio::join!(run_all(a.clone()), run_all(b.clone()));

    for (hour, events) in &hours {
        let files = hour_files(&store, hour).await.unwrap();
        assert_eq!(files.files.len(), 1, "{hour}: one compacted file");
        assert_eq!(reader_count(&store, *hour).await, Some(events.len() as i64));
        assert_rollup_equals_fold(&store, *hour, events).await;
    }
    let expected = fold_overage(&all);
    assert!(!expected.is_empty(), "the traffic has quota refusals");
    let got = read_overage(&store, &overage_file(&store, hours[0].0.date()).await).await;
    assert_eq!(got, expected);
    // After both, a third run finds nothing to do.
    let c = Jobs::new(Arc::clone(&store), config());
    for job in [Job::Compact, Job::Rollup, Job::Overage] {
        let o = c.run_once(job, now, false).await.unwrap();
        assert_eq!((o.written, o.removed), (0, 0), "{job} had work left: {o:?}");
    }
    assert!(exists_under(&store, RAW_PREFIX).await);
}

/// The rows of `def`'s files of `date`, in path order, as one batch.
async fn day_rows(
    store: &Arc<dyn ObjectStore>,
    def: &verdict_lake::TableDef,
    date: chrono::NaiveDate,
) -> (Vec<verdict_lake::Add>, arrow::array::RecordBatch) {
    let snapshot = def.table(Arc::clone(store)).snapshot().await.unwrap();
    let files: Vec<verdict_lake::Add> = snapshot
        .files_under(&verdict_jobs::overage::day_dir(date))
        .cloned()
        .collect();
    let mut batches = Vec::new();
    for add in &files {
        let location = Path::from(format!("{}/{}", def.root, add.path));
        let body: Bytes = store.get(&location).await.unwrap().bytes().await.unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(body)
            .unwrap()
            .build()
            .unwrap();
        batches.extend(reader.map(Result::unwrap));
    }
    let rows = arrow::compute::concat_batches(&(def.schema)(), &batches).unwrap();
    (files, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_rollup_day_is_compacted_into_one_file_and_its_hours_are_not_replaced_alone() {
    let store = lake("rollup-days").await;
    let day_start = 1_795_219_200_000; // 2026-11-21T00:00Z
    let mut hours = Vec::new();
    for (i, seed) in [(0i64, 5u64), (1, 6), (5, 7)] {
        let (hour, events) = hour_of_events(day_start + i * MS_PER_HOUR, 12_000, 300, seed);
        write_raw_files(&store, TOPIC, hour, spread(&events, 1), 20_000).await;
        hours.push(hour);
    }
    let date = hours[0].date();
    let jobs = Jobs::new(Arc::clone(&store), config());
    let rolled = jobs
        .run_once(Job::Rollup, day_start + 26 * MS_PER_HOUR, false)
        .await
        .unwrap();
    assert_eq!(rolled.written, 3);
    let tables = [&DENIED_HOURLY, &DEMAND_HOURLY];
    let mut before = Vec::new();
    for def in tables {
        let (files, rows) = day_rows(&store, def, date).await;
        assert_eq!(files.len(), 3, "{}: a file per hour", def.name);
        assert!(rows.num_rows() > 0, "{}: rows to compact", def.name);
        before.push(rows);
    }

    // The day's last hour leaves the raw window at the day's end plus 7 days: a
    // millisecond before, the day is not final, and nothing is compacted (one file per
    // raw hour: no raw hour to compact either).
    let day_end = day_start + 24 * MS_PER_HOUR;
    let final_at = day_end + 7 * 24 * MS_PER_HOUR;
    let o = jobs
        .run_once(Job::Compact, final_at - 1, false)
        .await
        .unwrap();
    assert_eq!((o.written, o.removed), (0, 0), "{o:?}");
    let o = jobs.run_once(Job::Compact, final_at, false).await.unwrap();
    assert_eq!((o.written, o.removed), (2, 6), "{o:?}");

    for (def, want) in tables.iter().zip(&before) {
        let (files, rows) = day_rows(&store, def, date).await;
        assert_eq!(files.len(), 1, "{}: one file for the day", def.name);
        assert!(
            !files[0].path.contains("hour="),
            "{}: the day's file is in the day's folder: {}",
            def.name,
            files[0].path
        );
        assert!(!files[0].data_change, "compaction changes no data");
        assert_eq!(&rows, want, "{}: the same rows in the same order", def.name);
    }
    // An hour of a compacted day cannot be rolled up again on its own (its raw files are
    // still there, retention has not run): the day's file holds its rows too.
    let err = Rollup::new(Arc::clone(&store), 2)
        .run_hour(hours[1])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("date=2026-11-21/hour=01/ cannot be replaced alone") && err.contains("-day-"),
        "{err}"
    );
    assert_eq!(day_rows(&store, &DEMAND_HOURLY, date).await.1, before[1]);
    let o = jobs.run_once(Job::Compact, final_at, false).await.unwrap();
    assert_eq!((o.written, o.removed), (0, 0), "nothing left: {o:?}");
}
