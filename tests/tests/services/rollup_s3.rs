//! The hourly rollup against the S3 server (and the same on a local folder): generated
//! traffic with known denials, written as raw files the way ingest writes them (with a compaction caught half way: its merged
//! file written and not committed), rolled up and compared row for row with a plain fold
//! over the events and with DataFusion running the rollup's SQL.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_ingest::raw_file::build_hour_file;
use verdict_lake::Prefixed;
use verdict_rollup::{Rollup, RollupError, hour_files};
use verdict_schemas::DecisionEvent;
use verdict_schemas::layout::HourPartition;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_tests::rollup_check::{
    commit_raw_object, fold_rollup, read_rollup, spread, write_raw_hour,
};
use verdict_tests::{s3_store, unique_name};

const BUCKET: &str = "verdict-rollup-test";

async fn lake(name: &str) -> Arc<dyn ObjectStore> {
    let bucket = s3_store(BUCKET).await;
    Arc::new(Prefixed::new(bucket, &unique_name(name)))
}

fn one_hour(events: usize, keys: u32) -> (HourPartition, Vec<DecisionEvent>) {
    let cfg = SynthConfig::hour(events as u64, keys);
    let hour = HourPartition::from_event_time_ms(cfg.start_ms).unwrap();
    let events = SynthTraffic::new(cfg)
        .take(events)
        .filter(|e| HourPartition::from_event_time_ms(e.event_time_ms) == Ok(hour))
        .collect();
    (hour, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollup_equals_a_fold_over_the_events_and_a_rerun_is_byte_identical() {
    the_rollup_equals_a_fold_on(lake("rollup").await).await;
}

/// The same on a local folder, the embedded default's lake: the store under the rollup
/// changes nothing of what it computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_local_folder_the_rollup_equals_the_same_fold() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    the_rollup_equals_a_fold_on(store).await;
}

/// Generated traffic of an hour written as raw files the way ingest writes them, with a
/// compaction caught half way and a stray object; the rollup equals a plain fold over the
/// events and DataFusion running ROLLUP_SQL and DEMAND_SQL, and a re-run writes the same
/// bytes.
async fn the_rollup_equals_a_fold_on(store: Arc<dyn ObjectStore>) {
    let (hour, events) = one_hour(150_000, 3_000);
    let written = write_raw_hour(&store, "decisions", hour, &events, 3, 20_000).await;
    // Compaction caught between writing its output and committing it: partition 0's first
    // two files again, as one file in the hour's folder that no commit names.
    let first_two: Vec<_> = spread(&events, 3)[&0][..40_000].to_vec();
    let merged = build_hour_file(
        "local",
        "compacted-interrupted.parquet".into(),
        hour,
        first_two,
    )
    .unwrap()
    .unwrap();
    store
        .put(&Path::from(merged.path()), PutPayload::from(merged.bytes))
        .await
        .unwrap();
    // Something that is not a raw file, left in the folder by hand.
    store
        .put(
            &Path::from(format!("{}/README.txt", hour.raw_prefix())),
            PutPayload::from_static(b"not data"),
        )
        .await
        .unwrap();

    let rollup = Rollup::new(Arc::clone(&store), 2);
    let report = rollup.run_hour(hour).await.expect("rollup");
    assert_eq!(report.events, events.len() as u64, "{report:?}");
    assert_eq!(report.source_files, written.len(), "{report:?}");

    let expected = fold_rollup(hour, &events);
    let distinct_groups: std::collections::BTreeSet<_> = events
        .iter()
        .map(|e| (e.key_id.0, e.tier.0, e.route_class.0, e.region.0))
        .collect();
    assert!(!expected.is_empty(), "the traffic has denials");
    assert!(
        expected.len() < distinct_groups.len() / 2,
        "most groups were never denied ({} of {})",
        expected.len(),
        distinct_groups.len()
    );
    let got = read_rollup(&store, &report.path).await;
    assert_eq!(got.len(), expected.len(), "rollup rows");
    for (group, want) in &expected {
        assert_eq!(got.get(group), Some(want), "group {group:?}");
    }
    assert_eq!(report.rows, expected.len());

    // The aggregation and the SQL that defines the rollup agree on the same files.
    let files = hour_files(&store, &hour).await.unwrap();
    let folded = rollup.compute(hour, &files).await.unwrap();
    let (by_sql, sql_events) = rollup.compute_sql(hour, &files).await.unwrap();
    assert_eq!(folded.denied.num_rows(), expected.len());
    assert_eq!(
        folded.denied, by_sql,
        "the aggregation differs from ROLLUP_SQL"
    );
    assert_eq!(folded.events, sql_events);
    let demand_by_sql = rollup.compute_demand_sql(hour, &files).await.unwrap();
    assert!(folded.demand.num_rows() > 1, "{:?}", folded.demand);
    assert_eq!(folded.demand.num_rows(), report.demand_rows);
    assert_eq!(
        folded.demand, demand_by_sql,
        "the demand histogram differs from DEMAND_SQL"
    );

    let state = rollup.state(hour).await.unwrap().expect("a rollup state");
    assert_eq!(state.raw_version, report.raw_version);
    assert_eq!(state.events, report.events);
    assert_eq!(state.rows, report.rows as i64);

    let first = store
        .get(&report.path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let again = rollup.run_hour(hour).await.expect("rerun");
    assert_ne!(
        again.path, report.path,
        "a committed file is never overwritten"
    );
    assert_eq!(again.version, report.version.map(|v| v + 1));
    let second = store.get(&again.path).await.unwrap().bytes().await.unwrap();
    assert_eq!(first, second, "a re-run wrote different bytes");
    // The re-run replaced the hour: one file in the table, the new one.
    let table = verdict_lake::tables::DENIED_HOURLY.table(Arc::clone(&store));
    let snapshot = table.snapshot().await.unwrap();
    let dir = verdict_rollup::hour_dir(&hour);
    let held: Vec<&str> = snapshot
        .files_under(&dir)
        .map(|a| a.path.as_str())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(again.path.as_ref().ends_with(held[0]), "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_without_raw_files_gets_an_empty_rollup() {
    let store = lake("rollup-empty").await;
    let hour: HourPartition = "2026-11-30T03".parse().unwrap();
    let rollup = Rollup::new(Arc::clone(&store), 2);
    // A store with no raw table is not a lake of empty hours: the rollup says what is
    // missing and commits nothing.
    let err = rollup
        .run_hour(hour)
        .await
        .expect_err("no raw table")
        .to_string();
    assert!(
        err.contains("not a Delta table (no raw/_delta_log/)"),
        "{err}"
    );
    assert!(rollup.state(hour).await.unwrap().is_none());
    // A raw table with files of another hour only: this hour's rollup is empty.
    let (other, events) = one_hour(200, 10);
    assert_ne!(other, hour);
    write_raw_hour(&store, "decisions", other, &events, 1, 200).await;
    let report = rollup.run_hour(hour).await.expect("rollup");
    assert_eq!((report.events, report.rows, report.source_files), (0, 0, 0));
    assert!(read_rollup(&store, &report.path).await.is_empty());
    assert_eq!(rollup.state(hour).await.unwrap().unwrap().rows, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_file_without_a_column_of_the_raw_table_is_refused_by_path_and_column() {
    use arrow::array::{ArrayRef, FixedSizeBinaryArray, RecordBatch};

    let store = lake("rollup-foreign").await;
    let (hour, events) = one_hour(2_000, 50);
    write_raw_hour(&store, "decisions", hour, &events, 1, 2_000).await;
    // A file committed to the raw table by another writer, holding only key ids.
    let keys: ArrayRef =
        Arc::new(FixedSizeBinaryArray::try_from_iter([[7u8; 16]].into_iter()).unwrap());
    let batch = RecordBatch::try_from_iter([("key_id", keys)]).unwrap();
    let bytes = verdict_lake::files::encode_rollup_parquet(&batch).unwrap();
    let path = Path::from(format!("{}/foreign.parquet", hour.raw_prefix()));
    let size = bytes.len();
    store.put(&path, PutPayload::from(bytes)).await.unwrap();
    commit_raw_object(&store, hour, "foreign.parquet", size).await;

    let err = Rollup::new(Arc::clone(&store), 2)
        .run_hour(hour)
        .await
        .expect_err("a raw file with only key ids");
    // The first column the rollup reads after the key id.
    assert!(
        matches!(&err, RollupError::RawFile { path: p, reason } if *p == path.to_string() && reason == "no column tier"),
        "{err}"
    );
    assert!(
        rollup_state_absent(&store, hour).await,
        "nothing was written"
    );
}

async fn rollup_state_absent(store: &Arc<dyn ObjectStore>, hour: HourPartition) -> bool {
    let listed: Vec<_> = futures::TryStreamExt::try_collect(
        store.list(Some(&Path::from(verdict_lake::tables::DENIED_HOURLY.root))),
    )
    .await
    .unwrap();
    let rollup = Rollup::new(Arc::clone(store), 1);
    listed.is_empty() && rollup.state(hour).await.unwrap().is_none()
}
