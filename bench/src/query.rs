//! `verdict-bench query`: a realistic lake (days of raw decisions at a scaled-down rate,
//! a month of hourly rollups and the daily overage), then every named report and a few
//! ad-hoc queries timed in DataFusion and, on the same files with the same SQL, in DuckDB,
//! and in a process of ours that does not count memory per query (what the counting in
//! `verdict_query::memory` costs), each run in turns with ours.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use verdict_jobs::overage;
use verdict_jobs::partitions::delete_under;
use verdict_limiter::{FileSource, PolicySource};
use verdict_query::reports::Form;
use verdict_query::{Engine, Limits, PoliciesTable, RunOptions};
use verdict_rollup::Rollup;
use verdict_schemas::layout::HourPartition;
use verdict_schemas::synth::SynthConfig;

use super::rollup::write_synth_hour;
use super::shared::median;
use verdict_demo::policy::policy_toml;

/// Options of `verdict-bench query`.
#[derive(Debug, Args)]
pub struct QueryBenchArgs {
    /// Days of raw decisions (the raw table keeps 7).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..))]
    pub raw_days: u32,
    /// Days of hourly rollups and daily overage (at least --raw-days).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub rollup_days: u32,
    /// Decisions per hour (the production peak is 62.5 M; this is the scaled-down rate).
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub events_per_hour: u64,
    /// Distinct API keys.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Kafka partitions the raw files are spread over (one file per partition and hour).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// A new policy version every this many hours (so policy-changes has changes).
    #[arg(long, default_value_t = 48)]
    pub policy_every_hours: u32,
    /// Timed runs per query and engine, after one warm-up each, in turns (ours, DuckDB's,
    /// ours, …); the median of each engine's is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// The what-if's key sample: it is run over every key, then with this `sample_keys`
    /// (a sample where the range has more keys), and the estimates compared.
    #[arg(long, default_value_t = verdict_query::whatif::SAMPLE_KEYS, value_parser = clap::value_parser!(u64).range(1..))]
    pub what_if_sample_keys: u64,
    /// Skip the comparison with a process of ours that does not count memory per query
    /// (`VERDICT_COUNT_MEMORY=off`), run in turns with ours.
    #[arg(long)]
    pub no_uncounted: bool,
    /// Skip the last step, `verdict what-if --recommended` (the review, each judged limit's
    /// recommendation proved by the replay of a sample of its keys, and the whole
    /// recommendation replayed): the longest step at the largest sizes.
    #[arg(long)]
    pub no_recommended: bool,
    /// Only these queries (report or ad-hoc names, separated by commas), each in both
    /// engines and served; the reports' stored levels of an earlier run are left as they
    /// are (a report over raw decisions is served from them where they are stored), and
    /// no levels are stored and no what-if run
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[command(flatten)]
    pub compare: super::shared::DuckDbArgs,
}

/// Options of `verdict-bench query-peer`.
#[derive(Debug, Args)]
pub struct QueryPeerArgs {
    /// The lake `bench query` wrote (its policy in `policy.toml`).
    #[arg(long)]
    pub lake: std::path::PathBuf,
    /// The queries, a JSON object `{"queries": [{"name", "sql"}]}`.
    #[arg(long)]
    pub spec: std::path::PathBuf,
    /// Threads for the engine.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub threads: u64,
}

#[derive(Debug, Serialize)]
struct QueryResult {
    bench: &'static str,
    query: String,
    kind: &'static str,
    /// Ours on the statement DuckDB runs (a report's portable one); none when it failed.
    p50_ms: Option<f64>,
    min_ms: Option<f64>,
    rows: Option<usize>,
    rows_scanned: Option<u64>,
    /// The most memory ours held at once on that statement's first run, MiB (the query's
    /// own count, see `verdict_query::memory`).
    peak_mib: Option<f64>,
    /// Why ours failed on that statement (a report's portable form past the memory limit
    /// at a large size, say); the bench goes on.
    error: Option<String>,
    /// A report as the query service answers it (its first levels kept in parts): the first
    /// run, computing the parts, then the median of the runs that find them kept.
    served_first_ms: Option<f64>,
    /// The most memory the first served run held at once, MiB.
    served_first_peak_mib: Option<f64>,
    /// Why the served report failed; the bench goes on.
    served_error: Option<String>,
    served_p50_ms: Option<f64>,
    /// served_p50_ms ÷ duckdb_p50_ms.
    served_vs_duckdb: Option<f64>,
    duckdb_p50_ms: Option<f64>,
    duckdb_rows: Option<usize>,
    vs_duckdb: Option<f64>,
    /// The same query in a process of ours that does not count memory per query.
    uncounted_p50_ms: Option<f64>,
    /// p50_ms ÷ uncounted_p50_ms: what counting costs (1.0: nothing).
    vs_uncounted: Option<f64>,
}

