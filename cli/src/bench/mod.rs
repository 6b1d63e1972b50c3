//! `verdict bench …`: measurements that print JSON, against the real services where the
//! measured path uses them. Speed is measured here, never in tests.

pub mod ingest;
pub mod limiter;

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
}

/// Runs one bench.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Limiter(args) => limiter::run(args).await,
        BenchCommand::Ingest(args) => ingest::run(args).await,
    }
}
