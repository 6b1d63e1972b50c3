//! `verdict-bench rollup`: one peak hour of raw data rolled up (the denied rollup and the
//! demand histogram), and in the same run the two tables' SQL over the same files in
//! DataFusion and in DuckDB.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;
use verdict_ingest::flush::{StoreCalls, flush_after_progress};
use verdict_ingest::{ConsumedEvent, KafkaSource, RawTable};
use verdict_rollup::{DEMAND_SQL, ROLLUP_SQL, Rollup, hour_files};
use verdict_schemas::HourPartition;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};

/// Options of `verdict-bench rollup`.
#[derive(Debug, Clone, Args)]
pub struct RollupBenchArgs {
    /// Events in the hour (the design's peak hour: 62,500,000).
    #[arg(long, default_value_t = 62_500_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Kafka partitions the events are spread over.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// Raw files per partition in the hour (ingest flushes every 60 s: 60).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    pub files_per_partition: u32,
    #[command(flatten)]
    pub compare: super::shared::DuckDbArgs,
}

#[derive(Debug, Serialize)]
struct RollupBenchReport {
    bench: &'static str,
    events: u64,
    files: usize,
    raw_bytes: u64,
    threads: usize,
    seconds: f64,
    events_per_s: f64,
    rollup_rows: usize,
    rollup_bytes: usize,
    demand_rows: usize,
    /// The fold alone (both tables' rows, nothing written).
    fold_seconds: f64,
    /// DataFusion running the two SQL definitions over the same files.
    datafusion_sql_seconds: f64,
    datafusion_rollup_sql_seconds: f64,
    datafusion_demand_sql_seconds: f64,
    vs_datafusion_sql: f64,
    /// DuckDB running the same two queries over the snapshot's files.
    duckdb_seconds: Option<f64>,
    duckdb_rollup_seconds: Option<f64>,
    duckdb_demand_seconds: Option<f64>,
    duckdb_version: Option<String>,
    vs_duckdb: Option<f64>,
}

#[derive(Debug, serde::Deserialize)]
struct DuckDbRun {
    seconds: f64,
    query_seconds: Vec<f64>,
    rows: Vec<usize>,
    duckdb: String,
}