#[derive(Debug, Serialize)]
struct DataSet {
    bench: &'static str,
    data_set: bool,
    raw_days: u32,
    rollup_days: u32,
    events_per_hour: u64,
    raw_events: u64,
    raw_bytes: u64,
    rollup_rows: u64,
    overage_rows: u64,
    generate_seconds: f64,
    threads: usize,
}

/// One run of a query in a peer (DuckDB, or an uncounted process of ours).
#[derive(Debug, Deserialize, Serialize)]
struct DuckDbRun {
    #[serde(default)]
    seconds: f64,
    #[serde(default)]
    rows: usize,
    error: Option<String>,
}

/// 2026-12-01T00:00:00Z: the data set ends at the start of this day.
const END_MS: i64 = 1_796_083_200_000;

fn hour_config(base: &SynthConfig, start_ms: i64, index: u32, every: u32) -> SynthConfig {
    SynthConfig {
        seed: base.seed + u64::from(index),
        start_ms,
        late_share: 0.0,
        policy_version: 1 + u64::from(index / every.max(1)),
        ..base.clone()
    }
}

/// Writes the data set (or finds it written) and returns its summary.
async fn write_data_set(
    store: &Arc<dyn ObjectStore>,
    root: &std::path::Path,
    args: &QueryBenchArgs,
    threads: usize,
) -> anyhow::Result<DataSet> {
    let rollup_days = args.rollup_days.max(args.raw_days);
    let hours = rollup_days * 24;
    let base = SynthConfig::hour(args.events_per_hour, args.keys);
    let stamp = root.join("bench-query.json");
    // The layout's version leads: a data set written before the demand histogram existed
    // is written again.
    let shape = format!(
        "demand-v1/{}/{}/{}/{}/{}/{}",
        args.raw_days,
        rollup_days,
        args.events_per_hour,
        args.keys,
        args.partitions,
        args.policy_every_hours
    );
    if let Ok(text) = std::fs::read_to_string(&stamp)
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        && v["shape"] == shape
    {
        tracing::info!(folder = %root.display(), "reusing the data set written earlier");
        compact_final_days(store).await?;
        return Ok(DataSet {
            bench: "query",
            data_set: true,
            raw_days: args.raw_days,
            rollup_days,
            events_per_hour: args.events_per_hour,
            raw_events: v["raw_events"].as_u64().unwrap_or(0),
            raw_bytes: v["raw_bytes"].as_u64().unwrap_or(0),
            rollup_rows: v["rollup_rows"].as_u64().unwrap_or(0),
            overage_rows: v["overage_rows"].as_u64().unwrap_or(0),
            generate_seconds: 0.0,
            threads,
        });
    }
    let started = Instant::now();
    let rollup = Rollup::new(Arc::clone(store), threads);
    let first_ms = END_MS - i64::from(hours) * 3_600_000;
    let raw_from_ms = END_MS - i64::from(args.raw_days) * 86_400_000;
    let (mut raw_events, mut raw_bytes, mut rollup_rows, mut overage_rows) =
        (0u64, 0u64, 0u64, 0u64);
    for i in 0..hours {
        let start = first_ms + i64::from(i) * 3_600_000;
        let hour = HourPartition::from_event_time_ms(start)?;
        let cfg = hour_config(&base, start, i, args.policy_every_hours);
        write_synth_hour(
            store,
            hour,
            cfg,
            args.events_per_hour,
            args.partitions as usize,
            1,
        )
        .await?;
        let report = rollup.run_hour(hour).await?;
        rollup_rows += report.rows as u64;
        if start < raw_from_ms {
            // Past the raw table's days: removed in a commit, as retention does, then its
            // files deleted, as vacuum does.
            let table = verdict_lake::tables::RAW.table(Arc::clone(store));
            let mut snapshot = table.snapshot().await?;
            let now = chrono::Utc::now().timestamp_millis();
            let removes: Vec<verdict_lake::Action> = snapshot
                .files_under(&format!("{}/", hour.partition_path()))
                .map(|a| verdict_lake::Action::Remove(a.remove(now, true)))
                .collect();
            table
                .commit(&mut snapshot, verdict_lake::Commit::new("DELETE", removes))
                .await?;
            delete_under(store.as_ref(), &Path::from(hour.raw_prefix())).await?;
        } else {
            raw_events += report.events;
            raw_bytes += report.source_bytes;
        }
        // The data set starts at midnight, so every day ends at an hour 23.
        if i % 24 == 23 {
            let date = hour.date();
            let o = overage::run_day(&rollup, date).await?;
            overage_rows += o.rows as u64;
            tracing::info!(%date, hours = i + 1, of = hours, overage_rows = o.rows, "data set: day written");
        }
    }
    compact_final_days(store).await?;
    let set = DataSet {
        bench: "query",
        data_set: true,
        raw_days: args.raw_days,
        rollup_days,
        events_per_hour: args.events_per_hour,
        raw_events,
        raw_bytes,
        rollup_rows,
        overage_rows,
        generate_seconds: started.elapsed().as_secs_f64(),
        threads,
    };
    let last_version = 1 + u64::from((hours - 1) / args.policy_every_hours.max(1));
    std::fs::write(root.join("policy.toml"), policy_toml(&base, last_version))?;
    std::fs::write(
        &stamp,
        serde_json::json!({"shape": shape, "raw_events": raw_events, "raw_bytes": raw_bytes,
            "rollup_rows": rollup_rows, "overage_rows": overage_rows})
        .to_string(),
    )?;
    Ok(set)
}

