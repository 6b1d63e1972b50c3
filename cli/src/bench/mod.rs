//! `verdict bench …`: measurements that print JSON, against the real services where the
//! measured path uses them. Speed is measured here, never in tests.

pub mod ingest;
pub mod limiter;
pub mod rollup;

use clap::Subcommand;

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Decisions per second and their latency against the real Redis, from simulated
    /// gateway instances; accuracy (worst key's allowed ÷ limit) and Redis memory per limit
    /// key; redis-benchmark's EVALSHA ceiling from the same run.
    Limiter(limiter::LimiterBenchArgs),
    /// The raw table's write path: decode, split, sort, encode and write on one thread
    /// (write_path), and with --kafka through the real broker and S3 server (kafka_s3);
    /// prints one JSON object per mode with events/s, CPU cores used and Parquet bytes
    /// per event.
    Ingest(ingest::IngestBenchArgs),
    /// One peak hour of raw data (62.5 M events by default) rolled up by DataFusion, and
    /// the same SQL over the same files in DuckDB (from PyPI) in the same run; prints
    /// events/s, rollup rows and bytes, and vs_duckdb (ours ÷ DuckDB's time).
    Rollup(rollup::RollupBenchArgs),
}

/// Runs one bench.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Limiter(args) => limiter::run(args).await,
        BenchCommand::Ingest(args) => ingest::run(args).await,
        BenchCommand::Rollup(args) => rollup::run(args).await,
    }
}
