//! The raw table read by other engines, as analysts and pricing jobs read it: Apache Spark
//! with Delta Lake's connector, delta-rs and Polars count exactly what verdict counts,
//! while a compaction commits hour after hour and after one was killed before its commit;
//! and a report's SQL on Spark SQL gives verdict's rows; the rollup tables and the overage,
//! as the jobs commit them, read on Spark SQL give verdict's rows too. Needs `scripts/services.sh up
//! spark` (no server: the engines run in Python processes the test starts).

use std::sync::Arc;
use std::time::Duration;

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_jobs::compact::{CompactReport, compact_hour};
use verdict_lake::tables::RAW;
use verdict_query::{Engine, Limits, PoliciesTable};
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_schemas::{DecisionEvent, HourPartition};
use verdict_tests::engines::{Watcher, run, spark_install};
use verdict_tests::query_fixture::rows;
use verdict_tests::rollup_check::write_raw_hour;

const MS_PER_HOUR: i64 = 3_600_000;

/// The per tier × route class × verdict counts both engines compute: every column kind a
/// report reads (small codes, booleans, the policy version, timestamps).
const BY_VERDICT: &str = "SELECT tier, route_class, verdict, COUNT(*) AS n, \
     SUM(CASE WHEN denied_by_window THEN 1 ELSE 0 END) AS by_window, \
     MAX(policy_version) AS newest_policy, COUNT(DISTINCT key_id) AS keys, \
     MIN(event_time) < MAX(event_time) AS spans_time \
     FROM {table} GROUP BY tier, route_class, verdict ORDER BY tier, route_class, verdict";

fn as_numbers(rows: &[serde_json::Value]) -> Vec<Vec<String>> {
    let columns = [
        "tier",
        "route_class",
        "verdict",
        "n",
        "by_window",
        "newest_policy",
        "keys",
        "spans_time",
    ];
    columns_of(rows, &columns)
}

/// The rollups as the limit review reads them: per tier and route class, the refusals
/// enforced and in shadow mode, by the bucket and by the window, and the keys refused.
const WRONG_LIMITS: &str = "SELECT tier, route_class, COUNT(*) AS n, SUM(denied) AS denied, \
     SUM(would_deny) AS would_deny, SUM(denied_by_window) AS by_window, \
     SUM(denied_by_bucket) AS by_bucket, MAX(window_quota) AS quota, \
     COUNT(DISTINCT key_id) AS keys, MIN(min_remaining_window) AS low \
     FROM denied_hourly GROUP BY tier, route_class ORDER BY tier, route_class";

/// The overage as pricing reads it: per tier and route class of a day.
const OVERAGE_BY_CLASS: &str = "SELECT date, tier, route_class, COUNT(*) AS n, \
     SUM(quota_denied) AS denied, SUM(quota_would_deny) AS would_deny, \
     MAX(policy_version) AS policy, COUNT(DISTINCT key_id) AS keys \
     FROM overage GROUP BY date, tier, route_class ORDER BY date, tier, route_class";

/// The demand histogram: keys and requests per bucket.
const DEMAND: &str = "SELECT tier, route_class, bucket, SUM(keys) AS n, SUM(requests) AS requests \
     FROM demand_hourly GROUP BY tier, route_class, bucket ORDER BY tier, route_class, bucket";

fn columns_of(rows: &[serde_json::Value], columns: &[&str]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| match &r[*c] {
                    // Spark prints `long`s and `short`s as numbers, verdict as numbers too;
                    // text for a number (a decimal) is read as the number it spells.
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect()
}

/// A lake in a fresh local folder (removed when the folder is dropped), and its store.
fn folder_lake() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    (dir, store)
}

/// The query engine over the lake in `dir`, with no policy.
fn engine_over(dir: &std::path::Path) -> Engine {
    Engine::new(
        LocalFileSystem::new_with_prefix(dir).unwrap(),
        PoliciesTable::new(None),
        2,
        Limits::default(),
    )
    .unwrap()
}

