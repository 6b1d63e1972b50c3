//! `verdict jobs`: the scheduled jobs over the lake, on a schedule (`run`) or once (`once`,
//! for cron).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Subcommand};
use verdict_jobs::windows::DAY;
use verdict_jobs::{Job, Jobs, JobsConfig, Windows};

use crate::store_args::StoreArgs;

/// `verdict jobs …`.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Run every job now, then the rollup (with late data) every --rollup-every-secs and
    /// compaction, overage and retention every --daily-every-secs, until SIGTERM or Ctrl-C.
    Run(JobsRunArgs),
    /// Run one job once and exit: rollup, compact, overage or retention.
    Once(JobsOnceArgs),
}

/// What every job needs.
#[derive(Debug, Clone, Args)]
pub struct JobsCommonArgs {
    /// The lake.
    #[command(flatten)]
    pub lake: StoreArgs,
    /// Raw hours (and quarantine days) are deleted once they ended this many days ago.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..))]
    pub raw_keep_days: u64,
    /// Rollup hours and overage days are deleted once they ended this many days ago
    /// (5 years).
    #[arg(long, default_value_t = 1826, value_parser = clap::value_parser!(u64).range(1..))]
    pub rollup_keep_days: u64,
    /// An hour is rolled up and compacted once it ended this many seconds ago.
    #[arg(long, default_value_t = 600)]
    pub lateness_secs: u64,
    /// Compact a Kafka partition's files in an hour once there are this many.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    pub compact_min_files: u64,
    /// Threads for the queries [default: the machine's cores].
    #[arg(long)]
    pub threads: Option<usize>,
}

impl JobsCommonArgs {
    fn config(&self) -> JobsConfig {
        let defaults = JobsConfig::default();
        JobsConfig {
            windows: Windows {
                raw_keep: DAY * self.raw_keep_days as u32,
                rollup_keep: DAY * self.rollup_keep_days as u32,
                lateness: Duration::from_secs(self.lateness_secs),
            },
            compact_min_files: self.compact_min_files as usize,
            threads: self.threads.unwrap_or(defaults.threads),
            ..defaults
        }
    }
}

/// Options of `verdict jobs run`.
#[derive(Debug, Clone, Args)]
pub struct JobsRunArgs {
    /// What every job needs.
    #[command(flatten)]
    pub common: JobsCommonArgs,
    /// How often the rollup looks for closed hours to roll up (new ones and late data).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub rollup_every_secs: u64,
    /// How often compaction, overage and retention run.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub daily_every_secs: u64,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address.
    #[arg(long, env = "VERDICT_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// Options of `verdict jobs once`.
#[derive(Debug, Clone, Args)]
pub struct JobsOnceArgs {
    /// The job: rollup, compact, overage or retention.
    pub job: Job,
    /// What every job needs.
    #[command(flatten)]
    pub common: JobsCommonArgs,
    /// Retention only: list what would be deleted, and how many bytes, without deleting.
    #[arg(long)]
    pub dry_run: bool,
    /// Run as if it were this time (RFC 3339, e.g. 2026-12-01T00:00:00Z) [default: now].
    #[arg(long)]
    pub now: Option<chrono::DateTime<chrono::Utc>>,
}

/// Runs a jobs command.
pub async fn run(cmd: JobsCommand) -> anyhow::Result<()> {
    match cmd {
        JobsCommand::Once(args) => {
            anyhow::ensure!(
                !args.dry_run || args.job == Job::Retention,
                "--dry-run applies to the retention job only"
            );
            let jobs = Jobs::new(args.common.lake.open()?, args.common.config());
            let now = args.now.unwrap_or_else(chrono::Utc::now).timestamp_millis();
            let o = jobs.run_once(args.job, now, args.dry_run).await?;
            let verb = if args.dry_run {
                "would delete"
            } else {
                "deleted"
            };
            println!(
                "{}: wrote {} ({} bytes), {verb} {} ({} bytes)",
                args.job, o.written, o.bytes_written, o.deleted, o.bytes_deleted
            );
            Ok(())
        }
        JobsCommand::Run(args) => {
            let shutdown = crate::signals::shutdown_signal()?;
            let cfg = JobsConfig {
                rollup_every: Duration::from_secs(args.rollup_every_secs),
                daily_every: Duration::from_secs(args.daily_every_secs),
                ..args.common.config()
            };
            let jobs = Jobs::new(args.common.lake.open()?, cfg);
            if let Some(addr) = args.metrics_addr {
                let metrics = jobs.metrics().clone();
                crate::serve::serve_metrics(addr, move || metrics.render()).await?;
            }
            jobs.run_forever(shutdown).await;
            tracing::info!("jobs stopped");
            Ok(())
        }
    }
}