/// Compacts the rollup's days past the raw window as of the data set's end, as the jobs'
/// compaction does once a day leaves the raw window (a data set written before that
/// compaction existed is brought to it here; a compacted one is left as it is).
async fn compact_final_days(store: &Arc<dyn ObjectStore>) -> anyhow::Result<()> {
    let clock: verdict_lake::Clock = Arc::new(verdict_schemas::SystemClock);
    let windows = verdict_jobs::Windows::default();
    let lake = verdict_jobs::Lake {
        store,
        clock: &clock,
        windows: &windows,
        now_ms: END_MS,
    };
    let report = verdict_jobs::compact_days::run(lake).await?;
    if !report.compacted.is_empty() {
        tracing::info!(
            days = report.compacted.len(),
            files = report.compacted.iter().map(|c| c.inputs).sum::<usize>(),
            "data set: the rollup's final days compacted"
        );
    }
    Ok(())
}

fn ts(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// One query of the bench: its name, kind, the statement both engines run, and for a
/// report the statement the query service runs.
struct BenchQuery {
    name: String,
    kind: &'static str,
    sql: String,
    served: Option<String>,
}

/// The queries: every named report over its table's whole window (its portable statement,
/// and the served one), and a few ad-hoc ones.
async fn queries(engine: &Engine, args: &QueryBenchArgs) -> anyhow::Result<Vec<BenchQuery>> {
    let rollup_days = args.rollup_days.max(args.raw_days);
    let raw_from = ts(END_MS - i64::from(args.raw_days) * 86_400_000);
    let rollup_from = ts(END_MS - i64::from(rollup_days) * 86_400_000);
    let to = ts(END_MS);
    let mut out = Vec::new();
    for report in verdict_query::reports::catalog() {
        let from = if report.tables.contains(&"decisions") {
            &raw_from
        } else {
            &rollup_from
        };
        let params: BTreeMap<String, String> = [
            ("from".to_string(), from.clone()),
            ("to".to_string(), to.clone()),
        ]
        .into();
        out.push(BenchQuery {
            name: report.name.to_string(),
            kind: "report",
            // The statement DuckDB runs too: the limit review reads the decisions all the
            // way, not the query service's kept parts.
            sql: engine
                .report_sql(report.name, &params, Form::Portable)
                .await?,
            served: Some(
                engine
                    .report_sql(report.name, &params, Form::Served)
                    .await?,
            ),
        });
    }
    let adhoc = |name: &str, sql: String| BenchQuery {
        name: name.to_owned(),
        kind: "adhoc",
        sql,
        served: None,
    };
    let last_day = ts(END_MS - 86_400_000)[..10].to_string();
    out.push(adhoc(
        "adhoc-daily-verdicts",
        "SELECT date, verdict, COUNT(*) AS decisions FROM decisions GROUP BY date, verdict ORDER BY date, verdict".into(),
    ));
    out.push(adhoc(
        "adhoc-last-day-hourly-refusals",
        format!("SELECT hour, tier, SUM(CASE WHEN verdict <> 0 THEN 1 ELSE 0 END) AS refused, COUNT(*) AS decisions FROM decisions WHERE date = DATE '{last_day}' GROUP BY hour, tier ORDER BY hour, tier"),
    ));
    out.push(adhoc(
        "adhoc-month-refusals-by-limit",
        "SELECT tier, route_class, SUM(denied) AS denied, SUM(would_deny) AS would_deny, COUNT(DISTINCT key_id) AS keys FROM denied_hourly GROUP BY tier, route_class ORDER BY tier, route_class".into(),
    ));
    Ok(out)
}

/// Writes the data set, times each query in both engines and prints one JSON line per query.
pub async fn run(args: QueryBenchArgs) -> anyhow::Result<()> {
    let threads = args.compare.threads();
    let (root, _tmp) = args.compare.lake()?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&root)?);
    let set = write_data_set(&store, &root, &args, threads).await?;
    println!("{}", serde_json::to_string(&set)?);
    // The reports' stored levels of an earlier run go: the served reports below compute
    // their parts from the decisions, and the levels are stored (and timed) after them.
    if args.only.is_empty() {
        delete_under(store.as_ref(), &Path::from(LEVELS_PREFIX)).await?;
    }

    let engine = lake_engine(&root, threads)?;
    let mut bench_queries = queries(&engine, &args).await?;
    if !args.only.is_empty() {
        let known: Vec<&str> = bench_queries.iter().map(|q| q.name.as_str()).collect();
        if let Some(unknown) = args.only.iter().find(|n| !known.contains(&n.as_str())) {
            anyhow::bail!(
                "--only: no query named {unknown:?}; the queries are {}",
                known.join(", ")
            );
        }
        bench_queries.retain(|q| args.only.contains(&q.name));
    }
    let queries: Vec<(String, &'static str, String)> = bench_queries
        .iter()
        .map(|q| (q.name.clone(), q.kind, q.sql.clone()))
        .collect();

    // DuckDB runs beside us: each timed run of ours is followed by one of DuckDB's, so a
    // machine that speeds up or slows down during the bench weighs on both alike.
    let mut duck = if args.compare.no_duckdb {
        None
    } else {
        let spec = duckdb_spec(&engine, &root, &queries, threads).await?;
        Some(DuckDb::start(&args.compare, &spec)?)
    };
    // Ours with memory counting off, in a process of its own (the allocator decides once
    // per process): each timed run of ours is followed by one of its, so what counting
    // costs is measured on the same machine at the same moment.
    let mut uncounted = if args.no_uncounted {
        None
    } else if !verdict_query::memory::is_counting() {
        tracing::warn!(
            "this process does not count memory per query ({}=off): no comparison with an uncounted one",
            verdict_query::memory::SWITCH
        );
        None
    } else {
        Some(DuckDb::start_peer(&root, &queries, threads)?)
    };
    // Each report's rows, for the service reading the stored levels to answer the same.
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for BenchQuery {
        name,
        kind,
        sql,
        served,
    } in &bench_queries
    {
        // Ours on the statement DuckDB runs; a failure (past the memory limit, say) is
        // reported and the bench goes on.
        let first = engine.collect(sql, &RunOptions::default()).await;
        let (ours, mut error, peak) = match first {
            Ok(c) => (Some((c.rows(), c.rows_read)), None, Some(mib(c.peak_bytes))),
            Err(e) => (None, Some(e.to_string()), None),
        };
        let mut duck_rows = None;
        if let Some(d) = duck.as_mut() {
            duck_rows = Some(d.run(name)?.rows);
        }
        if let (Some(u), Some((rows, _))) = (uncounted.as_mut(), ours) {
            let theirs = u.run(name)?.rows;
            anyhow::ensure!(
                theirs == rows,
                "query {name}: the uncounted process answered {theirs} rows, this one {rows}"
            );
        }
        let (mut times, mut duck_times, mut uncounted_times) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..args.runs {
            if ours.is_some() && error.is_none() {
                let t = Instant::now();
                // A statement near the memory limit may pass once and not the next time:
                // reported as a first run's failure is, without times.
                if let Err(e) = engine.collect(sql, &RunOptions::default()).await {
                    error = Some(format!("a timed run: {e}"));
                    times.clear();
                    uncounted_times.clear();
                    continue;
                }
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                if let Some(u) = uncounted.as_mut() {
                    uncounted_times.push(u.run(name)?.seconds * 1000.0);
                }
            }
            if let Some(d) = duck.as_mut() {
                duck_times.push(d.run(name)?.seconds * 1000.0);
            }
        }
        // A report as the service answers it: the first run computes its parts, the others
        // find them kept. Its rows are the portable statement's.
        let (mut served_first, mut served_peak, mut served_times) = (None, None, Vec::new());
        let mut served_error = None;
        if let Some(served) = served {
            for run in 0..=args.runs {
                let t = Instant::now();
                // A failure (past the memory limit at a large size, say) is reported and
                // the bench goes on, as for the portable statement.
                let c = match engine.collect(served, &RunOptions::default()).await {
                    Ok(c) => c,
                    Err(e) => {
                        served_error = Some(e.to_string());
                        break;
                    }
                };
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                if run == 0 {
                    served_first = Some(ms);
                    served_peak = Some(mib(c.peak_bytes));
                    if let Some((rows, _)) = ours {
                        anyhow::ensure!(
                            c.rows() == rows,
                            "query {name}: served {} rows, portable {rows}",
                            c.rows()
                        );
                    }
                } else {
                    served_times.push(ms);
                }
            }
        }
        let some = |v: &Vec<f64>| (!v.is_empty()).then(|| median(v));
        let (p50, duck_p50, uncounted_p50, served_p50) = (
            some(&times),
            some(&duck_times),
            some(&uncounted_times),
            some(&served_times),
        );
        let result = QueryResult {
            bench: "query",
            query: name.clone(),
            kind,
            p50_ms: p50,
            min_ms: (!times.is_empty())
                .then(|| times.iter().copied().fold(f64::INFINITY, f64::min)),
            rows: ours.map(|(rows, _)| rows),
            rows_scanned: ours.map(|(_, scanned)| scanned),
            peak_mib: peak,
            error,
            served_first_ms: served_first,
            served_first_peak_mib: served_peak,
            served_error,
            served_p50_ms: served_p50,
            served_vs_duckdb: served_p50.zip(duck_p50).map(|(s, d)| s / d),
            duckdb_p50_ms: duck_p50,
            duckdb_rows: duck_rows,
            vs_duckdb: p50.zip(duck_p50).map(|(p, d)| p / d),
            uncounted_p50_ms: uncounted_p50,
            vs_uncounted: p50.zip(uncounted_p50).map(|(p, u)| p / u),
        };
        if let (Some(d), Some((rows, _))) = (duck_rows, ours)
            && d != rows
        {
            tracing::warn!(query = %result.query, ours = rows, duckdb = d, "DuckDB returned a different number of rows");
        }
        if let Some(rows) = result.rows {
            answered.insert(name.clone(), rows);
        }
        println!("{}", serde_json::to_string(&result)?);
    }
    if !args.only.is_empty() {
        return Ok(());
    }
    stored_levels(&store, &root, threads, &bench_queries, &answered, &set).await?;
    replay(&engine, &root, &args).await
}

