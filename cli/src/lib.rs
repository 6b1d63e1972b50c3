//! The `verdict` command line: one binary whose subcommands run each part of the system.
//! Each subcommand's options are a clap struct here; the work lives in the crates. The
//! benchmarks and the tests' fault injection are another binary, `verdict-bench`
//! (`bench/`), which is not installed where the product runs.

pub mod demo;
pub mod gateway;
pub mod ingest;
pub mod jobs;
pub mod policy;
pub mod policy_args;
pub mod query;
pub mod redis_args;
pub mod rollup;
pub mod serve;
pub mod signals;
pub mod store_args;

use clap::{Parser, Subcommand};

/// verdict: a distributed rate limiter, and the pipeline and analytics that remember every
/// decision it makes.
#[derive(Debug, Parser)]
#[command(name = "verdict", version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the embedded default on this machine, no services needed: the gateway with memory
    /// counters and a file policy in front of a built-in upstream, an hour of realistic API
    /// traffic sent through it over HTTP in a minute (the limiter's clock runs 60x faster),
    /// every decision on an in-process queue in its 64-byte wire form and into the raw table
    /// (Parquet, production layout) in a local folder; then the hourly rollup and the
    /// `wrong-limits` and `shadow-impact` reports. Shows progress; about a minute.
    Demo(demo::DemoArgs),
    /// Run the gateway: an HTTP reverse proxy that asks the limiter about every request
    /// and proxies it to the upstream (with the rate-limit fields) or answers 429, until
    /// SIGTERM or Ctrl-C.
    Gateway(gateway::GatewayArgs),
    /// The operator's commands on the policy store: show it, set a tier's mode, raise or
    /// lower a limit, the kill switch.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Consume decision events from Kafka and write the raw table (one member of the
    /// ingest consumer group; stops cleanly on SIGTERM or Ctrl-C).
    Ingest(ingest::IngestArgs),
    /// Roll up one closed hour of the raw table into the denied-only hourly rollup
    /// (`--hour`), or backfill a range of hours (`--from`, `--to`). Re-running an hour
    /// replaces its rollup whole.
    Rollup(rollup::RollupArgs),
    /// The scheduled jobs over the lake: the rollup of closed hours (and of hours late
    /// data changed), compaction, the daily overage table, retention.
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// The query service: SQL and the named reports over the lake, by HTTP and the
    /// PostgreSQL wire protocol.
    #[command(subcommand)]
    Query(query::QueryCommand),
    /// Run one read-only SQL query (or a named report with --report) over the lake and
    /// print the rows.
    Sql(query::SqlArgs),
    /// Replay the recorded requests of a range under a candidate policy, through the
    /// limiter's own decision core, and say per tier × route class what it would have
    /// refused beside what was refused: shadow mode run offline on history.
    WhatIf(query::WhatIfArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    // 8 MiB stacks for the workers (tokio's default is 2 MiB): query plans and expressions
    // are trees, and an analyst's long expression should be answered, not abort the process.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()?;
    match cli.command {
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        Command::Gateway(args) => runtime.block_on(gateway::run(args)),
        Command::Ingest(args) => runtime.block_on(ingest::run(args)),
        Command::Policy(cmd) => runtime.block_on(policy::run(cmd)),
        Command::Rollup(args) => runtime.block_on(rollup::run(args)),
        Command::Jobs(cmd) => runtime.block_on(jobs::run(cmd)),
        Command::Query(cmd) => runtime.block_on(query::run(cmd)),
        Command::Sql(args) => runtime.block_on(query::sql(args)),
        Command::WhatIf(args) => runtime.block_on(query::what_if(args)),
    }
}

/// Logs to stderr; `RUST_LOG` chooses the level (default `info`). Colours only on a
/// terminal: a log written to a file or read by a supervisor stays plain text.
pub fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
