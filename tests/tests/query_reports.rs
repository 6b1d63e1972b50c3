//! The named reports on a lake with known answers (`verdict_tests::query_fixture`), on the
//! real S3 server: each report names exactly the tiers and keys the data was built to show.

use serde_json::Value;
use verdict_query::Limits;
use verdict_tests::query_fixture::{
    ROOMY, STEADY, STEADY_OVER, TIGHT, TRIAL, TRIAL_REFUSED, key_hex, known_engine, report, rows,
};

fn s(v: &Value, field: &str) -> String {
    match &v[field] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn n(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_report_names_exactly_the_limits_and_keys_the_data_was_built_to_show() {
    let (engine, _store, _dir) = known_engine("reports", Limits::default()).await;
    let hour_10 = [
        ("from", "2026-11-30T10:00:00Z"),
        ("to", "2026-11-30T11:00:00Z"),
    ];

    // wrong-limits, hour 10: tight too low, roomy too high, the others fine.
    let wrong = report(&engine, "wrong-limits", &hour_10).await;
    let verdicts: Vec<(String, String, String)> = wrong
        .iter()
        .map(|r| (s(r, "tier"), s(r, "route_class"), s(r, "verdict")))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("tight".into(), "read".into(), "too low".into()),
            ("roomy".into(), "read".into(), "too high".into()),
            ("trial".into(), "read".into(), "fine".into()),
            ("steady".into(), "read".into(), "fine".into()),
        ],
        "{wrong:#?}"
    );
    assert_eq!(n(&wrong[0], "share_keys_refused"), 1.0);
    assert_eq!(n(&wrong[0], "refusal_rate"), 0.5);
    assert_eq!(n(&wrong[3], "keys_refused"), 1.0);
    assert_eq!(n(&wrong[3], "busiest_use"), 1.0);
    assert!(
        (n(&wrong[1], "busiest_use") - 0.01).abs() < 1e-9,
        "{}",
        wrong[1]
    );
    // The thresholds are parameters: at 2 % of keys refused, steady's 1 in 20 is too low.
    let strict = report(
        &engine,
        "wrong-limits",
        &[
            hour_10[0],
            hour_10[1],
            ("too_low_share", "0.02"),
            ("tier", "steady"),
        ],
    )
    .await;
    assert_eq!(strict.len(), 1);
    assert_eq!(s(&strict[0], "verdict"), "too low");

    // shadow-impact: only trial is in shadow mode; one key, 10 would-be 429s.
    let shadow = report(&engine, "shadow-impact", &hour_10).await;
    assert_eq!(shadow.len(), 1, "{shadow:#?}");
    assert_eq!(s(&shadow[0], "tier"), "trial");
    assert_eq!(n(&shadow[0], "would_deny"), 10.0);
    assert_eq!(n(&shadow[0], "keys_would_deny"), 1.0);
    assert_eq!(n(&shadow[0], "keys"), 20.0);
    assert_eq!(n(&shadow[0], "requests"), 310.0);

    // top-denied over both hours: the ten tight keys (20 each), then the two keys with 10:
    // trial's would-deny key and steady's key over quota (5 in hour 10, 5 in hour 11), in
    // key order; every other steady key has 5.
    let top = report(&engine, "top-denied", &[("limit", "12")]).await;
    assert_eq!(top.len(), 12);
    for r in &top[..10] {
        assert_eq!(s(r, "tier"), "tight", "{r}");
        assert_eq!(n(r, "denied"), 20.0, "{r}");
    }
    assert_eq!(s(&top[0], "key_id"), key_hex(TIGHT, 0));
    assert_eq!(
        n(&top[0], "override_quota"),
        1200.0,
        "tight key 0 has an override"
    );
    assert!(top[1]["override_quota"].is_null(), "{}", top[1]);
    assert_eq!(s(&top[10], "key_id"), key_hex(TRIAL, TRIAL_REFUSED));
    assert_eq!(n(&top[10], "would_deny"), 10.0);
    assert_eq!(s(&top[11], "key_id"), key_hex(STEADY, STEADY_OVER));
    assert_eq!(n(&top[11], "denied"), 10.0);
    let trial = report(&engine, "top-denied", &[("tier", "trial")]).await;
    assert_eq!(trial.len(), 1);
    assert_eq!(s(&trial[0], "key_id"), key_hex(TRIAL, TRIAL_REFUSED));
    assert_eq!(n(&trial[0], "would_deny"), 10.0);
    let one = report(
        &engine,
        "top-denied",
        &[("key", &key_hex(STEADY, STEADY_OVER))],
    )
    .await;
    assert_eq!(one.len(), 1);

    // overage: the one key that spent its quota.
    let over = report(&engine, "overage", &[]).await;
    assert_eq!(over.len(), 1, "{over:#?}");
    assert_eq!(s(&over[0], "key_id"), key_hex(STEADY, STEADY_OVER));
    assert_eq!(s(&over[0], "tier"), "steady");
    assert_eq!(n(&over[0], "quota_denied"), 5.0);
    assert_eq!(n(&over[0], "quota_would_deny"), 0.0);
    assert_eq!(n(&over[0], "window_quota"), 100.0);
    assert_eq!(s(&over[0], "date"), "2026-11-30");

    // policy-changes: version 2 made steady's rate jump; nothing else moved.
    let changes = report(&engine, "policy-changes", &[]).await;
    let jumped: Vec<String> = changes
        .iter()
        .filter(|r| r["jumped"] == Value::Bool(true))
        .map(|r| s(r, "tier"))
        .collect();
    assert_eq!(jumped, ["steady"], "{changes:#?}");
    assert_eq!(changes.len(), 4, "one change per tier: {changes:#?}");
    let steady = changes.iter().find(|r| s(r, "tier") == "steady").unwrap();
    assert_eq!(n(steady, "version_before"), 1.0);
    assert_eq!(n(steady, "version"), 2.0);
    assert_eq!(n(steady, "rate_after"), 0.5);

    // degraded: region 1's fallback and region 2's kill switch, in hour 10 only.
    let degraded = report(&engine, "degraded", &[]).await;
    let found: Vec<(String, f64, f64, f64, f64)> = degraded
        .iter()
        .map(|r| {
            let hour = n(r, "hour");
            (
                s(r, "date"),
                hour,
                n(r, "region"),
                n(r, "local_fallback"),
                n(r, "kill_switch"),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("2026-11-30".to_string(), 10.0, 1.0, 5.0, 0.0),
            ("2026-11-30".to_string(), 10.0, 2.0, 0.0, 3.0),
        ],
        "{degraded:#?}"
    );
    assert_eq!(n(&wrong[1], "tier_id"), f64::from(ROOMY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_read_the_lake_as_written_and_see_new_files_without_a_restart() {
    let (engine, store, _dir) = known_engine("tables", Limits::default()).await;
    let count = |sql: &'static str| {
        let engine = engine.clone();
        async move { n(&rows(&engine, sql).await[0], "n") }
    };
    let raw = verdict_tests::query_fixture::hour_10().len()
        + verdict_tests::query_fixture::hour_11().len();
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        raw as f64
    );
    // The partition columns prune: one hour's folder.
    let hour_10 = verdict_tests::query_fixture::hour_10().len();
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions WHERE date = DATE '2026-11-30' AND hour = 10")
            .await,
        hour_10 as f64
    );
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM policies WHERE kind = 'limit'").await,
        8.0
    );
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM policies WHERE kind = 'override'").await,
        1.0
    );
    assert_eq!(count("SELECT COUNT(*) AS n FROM overage").await, 1.0);
    let rolled = count("SELECT COUNT(*) AS n FROM denied_hourly").await;
    assert!(rolled > 0.0);

    // A compaction in progress: a file covering two others, both still there. Each row
    // is counted once.
    let before = count("SELECT COUNT(*) AS n FROM decisions").await;
    let hour = verdict_schemas::layout::HourPartition::from_event_time_ms(
        verdict_tests::query_fixture::HOUR_10_MS,
    )
    .unwrap();
    let files = verdict_rollup::hour_files(store.as_ref(), &hour)
        .await
        .unwrap();
    let (a, b) = (&files.files[0], &files.files[1]);
    assert_eq!(
        a.name.partition(),
        b.name.partition(),
        "two files of one partition"
    );
    let merged = verdict_schemas::layout::RawFileName::new(
        a.name.topic(),
        a.name.partition(),
        a.name.first_offset(),
        b.name.last_offset(),
    )
    .unwrap();
    let mut both = Vec::new();
    for f in [a, b] {
        let body = object_store::ObjectStoreExt::get(store.as_ref(), &f.meta.location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(body)
            .unwrap()
            .build()
            .unwrap();
        both.extend(reader.map(|b| b.unwrap()));
    }
    let merged_batch = arrow::compute::concat_batches(&both[0].schema(), &both).unwrap();
    let mut buf = Vec::new();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(&mut buf, merged_batch.schema(), None).unwrap();
    w.write(&merged_batch).unwrap();
    w.close().unwrap();
    object_store::ObjectStoreExt::put(
        store.as_ref(),
        &object_store::path::Path::from(merged.raw_path(&hour)),
        buf.into(),
    )
    .await
    .unwrap();
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        before,
        "covered files are not counted twice"
    );

    // A new hour appears: the same engine sees it.
    let later = verdict_tests::query_fixture::HOUR_10_MS + 5 * 3_600_000;
    let mut events = verdict_tests::query_fixture::hour_10();
    for e in &mut events {
        e.event_time_ms = later + (e.event_time_ms - verdict_tests::query_fixture::HOUR_10_MS);
    }
    let new_hour = verdict_schemas::layout::HourPartition::from_event_time_ms(later).unwrap();
    verdict_tests::rollup_check::write_raw_hour(
        &store,
        "verdict.decisions.v1",
        new_hour,
        &events,
        1,
        100_000,
    )
    .await;
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        before + events.len() as f64
    );
}