/// Bytes as MiB.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Where `verdict query levels` stores the reports' first levels.
const LEVELS_PREFIX: &str = "levels";

/// The reports' first levels stored in the lake as `verdict query levels` stores them,
/// timed, with their bytes beside the raw table's; then each report's first run in a
/// service started over the lake, which reads the stored parts instead of the decisions and
/// must answer each report with as many rows as the portable statement (`answered`).
async fn stored_levels(
    store: &Arc<dyn ObjectStore>,
    root: &std::path::Path,
    threads: usize,
    queries: &[BenchQuery],
    answered: &BTreeMap<String, usize>,
    set: &DataSet,
) -> anyhow::Result<()> {
    use futures::TryStreamExt;
    let writer = lake_engine(root, threads)?;
    let started = Instant::now();
    let done = match writer.write_levels(Arc::clone(store)).await {
        Ok(done) => done,
        Err(e) => {
            // Said, and the bench goes on to the what-if.
            println!(
                "{}",
                serde_json::json!({"bench": "query", "levels": true, "error": e.to_string()})
            );
            return Ok(());
        }
    };
    let write_seconds = started.elapsed().as_secs_f64();
    let (mut bytes, mut data_bytes) = (0u64, 0u64);
    let mut listed = store.list(Some(&Path::from(LEVELS_PREFIX)));
    while let Some(meta) = listed.try_next().await? {
        bytes += meta.size;
        if meta.location.as_ref().ends_with(".parquet") {
            data_bytes += meta.size;
        }
    }
    let days = u64::from(set.raw_days).max(1);
    println!(
        "{}",
        serde_json::json!({
            "bench": "query",
            "levels": true,
            "written": done.written,
            "write_seconds": write_seconds,
            "bytes": bytes,
            "data_bytes": data_bytes,
            "bytes_per_day": bytes / days,
            "raw_bytes_per_day": set.raw_bytes / days,
            "share_of_raw": bytes as f64 / set.raw_bytes.max(1) as f64,
        })
    );
    // A service started over the lake: each report's first run reads the stored parts.
    let fresh = lake_engine(root, threads)?;
    for q in queries {
        let Some(served) = &q.served else { continue };
        let started = Instant::now();
        let answer = fresh.collect(served, &RunOptions::default()).await;
        let mut line = serde_json::json!({
            "bench": "query",
            "query": q.name,
            "kind": "stored",
            "served_stored_first_ms": started.elapsed().as_secs_f64() * 1000.0,
        });
        match answer {
            Ok(c) => {
                if let Some(rows) = answered.get(&q.name) {
                    anyhow::ensure!(
                        c.rows() == *rows,
                        "query {}: served from the stored levels {} rows, portable {rows}",
                        q.name,
                        c.rows()
                    );
                }
                line["served_stored_first_peak_mib"] = mib(c.peak_bytes).into();
                line["rows"] = c.rows().into();
                line["rows_scanned"] = c.rows_read.into();
            }
            // Said, and the bench goes on.
            Err(e) => line["error"] = e.to_string().into(),
        }
        println!("{line}");
    }
    Ok(())
}