/// Writes the hour, times both engines and prints one JSON line.
pub async fn run(args: RollupBenchArgs) -> anyhow::Result<()> {
    let threads = args.compare.threads();
    let (root, _tmp) = args.compare.lake()?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&root)?);
    let cfg = SynthConfig {
        late_share: 0.0,
        ..SynthConfig::hour(args.events, args.keys)
    };
    let hour = HourPartition::from_event_time_ms(cfg.start_ms)?;
    let started = Instant::now();
    let files = write_synth_hour(
        &store,
        hour,
        cfg,
        args.events,
        args.partitions as usize,
        args.files_per_partition as usize,
    )
    .await?;
    tracing::info!(
        files,
        seconds = started.elapsed().as_secs_f64(),
        "raw hour written"
    );

    let rollup = Rollup::new(Arc::clone(&store), threads);
    // A first run warms the OS cache (DuckDB gets one too); the best of two timed runs counts.
    let first = rollup.run_hour(hour).await?;
    let mut seconds = f64::INFINITY;
    for _ in 0..2 {
        let t = Instant::now();
        let again = rollup.run_hour(hour).await?;
        seconds = seconds.min(t.elapsed().as_secs_f64());
        // Each run replaces the hour with a file of its own: the same report but for its
        // path and commit, and the same bytes.
        let renamed = verdict_rollup::RollupReport {
            path: again.path.clone(),
            version: again.version,
            ..first.clone()
        };
        let (was, is) = (
            store.get(&first.path).await?.bytes().await?,
            store.get(&again.path).await?.bytes().await?,
        );
        anyhow::ensure!(
            again == renamed && was == is,
            "a re-run gave a different rollup: {first:?}, then {again:?}"
        );
    }

    // The SQL that defines each table, run by DataFusion over the same files: a baseline,
    // and a check at full size that the fold gives the same rows.
    let sources = hour_files(&store, &hour).await?;
    let t = Instant::now();
    let folded = rollup.compute(hour, &sources).await?;
    let fold_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (by_sql, _) = rollup.compute_sql(hour, &sources).await?;
    let rollup_sql_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let demand_by_sql = rollup.compute_demand_sql(hour, &sources).await?;
    let demand_sql_seconds = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        folded.denied == by_sql,
        "the rollup differs from DataFusion running ROLLUP_SQL ({} and {} rows)",
        folded.denied.num_rows(),
        by_sql.num_rows()
    );
    anyhow::ensure!(
        folded.demand == demand_by_sql,
        "the demand histogram differs from DataFusion running DEMAND_SQL ({} and {} rows)",
        folded.demand.num_rows(),
        demand_by_sql.num_rows()
    );

    // DuckDB runs both definitions, one after the other, over the snapshot's files: the
    // work the rollup job does for an hour.
    let duck = if args.compare.no_duckdb {
        None
    } else {
        let sql = root.join("rollup.sql");
        std::fs::write(&sql, format!("{ROLLUP_SQL};\n{DEMAND_SQL};\n"))?;
        let list = root.join("rollup-files.txt");
        let paths: Vec<String> = sources
            .files
            .iter()
            .map(|f| root.join(f.meta.location.as_ref()).display().to_string())
            .collect();
        std::fs::write(&list, paths.join("\n"))?;
        let files_arg = format!("@{}", list.display());
        let threads = threads.to_string();
        let out = args
            .compare
            .duckdb(&[sql.as_os_str(), files_arg.as_ref(), threads.as_ref()])?;
        let run: DuckDbRun = serde_json::from_str(out.trim())
            .with_context(|| format!("reading DuckDB's answer {out:?}"))?;
        anyhow::ensure!(
            run.rows == [first.rows, first.demand_rows] && run.query_seconds.len() == 2,
            "DuckDB found {:?} rollup and histogram rows, verdict {} and {}",
            run.rows,
            first.rows,
            first.demand_rows
        );
        Some(run)
    };

    let report = RollupBenchReport {
        bench: "rollup",
        events: first.events,
        files,
        raw_bytes: first.source_bytes,
        threads,
        seconds,
        events_per_s: first.events as f64 / seconds,
        rollup_rows: first.rows,
        rollup_bytes: first.bytes,
        demand_rows: first.demand_rows,
        fold_seconds,
        datafusion_sql_seconds: rollup_sql_seconds + demand_sql_seconds,
        datafusion_rollup_sql_seconds: rollup_sql_seconds,
        datafusion_demand_sql_seconds: demand_sql_seconds,
        vs_datafusion_sql: seconds / (rollup_sql_seconds + demand_sql_seconds),
        duckdb_seconds: duck.as_ref().map(|d| d.seconds),
        duckdb_rollup_seconds: duck.as_ref().map(|d| d.query_seconds[0]),
        duckdb_demand_seconds: duck.as_ref().map(|d| d.query_seconds[1]),
        duckdb_version: duck.as_ref().map(|d| d.duckdb.clone()),
        vs_duckdb: duck.as_ref().map(|d| seconds / d.seconds),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Generates `events` decisions of `hour` and writes them the way ingest does: round-robin
/// over `partitions`, each partition's events cut into `files_per_partition` files of
/// consecutive offsets. Returns the number of files.
pub async fn write_synth_hour(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    cfg: SynthConfig,
    events: u64,
    partitions: usize,
    files_per_partition: usize,
) -> anyhow::Result<usize> {
    let partitions = partitions.max(1);
    let per_file = (events as usize)
        .div_ceil(partitions * files_per_partition.max(1))
        .max(1);
    let mut open: BTreeMap<i32, (i64, Vec<ConsumedEvent>)> = BTreeMap::new();
    let mut raw = RawTable::open(Arc::clone(store)).await?;
    let mut files = 0;
    let events = SynthTraffic::new(cfg)
        .take(events as usize)
        .filter(|e| HourPartition::from_event_time_ms(e.event_time_ms).is_ok_and(|h| h == hour));
    for (i, event) in events.enumerate() {
        let partition = (i % partitions) as i32;
        let (next, buf) = open.entry(partition).or_default();
        buf.push(ConsumedEvent {
            event,
            partition,
            offset: *next,
        });
        *next += 1;
        if buf.len() >= per_file {
            let chunk = std::mem::take(buf);
            files += flush(&mut raw, partition, chunk).await?;
        }
    }
    for (partition, (_, buf)) in open {
        if !buf.is_empty() {
            files += flush(&mut raw, partition, buf).await?;
        }
    }
    Ok(files)
}

/// One flush of `events` of the bench's `partition` (the ingest worker's write path, after
/// what the partition holds already): the raw files it wrote.
async fn flush(
    raw: &mut RawTable,
    partition: i32,
    events: Vec<ConsumedEvent>,
) -> anyhow::Result<usize> {
    let source = KafkaSource::new("bench", "decisions", partition);
    let report = flush_after_progress(raw, &source, events, &StoreCalls::default()).await?;
    Ok(report.files)
}
