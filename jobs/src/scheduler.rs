//! Running the jobs: once (`verdict jobs once <job>`, for cron) or on a schedule
//! (`verdict jobs run`): the rollup (with late data) every `rollup_every`, compaction,
//! overage and retention every `daily_every`. Every job is idempotent: the rollup and the
//! overage are deterministic and replace whole objects, compaction writes the same file
//! from the same inputs and tolerates inputs another run already deleted, retention's
//! deletes tolerate objects already gone. Two schedulers over one lake therefore do some
//! work twice, and no harm.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use verdict_lake::Clock;
use verdict_rollup::Rollup;

use crate::lake::Lake;
use crate::metrics::JobMetrics;
use crate::windows::Windows;
use crate::{compact, compact_days, late, overage, retention};

/// A job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// Roll up closed hours that have no rollup or whose raw files changed (late data).
    Rollup,
    /// Merge the small raw files of closed hours.
    Compact,
    /// Compute the overage of closed days whose rollups changed.
    Overage,
    /// Delete partitions past their window.
    Retention,
}

impl Job {
    /// Every job, in the order a scheduler runs them.
    pub const ALL: [Job; 4] = [Job::Compact, Job::Rollup, Job::Overage, Job::Retention];

    /// The job's name, as the CLI and the metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            Job::Rollup => "rollup",
            Job::Compact => "compact",
            Job::Overage => "overage",
            Job::Retention => "retention",
        }
    }
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Job {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Job::ALL
            .into_iter()
            .find(|j| j.name() == s)
            .ok_or_else(|| format!("unknown job {s:?}: one of rollup, compact, overage, retention"))
    }
}

/// What one run of a job did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobOutcome {
    /// Partitions or files written.
    pub written: usize,
    /// Bytes written.
    pub bytes_written: u64,
    /// Taken out of the tables (in a dry run: that would be): compaction's input files,
    /// retention's expired partitions. A table's files stay in the store, for the queries
    /// reading an older snapshot, until vacuum deletes them (the quarantine's are deleted
    /// at once).
    pub removed: usize,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Files vacuum deleted from the store (in a dry run: would delete).
    pub vacuumed: usize,
    /// Their bytes.
    pub bytes_vacuumed: u64,
}

impl JobOutcome {
    /// A job that wrote `written` partitions, `bytes_written` bytes in all.
    fn wrote(written: usize, bytes_written: u64) -> Self {
        Self {
            written,
            bytes_written,
            ..Self::default()
        }
    }
}

/// Why a job failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// The rollup or overage query, or the store under it.
    #[error(transparent)]
    Rollup(#[from] verdict_rollup::RollupError),
    /// Compaction or retention.
    #[error(transparent)]
    Maintenance(#[from] crate::error::MaintenanceError),
    /// The store.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The lake has no raw table (or it could not be read): every job works from it, so a
    /// lake the ingest workers never wrote is refused rather than done with as empty.
    #[error("{0} (is this the lake the ingest workers write?)")]
    NoRawTable(verdict_lake::LakeError),
}

/// How the jobs run.
#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// Retention windows and lateness.
    pub windows: Windows,
    /// Compact a raw hour into one file once it has this many files (all its Kafka
    /// partitions' together).
    pub compact_min_files: usize,
    /// How often the rollup job looks for due hours.
    pub rollup_every: Duration,
    /// How often compaction, overage and retention run.
    pub daily_every: Duration,
    /// Threads for the queries.
    pub threads: usize,
    /// The time: the schedule's "now", and what the jobs' files and commits are stamped with.
    pub clock: Clock,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            windows: Windows::default(),
            compact_min_files: 4,
            rollup_every: Duration::from_secs(10 * 60),
            daily_every: Duration::from_secs(24 * 3600),
            threads: std::thread::available_parallelism().map_or(2, usize::from),
            clock: Arc::new(verdict_schemas::SystemClock),
        }
    }
}

/// The jobs over one lake.
#[derive(Clone)]
pub struct Jobs {
    rollup: Rollup,
    store: Arc<dyn ObjectStore>,
    cfg: JobsConfig,
    metrics: JobMetrics,
}

impl Jobs {
    /// Jobs over `store`.
    pub fn new(store: Arc<dyn ObjectStore>, cfg: JobsConfig) -> Self {
        Self {
            rollup: Rollup::new(Arc::clone(&store), cfg.threads).with_clock(Arc::clone(&cfg.clock)),
            store,
            cfg,
            metrics: JobMetrics::new(),
        }
    }

    /// The metrics (shared with clones).
    pub fn metrics(&self) -> &JobMetrics {
        &self.metrics
    }