/// The what-if replay over the raw days under the policy in force: end to end (reading the
/// raw table hour by hour included), and the decision core alone on one core, on requests
/// read beforehand.
async fn replay(
    engine: &Engine,
    root: &std::path::Path,
    args: &QueryBenchArgs,
) -> anyhow::Result<()> {
    use verdict_query::whatif;
    let candidate = whatif::candidate(&std::fs::read_to_string(root.join("policy.toml"))?)?;
    let range = verdict_query::range::Range::parse(
        Some(&ts(END_MS - i64::from(args.raw_days) * 86_400_000)),
        Some(&ts(END_MS)),
        chrono::Utc::now(),
        7,
    )?;
    // Every key's replay: at the largest sizes it passes the query's time limit, which is
    // reported (the sampled one below is what the service answers with) and the bench goes on.
    let started = Instant::now();
    let every_key = whatif::what_if_measured(engine, candidate.clone(), range, 10, u64::MAX).await;
    let every_key_seconds = started.elapsed().as_secs_f64();
    // The same with the default sample of the keys (a sample where the range has more).
    let started = Instant::now();
    let (sampled, sampled_peak) = whatif::what_if_measured(
        engine,
        candidate.clone(),
        range,
        10,
        args.what_if_sample_keys,
    )
    .await?;
    let sampled_seconds = started.elapsed().as_secs_f64();
    // Each limit's estimated refusals and requests beside every key's: the largest error
    // as a share of every key's count, and whether each lies within its bound.
    let (mut worst, mut within) = (0.0f64, true);
    let exact = every_key
        .as_ref()
        .map(|(a, _)| a.limits.as_slice())
        .unwrap_or(&[]);
    for (e, x) in sampled.limits.iter().zip(exact) {
        let pairs = [
            (
                e.candidate.refused,
                x.candidate.refused,
                e.bound.as_ref().map(|b| b.candidate_refused),
            ),
            (
                e.candidate.requests,
                x.candidate.requests,
                e.bound.as_ref().map(|b| b.requests),
            ),
        ];
        for (estimate, exact, bound) in pairs {
            worst = worst.max(estimate.abs_diff(exact) as f64 / exact.max(1) as f64);
            within &= estimate.abs_diff(exact) <= bound.unwrap_or(0);
        }
    }
    // The decision core alone, on the first hours' requests up to REPLAY_CORE_REQUESTS
    // (held in memory: 32 bytes each).
    let mut requests = Vec::new();
    let mut hour = whatif::first_hour(range);
    while hour < range.to && requests.len() < REPLAY_CORE_REQUESTS {
        requests.extend(whatif::recorded_hour(engine, hour, range).await?);
        hour += chrono::Duration::hours(1);
    }
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        let mut replay = whatif::Replay::new(candidate.clone());
        let t = Instant::now();
        for r in &requests {
            replay.feed(r)?;
        }
        runs.push(t.elapsed().as_secs_f64());
        std::hint::black_box(replay.decisions());
    }
    let core = median(&runs);
    let (decisions, end_to_end, peak, error) = match &every_key {
        Ok((answer, peak)) => (
            Some(answer.decisions),
            Some(every_key_seconds),
            Some(mib(*peak)),
            None,
        ),
        Err(e) => (None, None, None, Some(e.to_string())),
    };
    println!(
        "{}",
        serde_json::json!({
            "bench": "query",
            "query": "what-if",
            "decisions": decisions,
            "end_to_end_seconds": end_to_end,
            "end_to_end_decisions_per_s": decisions.zip(end_to_end).map(|(d, s)| d as f64 / s),
            "peak_mib": peak,
            "error": error,
            "sampled_decisions": sampled.decisions,
            "sampled_seconds": sampled_seconds,
            "sampled_peak_mib": mib(sampled_peak),
            "sample": sampled.sample,
            // Against every key's, when it finished.
            "sampled_largest_error": every_key.is_ok().then_some(worst),
            "sampled_within_bounds": every_key.is_ok().then_some(within),
            "replay_seconds_p50": core,
            "replay_requests": requests.len(),
            "replay_decisions_per_s_per_core": requests.len() as f64 / core,
        })
    );
    if args.no_recommended {
        return Ok(());
    }
    // One what-if's time, which the search is measured against: every key's, or the
    // sampled one's where every key's did not finish.
    recommended(
        engine,
        range,
        end_to_end.unwrap_or(sampled_seconds),
        args.runs,
    )
    .await
}

