//! `verdict jobs`: the scheduled jobs over the lake, on a schedule (`run`) or once (`once`,
//! for cron).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use verdict_jobs::windows::DAY;
use verdict_jobs::{Job, Jobs, JobsConfig, Windows};

use crate::policy_args::PolicyArgs;
use crate::store_args::StoreArgs;

/// `verdict jobs …`.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Run every job now, then the rollup (with late data) every --rollup-every-secs and
    /// compaction, overage and retention every --daily-every-secs, until SIGTERM or Ctrl-C.
    Run(JobsRunArgs),
    /// Run one job once and exit: rollup, compact, overage or retention.
    Once(JobsOnceArgs),
    /// Every --interval-secs, recompute each region's share of the global limits of the
    /// keys near them, from every region's Redis, into the policy store (until SIGTERM or
    /// Ctrl-C; with --once, one round).
    Reconcile(ReconcileArgs),
}

/// Options of `verdict jobs reconcile`.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// A region and its Redis, as NAME=URL (the name as in the policy's regions), once per
    /// region, e.g. --region eu-central-1=redis://10.1.0.5:6379.
    #[arg(long = "region", value_name = "NAME=URL", required = true, value_parser = parse_region)]
    pub regions: Vec<(String, String)>,
    /// The PostgreSQL policy store: the global limits and regions are read from it, the
    /// shares written to it.
    #[arg(long, env = "VERDICT_POLICY_POSTGRES")]
    pub policy_postgres: String,
    /// The lake, where each round is recorded (`reconcile_rounds`) so that a what-if over a
    /// range replays the shares as they moved.
    #[command(flatten)]
    pub lake: StoreArgs,
    /// Rounds recorded per append to the lake (rounds also go in when the job stops).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub record_every_rounds: u64,
    /// Between rounds (also how far back a round looks for keys near their limit).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_secs: u64,
    /// A share that grows takes effect this long after its round (at least two of the
    /// gateways' share polls, so that the shares that shrank are in force first).
    #[arg(long, default_value_t = 12)]
    pub increase_delay_secs: u64,
    /// A region not read for this long starts returning to its static weight …
    #[arg(long, default_value_t = 90)]
    pub stale_after_secs: u64,
    /// … over this long.
    #[arg(long, default_value_t = 300)]
    pub decay_secs: u64,
    /// Part of the static weight every region keeps when shares follow demand (0 to 1).
    #[arg(long, default_value_t = 0.1)]
    pub floor: f64,
    /// Run one round, print what it did, and exit.
    #[arg(long)]
    pub once: bool,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address.
    #[arg(long, env = "VERDICT_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

fn parse_region(s: &str) -> Result<(String, String), String> {
    let (name, url) = s.split_once('=').ok_or_else(|| {
        format!("{s:?}: expected NAME=URL, e.g. eu-central-1=redis://10.1.0.5:6379")
    })?;
    if name.is_empty() || !(url.starts_with("redis://") || url.starts_with("redis-cluster://")) {
        return Err(format!(
            "{s:?}: expected NAME=URL with a redis:// or redis-cluster:// URL"
        ));
    }
    Ok((name.to_owned(), url.to_owned()))
}

async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    use verdict_limiter::PolicySource;
    use verdict_policy_store::PgSource;
    use verdict_reconcile::region_counters::RegionCounters;
    use verdict_reconcile::round_log::RoundLog;
    use verdict_reconcile::share_rounds::ShareRounds;
    use verdict_reconcile::{ReconcileConfig, Reconciler, RegionEndpoint};

    anyhow::ensure!(
        (0.0..=1.0).contains(&args.floor),
        "--floor must be 0 to 1, got {}",
        args.floor
    );
    let source = PgSource::new(&args.policy_postgres);
    source.migrate().await?;
    let policy: Arc<dyn PolicySource> = Arc::new(source);
    let snapshot = policy.load().await?;
    let known: Vec<&str> = snapshot
        .document()
        .regions
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    let cfg = ReconcileConfig {
        interval: Duration::from_secs(args.interval_secs),
        increase_delay: Duration::from_secs(args.increase_delay_secs),
        stale_after: Duration::from_secs(args.stale_after_secs),
        decay: Duration::from_secs(args.decay_secs),
        floor: args.floor,
        ..ReconcileConfig::default()
    };
    let mut endpoints = Vec::new();
    for (name, url) in &args.regions {
        let row = snapshot
            .document()
            .regions
            .iter()
            .find(|r| &r.name == name)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--region {name}: the policy has no such region (it has: {known:?})"
                )
            })?;
        endpoints.push(RegionEndpoint {
            id: verdict_schemas::RegionId(row.id),
            counters: RegionCounters::new(url, cfg.redis_timeout)?,
        });
    }
    let missing: Vec<&str> = known
        .iter()
        .filter(|k| !args.regions.iter().any(|(n, _)| n == *k))
        .copied()
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "the policy's regions {missing:?} were not given with --region: every region's Redis is needed (a region left out would keep its static weight on top of the shares the others get)"
    );
    let log = RoundLog::new(args.lake.open()?, args.record_every_rounds as usize);
    let mut job = Reconciler::new(
        endpoints,
        policy,
        ShareRounds::new(&args.policy_postgres),
        cfg,
    )
    .with_log(log);
    if args.once {
        let now = chrono::Utc::now().timestamp_millis();
        let o = job.run_once(now).await?;
        job.append_rounds(now).await?;
        println!(
            "reconcile: {} keys near their limit, {} share rows written, regions read {:?}, not reachable {:?}",
            o.keys,
            o.rows,
            o.reachable.iter().map(|r| r.0).collect::<Vec<_>>(),
            o.unreachable.iter().map(|r| r.0).collect::<Vec<_>>()
        );
        return Ok(());
    }
    if let Some(addr) = args.metrics_addr {
        let metrics = job.metrics().clone();
        crate::serve::serve_metrics(addr, move || metrics.render()).await?;
    }
    let shutdown = crate::signals::shutdown_signal()?;
    job.run(shutdown).await;
    tracing::info!("reconcile stopped");
    Ok(())
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
    /// Compact a raw hour into one file once it has this many files (all its Kafka
    /// partitions' together).
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
    /// The query service's levels, stored by the schedule.
    #[command(flatten)]
    pub levels: JobsLevelsArgs,
}