    /// Runs one job as of `now_ms` (Unix ms; tests pass a fake clock), logging what it
    /// did and recording it in the metrics. `dry_run` only changes retention, which then
    /// only reports what it would delete.
    pub async fn run_once(
        &self,
        job: Job,
        now_ms: i64,
        dry_run: bool,
    ) -> Result<JobOutcome, JobError> {
        let started = Instant::now();
        let result = self.dispatch(job, now_ms, dry_run).await;
        let took = started.elapsed();
        let name = job.name();
        self.metrics
            .record_run(name, took, result.is_ok(), self.cfg.clock.now_ms());
        match &result {
            Ok(o) => {
                if !dry_run {
                    let m = &self.metrics;
                    for (counter, by) in [
                        (&m.partitions_written, o.written as u64),
                        (&m.bytes_written, o.bytes_written),
                        (&m.removed, o.removed as u64),
                        (&m.bytes_removed, o.bytes_removed),
                        (&m.vacuumed, o.vacuumed as u64),
                        (&m.bytes_vacuumed, o.bytes_vacuumed),
                    ] {
                        counter.with_label_values(&[name]).inc_by(by);
                    }
                }
                let seconds = took.as_secs_f64();
                tracing::info!(job = name, dry_run, outcome = ?o, seconds, "job finished");
            }
            Err(e) => {
                tracing::error!(job = name, error = %e, seconds = took.as_secs_f64(), "job failed");
            }
        }
        result
    }

    async fn dispatch(&self, job: Job, now_ms: i64, dry_run: bool) -> Result<JobOutcome, JobError> {
        // Only whether the log exists: each job reads the snapshot it works on.
        verdict_lake::tables::RAW
            .table(Arc::clone(&self.store))
            .check_exists()
            .await
            .map_err(JobError::NoRawTable)?;
        let w = &self.cfg.windows;
        let lake = Lake {
            store: &self.store,
            clock: &self.cfg.clock,
            windows: w,
            now_ms,
        };
        Ok(match job {
            Job::Rollup => {
                let reports = late::run(&self.rollup, now_ms, w).await?;
                JobOutcome::wrote(reports.len(), reports.iter().map(|r| r.bytes as u64).sum())
            }
            Job::Compact => {
                let mut done = compact::run(lake, self.cfg.compact_min_files)
                    .await?
                    .compacted;
                done.extend(compact_days::run(lake).await?.compacted);
                JobOutcome {
                    written: done.len(),
                    bytes_written: done.iter().map(|c| c.bytes_out as u64).sum(),
                    removed: done.iter().map(|c| c.inputs).sum::<usize>(),
                    bytes_removed: done.iter().map(|c| c.bytes_in).sum(),
                    ..JobOutcome::default()
                }
            }
            Job::Overage => {
                let reports = overage::run(&self.rollup, now_ms, w).await?;
                JobOutcome::wrote(reports.len(), reports.iter().map(|r| r.bytes as u64).sum())
            }
            Job::Retention => {
                let r = retention::run(lake, dry_run).await?;
                JobOutcome {
                    removed: r.expired.len(),
                    bytes_removed: r.expired.iter().map(|e| e.bytes).sum(),
                    vacuumed: r.vacuumed,
                    bytes_vacuumed: r.vacuumed_bytes,
                    ..JobOutcome::default()
                }
            }
        })
    }

    /// Runs every job now, then the rollup every `rollup_every` and the others every
    /// `daily_every`, until `shutdown` resolves. A failed run is logged and counted; the
    /// schedule goes on.
    pub async fn run_forever(&self, shutdown: impl std::future::Future<Output = ()>) {
        self.run_forever_then(shutdown, || async {}).await;
    }