/// Requests the decision core's replay is timed on, at most: the bench's 8.4 M week whole.
const REPLAY_CORE_REQUESTS: usize = 8_400_000;

/// `verdict what-if --recommended` over the same range: the review, the search that proves
/// each judged limit's recommendation with the replay, and the replay of the whole
/// recommendation; the search's time beside one what-if's (`end_to_end`).
async fn recommended(
    engine: &Engine,
    range: verdict_query::range::Range,
    end_to_end: f64,
    runs: u32,
) -> anyhow::Result<()> {
    use verdict_query::recommend;
    let params: BTreeMap<String, String> = [
        ("from".to_string(), range.from.to_rfc3339()),
        ("to".to_string(), range.to.to_rfc3339()),
    ]
    .into();
    let (mut totals, mut reviews) = (Vec::new(), Vec::new());
    let mut answer = None;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let sql = engine
            .report_sql("wrong-limits", &params, Form::Served)
            .await?;
        engine.collect(&sql, &RunOptions::default()).await?;
        reviews.push(started.elapsed().as_secs_f64());
        let started = Instant::now();
        answer = Some(recommend::replay(engine, &params, chrono::Utc::now(), 10).await?);
        totals.push(started.elapsed().as_secs_f64());
    }
    let answer = answer.expect("at least one run");
    let (total, review) = (median(&totals), median(&reviews));
    // What the proofs add: the whole, less the review and the final replay of the
    // recommendation (one what-if).
    let search = (total - review - end_to_end).max(0.0);
    println!(
        "{}",
        serde_json::json!({
            "bench": "query",
            "query": "what-if --recommended",
            "limits_judged": answer.proven.iter().filter(|p| p.replays > 0).count(),
            "replays_in_search": answer.proven.iter().map(|p| p.replays).sum::<u32>(),
            // Each judged limit's proof replays a sample of its keys past
            // `prove::SAMPLE_KEYS`: how many it replayed, and the smallest share.
            "proof_keys_replayed": answer.proven.iter().filter_map(|p| p.in_force).map(|r| r.keys).sum::<u64>(),
            "proof_requests_replayed": answer.proven.iter().filter_map(|p| p.in_force).map(|r| r.requests).sum::<u64>(),
            "proof_smallest_sample_rate": answer.proven.iter().filter(|p| p.replays > 0).map(|p| p.sample_rate).fold(1.0, f64::min),
            "seconds_p50": total,
            "review_seconds_p50": review,
            "one_what_if_seconds": end_to_end,
            "search_seconds": search,
            "search_over_one_what_if": search / end_to_end,
        })
    );
    Ok(())
}

