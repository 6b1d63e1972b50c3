//! The named reports on a lake with known answers (`verdict_tests::query_fixture`), on the
//! real S3 server: each report names exactly the tiers and keys the data was built to show.

use serde_json::Value;
use verdict_query::Limits;
use verdict_tests::query_fixture::{
    ROOMY, STEADY, STEADY_OVER, TIGHT, TRIAL, TRIAL_REFUSED, key_hex, known_engine, report, rows,
    served_and_portable,
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

    // wrong-limits, hour 10 (the known lake has 5 to 20 keys a tier, so min_keys=5): tight
    // too low, and its key with an override too (both need twice their bucket); roomy too
    // high; trial and steady fine, each with one key refused.
    let known = [hour_10[0], hour_10[1], ("min_keys", "5")];
    let wrong = report(&engine, "wrong-limits", &known).await;
    let verdicts: Vec<(String, String, bool, String)> = wrong
        .iter()
        .map(|r| {
            (
                s(r, "tier"),
                s(r, "route_class"),
                r["override_key"].is_string(),
                s(r, "verdict"),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("tight".into(), "read".into(), false, "too low".into()),
            ("tight".into(), "read".into(), true, "too low".into()),
            ("roomy".into(), "read".into(), false, "too high".into()),
            ("trial".into(), "read".into(), false, "fine".into()),
            ("steady".into(), "read".into(), false, "fine".into()),
        ],
        "{wrong:#?}"
    );
    assert_eq!(s(&wrong[1], "override_key"), key_hex(TIGHT, 0));
    assert_eq!(n(&wrong[0], "keys"), 9.0);
    assert_eq!(n(&wrong[0], "share_keys_constrained"), 1.0);
    assert_eq!(n(&wrong[0], "refusal_rate"), 0.5);
    assert_eq!(n(&wrong[0], "refused_by_bucket"), 90.0);
    // Twenty requests inside one span of the bucket's time scale, a capacity of ten.
    assert_eq!(n(&wrong[0], "burst_p90"), 2.0);
    assert_eq!(n(&wrong[4], "constrained_keys"), 1.0);
    // Steady's keys make 60 requests of a quota of 100, the one over it 105.
    assert_eq!(n(&wrong[4], "demand_p50"), 0.6);
    assert_eq!(n(&wrong[4], "demand_max"), 1.05);
    // Roomy's first key made 10 requests in region 0 and 5 (by the fallback) in region 1:
    // demand is counted per region against the quota that region enforced, 0.01 at most.
    assert_eq!(n(&wrong[2], "demand_max"), 0.01, "{}", wrong[2]);
    assert!(
        s(&wrong[0], "reason").contains("p90 engaged key needs"),
        "{}",
        wrong[0]
    );
    // The thresholds are parameters: judged by its busiest key (percentile 1) with 2 % of
    // the keys constrained enough, steady's limit is too low.
    let strict = report(
        &engine,
        "wrong-limits",
        &[
            hour_10[0],
            hour_10[1],
            ("min_keys", "5"),
            ("percentile", "1"),
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
    assert_eq!(n(&wrong[2], "tier_id"), f64::from(ROOMY));
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

    // A compaction in progress: a file merging two others put in the hour's folder, not yet
    // committed, is not read; once committed (the two removed, it added), each row is
    // still counted once, though the two files' bytes are still there.
    let before = count("SELECT COUNT(*) AS n FROM decisions").await;
    let hour = verdict_schemas::layout::HourPartition::from_event_time_ms(
        verdict_tests::query_fixture::HOUR_10_MS,
    )
    .unwrap();
    let files = verdict_rollup::hour_files(&store, &hour).await.unwrap();
    let (a, b) = (&files.files[0], &files.files[1]);
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
    let size = buf.len();
    let relative = format!("{}/merged.parquet", hour.partition_path());
    object_store::ObjectStoreExt::put(
        store.as_ref(),
        &object_store::path::Path::from(format!("raw/{relative}")),
        buf.into(),
    )
    .await
    .unwrap();
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        before,
        "a file no commit names is not read"
    );
    let (table, mut snapshot) = verdict_lake::tables::RAW
        .open(std::sync::Arc::clone(&store))
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    table
        .commit(
            &mut snapshot,
            verdict_lake::Commit::new(
                "OPTIMIZE",
                vec![
                    verdict_lake::Action::Remove(a.add.remove(now, false)),
                    verdict_lake::Action::Remove(b.add.remove(now, false)),
                    verdict_lake::Action::Add(
                        verdict_lake::Add::new(
                            relative,
                            a.add.partition_values.clone(),
                            size as i64,
                            now,
                        )
                        .rearranging(),
                    ),
                ],
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        before,
        "compacted rows are counted once"
    );

    // A new hour appears: the same engine sees it.
    let later = verdict_tests::query_fixture::HOUR_10_MS + 5 * 3_600_000;
    let mut events = verdict_tests::query_fixture::hour_10();
    for e in &mut events {
        e.event_time_ms = later + (e.event_time_ms - verdict_tests::query_fixture::HOUR_10_MS);
    }
    let new_hour = verdict_schemas::layout::HourPartition::from_event_time_ms(later).unwrap();
    let version_before = verdict_lake::tables::RAW
        .table(std::sync::Arc::clone(&store))
        .snapshot()
        .await
        .unwrap()
        .version();
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

    // Time travel: the version read before the hour appeared gives the answer given then,
    // in the same engine, while the next query without it sees everything.
    let at = |v| Some(verdict_query::AsOf::Version(v));
    let counted_at = |v| {
        let engine = engine.clone();
        async move {
            let batches = engine
                .collect(
                    "SELECT COUNT(*) AS n FROM decisions",
                    &verdict_query::RunOptions::default().rows(10).at(at(v)),
                )
                .await?
                .batches;
            Ok::<_, verdict_query::QueryError>(
                batches[0]
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .unwrap()
                    .value(0) as f64,
            )
        }
    };
    assert_eq!(counted_at(version_before).await.unwrap(), before);
    assert_eq!(
        counted_at(version_before + 1).await.unwrap(),
        before + events.len() as f64
    );
    let e = counted_at(version_before + 100).await.unwrap_err();
    assert_eq!(e.kind(), "invalid_query", "{e}");
    assert!(e.to_string().contains("does not exist yet"), "{e}");
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM decisions").await,
        before + events.len() as f64
    );
}

/// The `DataSourceExec` and `FilterExec` lines of `sql`'s physical plan.
async fn scan_and_filter(engine: &verdict_query::Engine, sql: &str) -> (String, String) {
    let plan = rows(engine, &format!("EXPLAIN {sql}"))
        .await
        .into_iter()
        .find(|r| s(r, "plan_type") == "physical_plan")
        .map(|r| s(&r, "plan"))
        .expect("a physical plan");
    let line = |op: &str| {
        plan.lines()
            .find(|l| l.trim_start().starts_with(op))
            .unwrap_or_else(|| panic!("no {op} in\n{plan}"))
            .to_string()
    };
    (line("DataSourceExec"), line("FilterExec"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_scans_test_against_file_statistics_only_the_conditions_that_can_rule_a_file_out() {
    let (engine, _store, _dir) = known_engine("pruning", Limits::default()).await;
    let roomy = key_hex(ROOMY, 0);
    let by_source = |cond: String| {
        format!("SELECT COUNT(*) AS n FROM decisions WHERE date = DATE '2026-11-30' AND {cond}")
    };

    // The key condition stays with the scan (bloom filter, min/max); the source condition
    // is left to the filter above it.
    let sql = by_source(format!("source IN (1, 2) AND key_id = X'{roomy}'"));
    let (scan, filter) = scan_and_filter(&engine, &sql).await;
    let predicate = &scan[scan.find("predicate=").expect("a scan predicate")..];
    assert!(predicate.starts_with("predicate=key_id@"), "{scan}");
    assert!(!predicate.contains("source"), "{scan}");
    assert!(filter.contains("source@"), "{filter}");
    assert!(filter.contains("key_id@"), "{filter}");
    // And the answers are those the lake was built with: roomy's first key made the only
    // degraded decisions, 5 by the local fallback and 3 by the kill switch.
    assert_eq!(n(&rows(&engine, &sql).await[0], "n"), 8.0);
    assert_eq!(
        n(
            &rows(&engine, &by_source("source = 2".into())).await[0],
            "n"
        ),
        3.0
    );
    let other = key_hex(ROOMY, 1);
    assert_eq!(
        n(
            &rows(
                &engine,
                &by_source(format!("source = 1 AND key_id = X'{other}'"))
            )
            .await[0],
            "n"
        ),
        0.0
    );

    // Nothing left that can prune: the scan has no condition of its own.
    let (scan, _) = scan_and_filter(&engine, &by_source("source IN (0, 1)".into())).await;
    assert!(scan.contains("predicate=true"), "{scan}");

    // The rollup's scans are not the raw table's, and keep their conditions.
    let rolled = engine
        .collect(
            "EXPLAIN SELECT COUNT(*) FROM denied_hourly WHERE tier = 1",
            &verdict_query::RunOptions::default().rows(100),
        )
        .await
        .map(|c| arrow::util::pretty::pretty_format_batches(&c.batches).unwrap())
        .unwrap()
        .to_string();
    assert!(rolled.contains("predicate=tier@"), "{rolled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_parquet_filters_pushed_down_a_raw_scan_keeps_every_condition() {
    use datafusion::execution::session_state::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::sync::Arc;

    let (_engine, store, _dir) = known_engine("pushdown", Limits::default()).await;
    // The scan then filters rows itself and no `FilterExec` is left above it, so its
    // predicate is the only place the condition is applied.
    let mut config = SessionConfig::new();
    config.options_mut().execution.parquet.pushdown_filters = true;
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(verdict_query::pruning::RAW_SCAN_PRUNING))
        .build();
    let ctx = SessionContext::new_with_state(state);
    let url =
        datafusion::execution::object_store::ObjectStoreUrl::parse(verdict_query::tables::LAKE_URL)
            .unwrap();
    ctx.register_object_store(url.as_ref(), store);
    verdict_query::tables::register(&ctx, Arc::new(verdict_query::PoliciesTable::new(None)))
        .unwrap();
    let sql = "SELECT COUNT(*) AS n FROM decisions WHERE source = 2";
    let plan = ctx
        .sql(&format!("EXPLAIN {sql}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let plan = arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    assert!(plan.contains("predicate=source@"), "{plan}");
    assert!(!plan.contains("FilterExec"), "{plan}");
    let counted = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let n = counted[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .unwrap()
        .value(0);
    assert_eq!(n, 3, "the kill switch's 3 decisions");
}

/// `denial-rate` from the raw decisions and from the rollup agree hour by hour on the
/// known lake: the limiter's decisions (the kill switch's three left out), refusals and
/// would-deny; the rollup knows the policy version only where a key was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_denial_rate_from_the_raw_decisions_and_from_the_rollup_agree() {
    let (engine, _store, _dir) = known_engine("denial-rate", Limits::default()).await;
    let series = |source: &'static str| {
        let engine = &engine;
        async move {
            report(engine, "denial-rate", &[("source", source)])
                .await
                .iter()
                .map(|r| {
                    (
                        s(r, "hour"),
                        s(r, "tier"),
                        n(r, "requests") as u64,
                        n(r, "denied") as u64,
                        n(r, "would_deny") as u64,
                        s(r, "source"),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let raw = series("raw").await;
    let rollup = series("rollup").await;
    let h10 = "2026-11-30T10:00:00Z";
    let h11 = "2026-11-30T11:00:00Z";
    let expected = |source: &str| {
        [
            (h10, "tight", 200, 100, 0),
            (h10, "roomy", 55, 0, 0),
            (h10, "trial", 310, 0, 10),
            (h10, "steady", 1245, 5, 0),
            (h11, "tight", 200, 100, 0),
            (h11, "roomy", 50, 0, 0),
            (h11, "trial", 300, 0, 0),
            (h11, "steady", 200, 100, 0),
        ]
        .map(|(h, t, r, d, w)| (h.to_string(), t.to_string(), r, d, w, source.to_string()))
        .to_vec()
    };
    assert_eq!(raw, expected("raw"));
    assert_eq!(rollup, expected("rollup"));
    // Within the raw table's week `auto` reads the decisions; before it, the rollup.
    let auto = report(&engine, "denial-rate", &[]).await;
    let now = chrono::Utc::now();
    let within = now - chrono::Duration::days(verdict_query::reports::RAW_DAYS)
        <= chrono::DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z").unwrap();
    assert_eq!(
        s(&auto[0], "source"),
        if within { "raw" } else { "rollup" },
        "auto on {now}"
    );
    // Versions: every raw hour has one; the rollup's only with refusals (roomy has none).
    let versions = |rows: &[Value]| -> Vec<String> {
        rows.iter()
            .filter(|r| s(r, "tier") == "roomy")
            .map(|r| s(r, "policy_version"))
            .collect()
    };
    let raw_rows = report(&engine, "denial-rate", &[("source", "raw")]).await;
    let rollup_rows = report(&engine, "denial-rate", &[("source", "rollup")]).await;
    assert_eq!(versions(&raw_rows), ["1", "2"]);
    assert_eq!(versions(&rollup_rows), ["null", "null"]);
    // One key's history: the steady key over quota, from either source.
    let key = key_hex(STEADY, STEADY_OVER);
    for source in ["raw", "rollup"] {
        let history = report(&engine, "denial-rate", &[("source", source), ("key", &key)]).await;
        let hours: Vec<_> = history
            .iter()
            .map(|r| (n(r, "requests") as u64, n(r, "denied") as u64))
            .collect();
        assert_eq!(hours, [(105, 5), (10, 5)], "{source}");
    }
    let bad = engine
        .report_sql(
            "denial-rate",
            &[("source".to_string(), "lake".to_string())].into(),
            verdict_query::reports::Form::Served,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("parameter source: \"lake\" is not one of auto, raw, rollup"),
        "{bad}"
    );
}

/// Each report over raw decisions gives the same rows from the query service's statement,
/// which reads its first level from parts kept per day, as from the portable statement that
/// reads the decisions all the way: over whole days, over a range cut inside hours on both
/// sides of a midnight, and filtered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reports_from_kept_parts_give_the_rows_of_the_decisions() {
    let (engine, _store, _dir) = known_engine("parts", Limits::default()).await;
    let reports = [
        (
            "wrong-limits",
            vec![("min_keys", "5")],
            vec![("tier", "tight")],
        ),
        ("limit-outliers", vec![], vec![("route_class", "read")]),
        ("shadow-impact", vec![], vec![("tier", "trial")]),
        ("policy-changes", vec![], vec![("tier", "steady")]),
        ("degraded", vec![], vec![("region", "1")]),
        (
            "denial-rate",
            vec![("source", "raw")],
            vec![("tier", "steady")],
        ),
    ];
    let ranges = [
        ("2026-11-29T00:00:00Z", "2026-12-01T00:00:00Z"),
        ("2026-11-29T22:30:00Z", "2026-11-30T10:45:00Z"),
    ];
    for (name, params, filter) in &reports {
        for (from, to) in ranges {
            for extra in [vec![], filter.clone()] {
                let mut given = params.clone();
                given.extend(extra);
                let (served, portable) = served_and_portable(&engine, name, from, to, &given).await;
                assert_eq!(served, portable, "{name} {from} {to} {given:?}");
                if from.ends_with("00:00:00Z") && given.len() == params.len() {
                    assert!(!served.is_empty(), "{name} has no rows over {from} to {to}");
                }
            }
        }
    }
}
