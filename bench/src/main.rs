//! `verdict-bench`: the harness beside the product, a binary of its own so that the one
//! operators install (`verdict`) carries none of it. The measurements print JSON, against
//! the real services where the measured path uses them (speed is measured here, never in
//! tests); the peers they start (nginx, Envoy, envoyproxy/ratelimit, DuckDB, headless Chromium) are launched from here;
//! and `ingest-with-faults` is `verdict ingest` with the crash tests' fault injection.

mod envoy;
mod gateway;
mod ingest;
mod ingest_faults;
mod limiter;
mod log;
mod nginx;
mod page;
mod query;
mod rollup;
mod shared;
mod soak;

use clap::{Parser, Subcommand};

/// As in `verdict`: mimalloc, each block counted against the query it was made for
/// (`verdict_query::memory`), so that `query` measures what the service would.
#[global_allocator]
static ALLOCATOR: verdict_query::memory::Counted<mimalloc::MiMalloc> =
    verdict_query::memory::Counted::new(mimalloc::MiMalloc);

/// verdict-bench: the benchmarks of verdict, and the crash tests' fault injection. Not the
/// product: `verdict` is.
#[derive(Debug, Parser)]
#[command(name = "verdict-bench", version, about, long_about = None)]
struct Cli {
    /// What to run.
    #[command(subcommand)]
    command: BenchCommand,
}

/// What to measure.
#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Decisions per second and their latency against the real Redis, from simulated
    /// gateway instances; accuracy (worst key's allowed ÷ limit) and Redis memory per limit
    /// key; redis-benchmark's EVALSHA ceiling from the same run.
    Limiter(limiter::LimiterBenchArgs),
    /// The raw table's write path: decode, split, sort, encode and write on one thread
    /// (write_path), and with --kafka through the real broker and S3 server (kafka_s3);
    /// prints one JSON object per mode with events/s, CPU cores used and Parquet bytes
    /// per event.
    Ingest(ingest::IngestBenchArgs),
    /// The raw table's Delta log after simulated days of ingest (12 partitions flushing once
    /// a minute, hourly compaction, daily retention), on a local folder: prints one JSON
    /// object per day with the log's files and bytes, the newest checkpoint's size and the
    /// time a reader takes to load the latest snapshot.
    Log(log::LogBenchArgs),
    /// One peak hour of raw data (62.5 M events by default) rolled up, and in the same run
    /// the rollup's SQL over the same files in DataFusion and in DuckDB (from PyPI); prints
    /// events/s, rollup rows and bytes, vs_datafusion_sql and vs_duckdb (ours ÷ theirs).
    Rollup(rollup::RollupBenchArgs),
    /// Days of raw decisions and a month of rollups and overage (scaled down; flags to
    /// scale), then every named report and a few ad-hoc queries, each timed in DataFusion
    /// and in DuckDB (from PyPI) on the same files with the same SQL; prints one JSON line
    /// per query with p50_ms, rows_scanned, rows and vs_duckdb (ours ÷ DuckDB's time), for
    /// each report its served form too (its first levels kept in parts, as the query
    /// service answers: served_first_ms computing them, served_p50_ms finding them kept,
    /// served_vs_duckdb), and the same queries in a process of ours with memory counting
    /// off, in turns with ours: uncounted_p50_ms and vs_uncounted (what the counting
    /// costs). A statement ours cannot answer (past its memory limit, say) is reported in
    /// `error` and the bench goes on.
    Query(query::QueryBenchArgs),
    /// The engine of `bench query` in a process of its own, over a lake `bench query`
    /// wrote: it runs a query of the spec whenever its name comes on standard input and
    /// prints one JSON line. `bench query` starts it with memory counting off, to time the
    /// counting's cost beside its own runs.
    #[command(hide = true)]
    QueryPeer(query::QueryPeerArgs),
    /// HTTP load through the gateway (memory counters, or --redis) to a trivial upstream,
    /// and the same load straight to the upstream in the same run, alternating round by
    /// round: requests/s closed loop, then the p50/p99 the gateway adds at a paced rate;
    /// prints one JSON object.
    Gateway(gateway::GatewayBenchArgs),
    /// HTTP load through one Envoy 1.40 on three listeners: without a rate limit filter,
    /// asking envoyproxy/ratelimit, and asking verdict's rate limit service (both counting
    /// in one Redis under one configuration), alternating round by round: requests/s closed
    /// loop, then the p50/p99 each service adds to Envoy alone at a paced rate; prints one
    /// JSON object.
    Envoy(envoy::EnvoyBenchArgs),
    /// The decision path for minutes under faults: three `verdict gateway` processes on
    /// the Redis Cluster, Kafka, PostgreSQL and an ingest worker, paced at 2,000 requests/s
    /// each, while a seeded schedule kills and pauses Redis masters, slows and hangs
    /// PostgreSQL, stops Kafka and restarts a gateway; prints one JSON object with each
    /// window's answers and latency, per key-hour allowed ÷ limit, and every event
    /// accounted for against the raw table.
    Soak(soak::SoakArgs),
    /// The analysts' page (`verdict query serve`'s `/`) loaded in headless Chromium from a
    /// running service, a fresh tab per run: prints one JSON object with the time from
    /// asking for the page to every view drawn (ready_ms) and the views' own (views_ms).
    Page(page::PageBenchArgs),
    /// `verdict ingest` with fault injection, for the crash tests: every put to the store
    /// held a while, or the worker held right after each commit to the raw table's log
    /// (before its offsets go to Kafka), so a test can kill or stop it in that window.
    IngestWithFaults(ingest_faults::IngestWithFaultsArgs),
}

fn main() -> std::process::ExitCode {
    verdict::init_logging();
    let cli = Cli::parse();
    // 8 MiB stacks for the workers, as `verdict` has them.
    let ran = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(cli.command)));
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verdict-bench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs one command.
async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::IngestWithFaults(args) => ingest_faults::run(args).await,
        BenchCommand::Limiter(args) => limiter::run(args).await,
        BenchCommand::Ingest(args) => ingest::run(args).await,
        BenchCommand::Log(args) => log::run(args).await,
        BenchCommand::Rollup(args) => rollup::run(args).await,
        BenchCommand::Query(args) => query::run(args).await,
        BenchCommand::QueryPeer(args) => query::peer(args).await,
        BenchCommand::Gateway(args) => gateway::run(args).await,
        BenchCommand::Envoy(args) => envoy::run(args).await,
        BenchCommand::Page(args) => page::run(args).await,
        BenchCommand::Soak(args) => soak::run(args).await,
    }
}