/// `verdict jobs run --levels`: the reports' first levels stored after each round.
#[derive(Debug, Clone, Args)]
pub struct JobsLevelsArgs {
    /// After each round of jobs (the rollup's, and the daily one), store the reports'
    /// first levels of the closed days that are missing or stale, as `verdict query
    /// levels` does, so that the query services read a day's part instead of computing it
    /// from the day's decisions. Needs the policy they read (--policy-file or
    /// --policy-postgres). Counted as the job `levels` in the jobs' metrics.
    #[arg(long)]
    pub levels: bool,
    /// The policy the query services read (the stored levels are kept for it); read only
    /// with --levels.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Memory one day's levels may take, MiB (a day past it is computed in blocks of hours
    /// and folded; see `verdict query levels`).
    #[arg(long, default_value_t = 1024)]
    pub levels_memory_mib: usize,
    /// Time one day's levels may take, seconds.
    #[arg(long, default_value_t = 900)]
    pub levels_timeout_s: u64,
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

/// What a run of `job` did, in the tables' words.
fn said(job: Job, o: &verdict_jobs::JobOutcome, dry_run: bool) -> String {
    let (remove, vacuum) = if dry_run {
        ("would remove", "vacuum would delete")
    } else {
        ("removed", "vacuum deleted")
    };
    match job {
        Job::Rollup | Job::Overage => format!(
            "{job}: wrote {} partition(s), {} bytes",
            o.written, o.bytes_written
        ),
        Job::Compact => format!(
            "compact: wrote {} file(s), {} bytes; {remove} {} file(s), {} bytes, from the raw table and the rollup's final days (in the store until vacuum deletes them)",
            o.written, o.bytes_written, o.removed, o.bytes_removed
        ),
        Job::Retention => format!(
            "retention: {remove} {} expired partition(s), {} bytes; {vacuum} {} file(s), {} bytes, from the store",
            o.removed, o.bytes_removed, o.vacuumed, o.bytes_vacuumed
        ),
    }
}

/// Runs a jobs command.
pub async fn run(cmd: JobsCommand) -> anyhow::Result<()> {
    match cmd {
        JobsCommand::Reconcile(args) => reconcile(args).await,
        JobsCommand::Once(args) => {
            anyhow::ensure!(
                !args.dry_run || args.job == Job::Retention,
                "--dry-run applies to the retention job only"
            );
            let jobs = Jobs::new(args.common.lake.open()?, args.common.config());
            let now = args.now.unwrap_or_else(chrono::Utc::now).timestamp_millis();
            let o = jobs
                .run_once(args.job, now, args.dry_run)
                .await
                .with_context(|| {
                    format!(
                        "the {} job on the lake {}",
                        args.job.name(),
                        args.common.lake.store
                    )
                })?;
            println!("{}", said(args.job, &o, args.dry_run));
            Ok(())
        }
        JobsCommand::Run(args) => {
            let shutdown = crate::signals::shutdown_signal()?;
            let cfg = JobsConfig {
                rollup_every: Duration::from_secs(args.rollup_every_secs),
                daily_every: Duration::from_secs(args.daily_every_secs),
                ..args.common.config()
            };
            let lake = args.common.lake.open()?;
            let jobs = Jobs::new(Arc::clone(&lake), cfg);
            let levels = if args.levels.levels {
                Some(
                    crate::query::levels_engine(
                        &args.common.lake,
                        &args.levels.policy,
                        args.levels.levels_memory_mib,
                        Duration::from_secs(args.levels.levels_timeout_s.max(1)),
                        args.common.threads,
                    )
                    .await?,
                )
            } else {
                None
            };
            if let Some(addr) = args.metrics_addr {
                let metrics = jobs.metrics().clone();
                crate::serve::serve_metrics(addr, move || metrics.render()).await?;
            }
            let store = args.common.lake.store.as_str();
            let after_round = || async {
                let Some(engine) = &levels else { return };
                let started = std::time::Instant::now();
                let done = crate::query::store_levels(engine, Arc::clone(&lake), store).await;
                if let Err(e) = &done {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "the levels were not stored; the next round tries again"
                    );
                }
                jobs.metrics().run.record_run(
                    "levels",
                    started.elapsed(),
                    done.is_ok(),
                    chrono::Utc::now().timestamp_millis(),
                );
            };
            jobs.run_forever_then(shutdown, after_round).await;
            tracing::info!("jobs stopped");
            Ok(())
        }
    }
}
