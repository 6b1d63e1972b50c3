//! `verdict bench …`: measurements that print JSON, against the real services where the
//! measured path uses them. Speed is measured here, never in tests.

pub mod limiter;

use clap::Subcommand;

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Decisions per second and their latency against the real Redis, from simulated
    /// gateway instances; accuracy (worst key's allowed ÷ limit) and Redis memory per limit
    /// key; redis-benchmark's EVALSHA ceiling from the same run.
    Limiter(limiter::LimiterBenchArgs),
}

/// Runs one bench.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Limiter(args) => limiter::run(args).await,
    }
}