/// Of `events` generated for `hour` (seed `seed`, `keys` keys, none late), those in it.
fn hour_events(hour: HourPartition, seed: u64, events: u64, keys: u32) -> Vec<DecisionEvent> {
    let cfg = SynthConfig {
        seed,
        start_ms: hour.start_ms(),
        late_share: 0.0,
        ..SynthConfig::hour(events, keys)
    };
    SynthTraffic::new(cfg)
        .take(events as usize)
        .filter(|e| HourPartition::from_event_time_ms(e.event_time_ms) == Ok(hour))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_delta_rs_and_polars_count_what_verdict_counts_through_compactions() {
    spark_install();
    let (dir, store) = folder_lake();
    // Three closed hours inside the raw window, 2 Kafka partitions, files of 1,500 rows:
    // 8 files an hour, each its own commit.
    let now = chrono::Utc::now().timestamp_millis();
    let first = HourPartition::from_event_time_ms(now - 5 * MS_PER_HOUR).unwrap();
    let mut hours = vec![first];
    for _ in 0..2 {
        hours.push(hours.last().unwrap().next().unwrap());
    }
    for (i, hour) in hours.iter().enumerate() {
        let events = hour_events(*hour, 40 + i as u64, 12_000, 400);
        write_raw_hour(&store, "decisions", *hour, &events, 2, 1_500).await;
    }
    let table = RAW.table(Arc::clone(&store));
    let mut snapshot = table.snapshot().await.unwrap();
    let total = snapshot.num_records();
    let engine = engine_over(dir.path());
    let verdict_count = || async {
        rows(&engine, "SELECT COUNT(*) AS n FROM decisions").await[0]["n"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(verdict_count().await, total);
    println!(
        "the raw table: {total} rows in {} files",
        snapshot.files().count()
    );

    // Spark counts again and again while the hours are compacted one commit at a time.
    let raw_dir = dir.path().join("raw");
    let watcher = tokio::task::spawn_blocking(move || Watcher::start(&raw_dir))
        .await
        .unwrap();
    let mut report = CompactReport::default();
    for hour in &hours {
        compact_hour(&table, &mut snapshot, *hour, 2, &mut report)
            .await
            .unwrap();
        assert_eq!(verdict_count().await, total);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let counts = tokio::task::spawn_blocking(move || watcher.stop())
        .await
        .unwrap();
    println!("Spark's counts during the compactions: {counts:?}");
    assert_eq!(report.compacted.len(), 3, "{report:?}");
    assert!(
        counts.len() >= 4,
        "Spark counted too rarely to see the compactions: {counts:?}"
    );
    assert!(
        counts.iter().all(|n| *n == total),
        "Spark counted {counts:?}, verdict {total}"
    );

    // A compaction killed after writing its file, before its commit: the file is there and
    // in no commit.
    let killed = Path::from(format!(
        "{}/compacted-killed.parquet",
        hours[0].raw_prefix()
    ));
    let committed = verdict_rollup::hour_files(&store, &hours[0]).await.unwrap();
    let bytes = store
        .get(&committed.files[0].meta.location)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    store.put(&killed, PutPayload::from(bytes)).await.unwrap();
    let raw = dir.path().join("raw");
    let raw = raw.to_str().unwrap();
    let spark = run(&["count", raw]);
    let others = run(&["others", raw]);
    println!("after a killed compaction: Spark {spark:?}, delta-rs, Polars and DuckDB {others:?}");
    assert_eq!(spark[0]["count"].as_u64(), Some(total));
    assert_eq!(others[0]["delta_rs"].as_u64(), Some(total));
    assert_eq!(others[0]["polars"].as_u64(), Some(total));
    // DuckDB over the snapshot's files: the README's recipe for an analyst's DuckDB.
    assert_eq!(others[0]["duckdb"].as_u64(), Some(total));
    assert_eq!(verdict_count().await, total);

    // The same report on Spark SQL and on verdict: the same rows.
    let sql_file = dir.path().join("by_verdict.sql");
    std::fs::write(&sql_file, BY_VERDICT.replace("{table}", "raw")).unwrap();
    let by_spark = run(&[
        "sql",
        dir.path().to_str().unwrap(),
        sql_file.to_str().unwrap(),
    ]);
    let by_verdict = rows(&engine, &BY_VERDICT.replace("{table}", "decisions")).await;
    println!(
        "per tier x route class x verdict: {} rows; the first: Spark {:?}, verdict {:?}",
        by_verdict.len(),
        by_spark.first(),
        by_verdict.first()
    );
    assert!(by_verdict.len() >= 4, "{by_verdict:?}");
    assert_eq!(as_numbers(&by_spark), as_numbers(&by_verdict));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollups_and_the_overage_on_spark_sql_give_verdicts_rows() {
    spark_install();
    let (dir, store) = folder_lake();
    // Two hours of the day before yesterday, with refusals enforced and in shadow mode.
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(2);
    let start = day
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_millis();
    for i in 0..2 {
        let hour = HourPartition::from_event_time_ms(start + i * MS_PER_HOUR).unwrap();
        let events = hour_events(hour, 70 + i as u64, 30_000, 300);
        write_raw_hour(&store, "decisions", hour, &events, 2, 5_000).await;
    }
    let now = start + 26 * MS_PER_HOUR;
    let rollup = verdict_rollup::Rollup::new(Arc::clone(&store), 2);
    let windows = verdict_jobs::Windows::default();
    let hours = verdict_jobs::late::run(&rollup, now, &windows)
        .await
        .unwrap();
    assert_eq!(hours.len(), 2, "{hours:?}");
    let days = verdict_jobs::overage::run(&rollup, now, &windows)
        .await
        .unwrap();
    assert_eq!(days.len(), 1, "{days:?}");

    let engine = engine_over(dir.path());
    let root = dir.path().to_str().unwrap();
    let cases: [(&str, &str, &[&str]); 3] = [
        (
            "wrong limits",
            WRONG_LIMITS,
            &[
                "tier",
                "route_class",
                "n",
                "denied",
                "would_deny",
                "by_window",
                "by_bucket",
                "quota",
                "keys",
                "low",
            ],
        ),
        (
            "overage",
            OVERAGE_BY_CLASS,
            &[
                "date",
                "tier",
                "route_class",
                "n",
                "denied",
                "would_deny",
                "policy",
                "keys",
            ],
        ),
        (
            "demand",
            DEMAND,
            &["tier", "route_class", "bucket", "n", "requests"],
        ),
    ];
    for (name, sql, columns) in cases {
        let sql_file = dir.path().join(format!("{}.sql", name.replace(' ', "_")));
        std::fs::write(&sql_file, sql).unwrap();
        let by_spark = run(&["sql", root, sql_file.to_str().unwrap()]);
        let by_verdict = rows(&engine, sql).await;
        println!(
            "{name}: {} rows; the first: Spark {:?}, verdict {:?}",
            by_verdict.len(),
            by_spark.first(),
            by_verdict.first()
        );
        assert!(by_verdict.len() >= 2, "{name}: {by_verdict:?}");
        assert_eq!(
            columns_of(&by_spark, columns),
            columns_of(&by_verdict, columns),
            "{name}"
        );
    }
}

/// Another team's job writes to the raw table with delta-rs: a checkpoint, OPTIMIZE, a
/// DELETE of some rows, `delta.appendOnly`, a checkpoint again. verdict reads the table as
/// of each of those versions exactly as delta-rs does, refuses what the property forbids
/// (retention), and its next commit after them is read back by delta-rs, Polars, DuckDB
/// and Spark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_reads_what_delta_rs_wrote_and_its_next_commit_reads_back_everywhere() {
    another_engine_writes("edit", "delta-rs").await;
}

/// The same writes by Spark with Delta's connector: its OPTIMIZE and DELETE rewrite files
/// into folders it names as the partition values are (`hour=9`), its commits carry
/// parameters that are not text; the reports from kept parts still count every file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_reads_what_spark_wrote_and_its_next_commit_reads_back_everywhere() {
    another_engine_writes("spark-edit", "Spark").await;
}

/// `lake.py <command>` (another engine's writes) on a raw table verdict wrote, then
/// verdict's reads and its next commit, as the two tests above say.
async fn another_engine_writes(command: &str, engine_name: &str) {
    spark_install();
    let (dir, store) = folder_lake();
    let now = chrono::Utc::now().timestamp_millis();
    let hour = HourPartition::from_event_time_ms(now - 5 * MS_PER_HOUR).unwrap();
    let events_of = |seed: u64| hour_events(hour, seed, 6_000, 300);
    write_raw_hour(&store, "decisions", hour, &events_of(7), 2, 1_000).await;
    let engine = engine_over(dir.path());
    let count_at = |version: Option<i64>| {
        let engine = engine.clone();
        async move {
            let sql = "SELECT COUNT(*) AS n, \
                       SUM(CASE WHEN tier = 1 THEN 1 ELSE 0 END) AS tier1 FROM decisions";
            let options =
                verdict_query::RunOptions::default().at(version.map(verdict_query::AsOf::Version));
            let got = engine.collect(sql, &options).await.unwrap();
            let batch = &got.batches[0];
            let n = |i: usize| {
                arrow::compute::cast(batch.column(i), &arrow::datatypes::DataType::UInt64)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<arrow::array::UInt64Array>()
                    .unwrap()
                    .value(0)
            };
            (n(0), n(1))
        }
    };

    let raw_dir = dir.path().join("raw");
    let table_path = raw_dir.to_str().unwrap().to_owned();
    let command = command.to_owned();
    let steps = tokio::task::spawn_blocking(move || run(&[&command, &table_path]))
        .await
        .unwrap();
    let said: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    assert_eq!(
        said,
        [
            "start",
            "checkpoint",
            "optimize",
            "delete",
            "property",
            "checkpoint"
        ]
    );
    for step in &steps {
        let version = step["version"].as_i64().unwrap();
        let theirs = (
            step["rows"].as_u64().unwrap(),
            step["tier1"].as_u64().unwrap(),
        );
        assert_eq!(
            count_at(Some(version)).await,
            theirs,
            "verdict as of version {version} ({} by {engine_name})",
            step["step"]
        );
        // The other engine kept the table at verdict's protocol: verdict may write it.
        assert_eq!(
            (step["reader"].as_i64(), step["writer"].as_i64()),
            (Some(1), Some(2))
        );
    }
    let deleted = &steps[3];
    assert!(
        deleted["rows"].as_u64() < steps[0]["rows"].as_u64(),
        "{deleted}"
    );
    assert_eq!(deleted["tier1"].as_u64(), Some(0));
    let after = count_at(None).await;
    assert_eq!(after.0, steps[5]["rows"].as_u64().unwrap());
    // A report from the kept parts counts every file the other engine wrote, as the
    // portable statement over the decisions does.
    let (from, to) = (
        chrono::DateTime::from_timestamp_millis(hour.start_ms())
            .unwrap()
            .to_rfc3339(),
        chrono::DateTime::from_timestamp_millis(hour.end_ms())
            .unwrap()
            .to_rfc3339(),
    );
    let (served, portable) = verdict_tests::query_fixture::served_and_portable(
        &engine,
        "denial-rate",
        &from,
        &to,
        &[("source", "raw")],
    )
    .await;
    assert!(!served.is_empty());
    assert_eq!(served, portable, "denial-rate after {engine_name}'s writes");

    // The table's schema is still verdict's, and its new property is honoured: retention
    // would remove data, which an append-only table forbids, in the plan and so in the
    // dry run.
    let table = RAW.table(Arc::clone(&store));
    let snapshot = table.snapshot().await.unwrap();
    RAW.check_schema(snapshot.metadata()).unwrap();
    let windows = verdict_jobs::Windows::default();
    let past = hour.end_ms() + 30 * 24 * MS_PER_HOUR;
    let refused = verdict_jobs::retention::plan(&store, past, &windows)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("the table is append-only (delta.appendOnly = true): retention"),
        "{refused}"
    );

    // verdict's next commit (one more hour's files) after delta-rs's: every engine reads it.
    let next = hour.next().unwrap();
    let events: Vec<_> = events_of(8)
        .into_iter()
        .map(|mut e| {
            e.event_time_ms += MS_PER_HOUR;
            e
        })
        .collect();
    write_raw_hour(&store, "decisions", next, &events, 2, 1_000).await;
    let total = count_at(None).await.0;
    assert_eq!(total, after.0 + events.len() as u64);
    let table_path = raw_dir.to_str().unwrap().to_owned();
    let others = tokio::task::spawn_blocking(move || {
        let others = run(&["others", &table_path]);
        let spark = run(&["count", &table_path]);
        (others, spark)
    })
    .await
    .unwrap();
    let (others, spark) = others;
    for engine in ["delta_rs", "polars", "duckdb"] {
        assert_eq!(
            others[0][engine].as_u64(),
            Some(total),
            "{engine}: {others:?}"
        );
    }
    assert_eq!(spark[0]["count"].as_u64(), Some(total), "Spark: {spark:?}");
    let seen: Vec<String> = steps
        .iter()
        .map(|s| format!("{} v{} {} rows", s["step"], s["version"], s["rows"]))
        .collect();
    println!(
        "{engine_name}'s versions, each read by verdict as {engine_name} reads it: {}; verdict's next commit read by delta-rs, Polars, DuckDB and Spark: {total} rows",
        seen.join(", ")
    );
}