/// Writes the spec for running the same SQL in DuckDB over the same files: views named as our
/// tables, the policy exported to one Parquet file. Returns the spec's path.
async fn duckdb_spec(
    engine: &Engine,
    root: &std::path::Path,
    queries: &[(String, &'static str, String)],
    threads: usize,
) -> anyhow::Result<std::path::PathBuf> {
    let export = |batch: arrow::record_batch::RecordBatch, name: &str| {
        let mut buf = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None)?;
        w.write(&batch)?;
        w.close()?;
        let path = root.join(name);
        std::fs::write(&path, buf)?;
        anyhow::Ok(path)
    };
    let policies_path = export(engine.policies().batch().await?, "bench-policies.parquet")?;
    let regions_path = export(
        engine.policies().regions_batch().await?,
        "bench-regions.parquet",
    )?;
    // DuckDB reads each table's snapshot: the files of its latest version, listed from the
    // Delta log, as an analyst's DuckDB reads the lake (a glob of the folder would also take
    // the log's checkpoints, and files removed or not committed).
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(root)?);
    let mut files = BTreeMap::new();
    let rounds = verdict_lake::tables::RECONCILE_ROUNDS.name;
    for def in verdict_lake::tables::ALL {
        // A lake whose gateways ran on static shares has no reconcile rounds table at all.
        if def.name == rounds && !root.join(def.root).join("_delta_log").is_dir() {
            continue;
        }
        let snapshot = def.table(Arc::clone(&store)).snapshot().await?;
        let list: Vec<String> = snapshot
            .files()
            .map(|a| {
                let path = root.join(def.root).join(&a.path);
                format!("'{}'", path.display().to_string().replace('\'', "''"))
            })
            .collect();
        // A lake whose gateways ran on static shares holds no reconcile rounds.
        if list.is_empty() && def.name == rounds {
            continue;
        }
        anyhow::ensure!(!list.is_empty(), "the {} table holds no files", def.name);
        files.insert(def.name, format!("[{}]", list.join(", ")));
    }
    // The review asks whether the reconcile ran in its range.
    let rounds_view = match files.get(rounds) {
        Some(list) => format!("SELECT * FROM read_parquet({list}, hive_partitioning = true, hive_types = {{'date': DATE}})"),
        None => "SELECT CAST(NULL AS DATE) AS date, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS round_time, \
                 CAST(NULL AS DOUBLE) AS floor WHERE false"
            .to_owned(),
    };
    let views = serde_json::json!({
        "decisions": format!("SELECT * FROM read_parquet({}, hive_partitioning = true, hive_types = {{'date': DATE, 'hour': INTEGER}})", files["raw"]),
        "denied_hourly": format!("SELECT *, CAST(hour AS DATE) AS date FROM read_parquet({}, hive_partitioning = false)", files["denied_hourly"]),
        "demand_hourly": format!("SELECT *, CAST(hour AS DATE) AS date FROM read_parquet({}, hive_partitioning = false)", files["demand_hourly"]),
        "overage": format!("SELECT * FROM read_parquet({}, hive_partitioning = false)", files["overage"]),
        "policies": format!("SELECT * FROM read_parquet('{}')", policies_path.display().to_string().replace('\'', "''")),
        "regions": format!("SELECT * FROM read_parquet('{}')", regions_path.display().to_string().replace('\'', "''")),
        "reconcile_rounds": rounds_view,
    });
    let spec = serde_json::json!({
        "threads": threads,
        "views": views,
        "queries": named(queries),
    });
    let spec_path = root.join("bench-query-duckdb.json");
    std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(spec_path)
}

/// A query of a spec, by name: what DuckDB's script and `bench query-peer` run.
#[derive(Debug, Serialize, Deserialize)]
struct NamedQuery {
    name: String,
    sql: String,
}

/// What `bench query-peer` reads.
#[derive(Debug, Serialize, Deserialize)]
struct PeerSpec {
    queries: Vec<NamedQuery>,
}