    /// [`Self::run_forever`], with `after_round` run after each round of jobs, in turn with
    /// them, never beside them (`verdict jobs run --levels` stores the query service's
    /// levels of the closed days there, once the rollup and compaction have changed what
    /// they will).
    pub async fn run_forever_then<F, Fut>(
        &self,
        shutdown: impl std::future::Future<Output = ()>,
        mut after_round: F,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        let mut rollup_tick = tokio::time::interval(self.cfg.rollup_every);
        let mut daily_tick = tokio::time::interval(self.cfg.daily_every);
        rollup_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        daily_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // In this order when several are ready: both ticks are at start, and a round
            // of the rollup alone first would leave the compaction for the next round,
            // after the work after the round (the levels stored for files the compaction
            // then replaces). A round of every job includes the rollup, so its tick starts
            // again from there.
            let jobs: &[Job] = tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = daily_tick.tick() => {
                    rollup_tick.reset();
                    &Job::ALL
                }
                _ = rollup_tick.tick() => &[Job::Rollup],
            };
            for job in jobs {
                let now = self.cfg.clock.now_ms();
                // The outcome is logged and counted by run_once.
                let _ = self.run_once(*job, now, false).await;
            }
            tokio::select! {
                _ = &mut shutdown => return,
                () = after_round() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use object_store::local::LocalFileSystem;
    use object_store::path::Path;
    use object_store::{ObjectStoreExt, PutPayload};
    use verdict_lake::tables::{RAW, hour_partition};
    use verdict_lake::{Action, Add, Commit};
    use verdict_schemas::synth::{SynthConfig, SynthTraffic};
    use verdict_schemas::{HourPartition, RawBatchBuilder};

    use super::*;

    #[test]
    fn job_names_parse_back_and_unknown_ones_are_refused() {
        for job in Job::ALL {
            assert_eq!(job.name().parse::<Job>(), Ok(job));
        }
        let err = "vacuum".parse::<Job>().unwrap_err();
        assert!(err.contains("rollup, compact, overage, retention"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_schedule_runs_every_job_at_start_and_the_rollup_again_each_round_then_the_work_after_it()
     {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        // An hour that ended two hours ago: closed, inside the raw window.
        let now = chrono::Utc::now().timestamp_millis();
        let hour = HourPartition::from_event_time_ms(now - 3 * 3_600_000).unwrap();
        let cfg = SynthConfig {
            start_ms: hour.start_ms(),
            late_share: 0.0,
            ..SynthConfig::hour(5_000, 100)
        };
        // One raw file of the hour, committed as any writer of the table commits one.
        let mut rows = RawBatchBuilder::with_capacity(5_000);
        for (offset, event) in SynthTraffic::new(cfg)
            .take(5_000)
            .filter(|e| HourPartition::from_event_time_ms(e.event_time_ms) == Ok(hour))
            .enumerate()
        {
            rows.push(&event, "local", 0, offset as i64);
        }
        let batch = rows.finish().unwrap();
        let bytes = verdict_lake::files::encode_raw_parquet(std::slice::from_ref(&batch)).unwrap();
        let path = format!("{}/part-0.parquet", hour.partition_path());
        store
            .put(
                &Path::from(format!("{}/{path}", RAW.root)),
                PutPayload::from(bytes.clone()),
            )
            .await
            .unwrap();
        let stats = verdict_lake::stats::file_stats(&[batch], &["date", "hour"]);
        let add = Add::new(path, hour_partition(&hour), bytes.len() as i64, now).with_stats(stats);
        let (table, mut snapshot) = RAW.open(Arc::clone(&store)).await.unwrap();
        table
            .commit(&mut snapshot, Commit::new("WRITE", vec![Action::Add(add)]))
            .await
            .unwrap();

        let jobs = Jobs::new(
            Arc::clone(&store),
            JobsConfig {
                rollup_every: Duration::from_millis(50),
                daily_every: Duration::from_secs(3600),
                threads: 2,
                ..JobsConfig::default()
            },
        );
        let metrics = jobs.metrics().clone();
        let runs = |job: &str| metrics.run.runs.with_label_values(&[job, "ok"]).get();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // The jobs that had run when the work after the first round began.
        let first_round = Arc::new(std::sync::Mutex::new(None));
        let task = tokio::spawn({
            let (jobs, rounds, first_round) =
                (jobs.clone(), Arc::clone(&rounds), Arc::clone(&first_round));
            let metrics = metrics.clone();
            async move {
                let stop = async {
                    let _ = stopped.await;
                };
                jobs.run_forever_then(stop, || {
                    let rounds = Arc::clone(&rounds);
                    let mut first = first_round.lock().unwrap();
                    if first.is_none() {
                        *first = Some(
                            Job::ALL
                                .iter()
                                .filter(|job| {
                                    metrics
                                        .run
                                        .runs
                                        .with_label_values(&[job.name(), "ok"])
                                        .get()
                                        > 0
                                })
                                .count(),
                        );
                    }
                    async move {
                        rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
                .await
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while runs("rollup") < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the rollup did not repeat"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send(()).unwrap();
        task.await.unwrap();
        // Every round has the rollup and ends with the work after it (the last one may have
        // been stopped between the two).
        assert_eq!(
            *first_round.lock().unwrap(),
            Some(Job::ALL.len()),
            "the first round runs every job, whichever tick tokio sees first"
        );
        let after = rounds.load(std::sync::atomic::Ordering::Relaxed);
        let rolled = runs("rollup");
        assert!(
            after == rolled || after + 1 == rolled,
            "{after} runs of the work after a round, {rolled} rounds"
        );

        for job in Job::ALL {
            assert!(runs(job.name()) >= 1, "{job} never ran");
            assert!(
                metrics
                    .run
                    .last_success
                    .with_label_values(&[job.name()])
                    .get()
                    > 0,
                "{job} has no last success"
            );
        }
        assert_eq!(
            runs("retention"),
            1,
            "a daily job ran more than once in 50 ms ticks"
        );
        assert!(
            jobs.rollup.state(hour).await.unwrap().is_some(),
            "the closed hour was not rolled up"
        );
        assert_eq!(
            metrics
                .partitions_written
                .with_label_values(&["rollup"])
                .get(),
            1,
            "later rollup runs found the hour already done"
        );
    }
}