/// The bench's queries as a spec lists them.
fn named(queries: &[(String, &'static str, String)]) -> Vec<NamedQuery> {
    queries
        .iter()
        .map(|(name, _, sql)| NamedQuery {
            name: name.clone(),
            sql: sql.clone(),
        })
        .collect()
}

/// The engine over a lake `bench query` wrote, its policy in `policy.toml`, with the
/// service's default limits and spilling as `verdict query serve` does by default.
fn lake_engine(root: &std::path::Path, threads: usize) -> anyhow::Result<Engine> {
    let source: Arc<dyn PolicySource> = Arc::new(FileSource::new(root.join("policy.toml")));
    Ok(Engine::new(
        LocalFileSystem::new_with_prefix(root)?,
        PoliciesTable::new(Some(source)),
        threads,
        Limits::default(),
    )?
    .with_spill(&verdict_query::spill::Spill::default())?)
}

/// `verdict-bench query-peer`: runs the spec's query named on each line of standard input
/// and prints `{"seconds", "rows"}` (or `{"error"}`) on a line of its own.
pub async fn peer(args: QueryPeerArgs) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let spec: PeerSpec = serde_json::from_slice(
        &std::fs::read(&args.spec).with_context(|| format!("reading {}", args.spec.display()))?,
    )
    .with_context(|| {
        format!(
            "{} is not a spec of named queries ({{\"queries\": [{{\"name\", \"sql\"}}]}})",
            args.spec.display()
        )
    })?;
    let queries: BTreeMap<String, String> =
        spec.queries.into_iter().map(|q| (q.name, q.sql)).collect();
    let engine = lake_engine(&args.lake, usize::try_from(args.threads)?)?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let name = line?;
        let run = match queries.get(&name) {
            None => DuckDbRun {
                seconds: 0.0,
                rows: 0,
                error: Some(format!("no query named {name:?} in the spec")),
            },
            Some(sql) => {
                let t = Instant::now();
                match engine.collect(sql, &RunOptions::default()).await {
                    Ok(collected) => DuckDbRun {
                        seconds: t.elapsed().as_secs_f64(),
                        rows: collected.rows(),
                        error: None,
                    },
                    Err(e) => DuckDbRun {
                        seconds: 0.0,
                        rows: 0,
                        error: Some(e.to_string()),
                    },
                }
            }
        };
        writeln!(out, "{}", serde_json::to_string(&run)?)?;
        out.flush()?;
    }
    Ok(())
}

/// A process running one query whenever asked: DuckDB over the spec's views, or ours
/// without memory counting.
struct DuckDb {
    /// Who it is, in errors.
    who: &'static str,
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl DuckDb {
    fn start(compare: &super::shared::DuckDbArgs, spec: &std::path::Path) -> anyhow::Result<Self> {
        let child = compare.duckdb_session(&["--queries".as_ref(), spec.as_os_str()])?;
        Self::attach("DuckDB", child)
    }

    /// This binary's `bench query-peer` over `root` with `queries`, counting off.
    fn start_peer(
        root: &std::path::Path,
        queries: &[(String, &'static str, String)],
        threads: usize,
    ) -> anyhow::Result<Self> {
        let spec = PeerSpec {
            queries: named(queries),
        };
        let spec_path = root.join("bench-query-uncounted.json");
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
        let exe = std::env::current_exe().context("finding this program to start its peer")?;
        let child = std::process::Command::new(exe)
            .args(["query-peer", "--lake"])
            .arg(root)
            .arg("--spec")
            .arg(&spec_path)
            .args(["--threads", &threads.to_string()])
            .env(verdict_query::memory::SWITCH, "off")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the uncounted process (verdict-bench query-peer)")?;
        Self::attach("the uncounted process", child)
    }

    fn attach(who: &'static str, mut child: std::process::Child) -> anyhow::Result<Self> {
        let input = child
            .stdin
            .take()
            .with_context(|| format!("{who}'s standard input"))?;
        let output = child
            .stdout
            .take()
            .with_context(|| format!("{who}'s standard output"))?;
        Ok(Self {
            who,
            child,
            input,
            output: std::io::BufRead::lines(std::io::BufReader::new(output)),
        })
    }

    /// Runs the query `name` once.
    fn run(&mut self, name: &str) -> anyhow::Result<DuckDbRun> {
        use std::io::Write;
        let who = self.who;
        writeln!(self.input, "{name}").with_context(|| format!("asking {who} for a query"))?;
        self.input.flush()?;
        let line = match self.output.next() {
            Some(line) => line?,
            None => {
                anyhow::bail!("{who} stopped before answering query {name} (its errors are above)")
            }
        };
        let run: DuckDbRun = serde_json::from_str(&line)
            .with_context(|| format!("reading {who}'s answer {line:?}"))?;
        if let Some(e) = run.error {
            anyhow::bail!("{who} could not run query {name}: {e}");
        }
        Ok(run)
    }
}

impl Drop for DuckDb {
    fn drop(&mut self) {
        // The script is stopped and waited for, not left behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
