//! The jobs' Prometheus metrics, in a registry of their own (`verdict jobs run
//! --metrics-addr` serves it), and what every job records of its runs ([`RunMetrics`]).

use prometheus::{
    HistogramVec, IntCounterVec, IntGaugeVec, Registry, TextEncoder,
    register_histogram_vec_with_registry, register_int_counter_vec_with_registry,
    register_int_gauge_vec_with_registry,
};

/// What every job records of its runs, labelled by job: when it last succeeded, how long
/// its runs take, how many ended each way. The lake's jobs and the regional reconcile
/// (`verdict-reconcile`) each keep one, in their own registry.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    /// The registry holding them (and whatever else the job registers there).
    pub registry: Registry,
    /// `verdict_job_last_success_timestamp_seconds{job}`.
    pub last_success: IntGaugeVec,
    /// `verdict_job_duration_seconds{job}`.
    pub duration: HistogramVec,
    /// `verdict_job_runs_total{job, outcome}`: `ok` or `failed`.
    pub runs: IntCounterVec,
}

/// Registering a constant name in a fresh registry cannot fail.
pub const VALID: &str = "a valid, unique metric";

impl Default for RunMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RunMetrics {
    /// Creates and registers them in a new registry.
    pub fn new() -> Self {
        let r = Registry::new();
        Self {
            last_success: register_int_gauge_vec_with_registry!(
                "verdict_job_last_success_timestamp_seconds",
                "When the job last finished without error (Unix seconds).",
                &["job"],
                r
            )
            .expect(VALID),
            duration: register_histogram_vec_with_registry!(
                "verdict_job_duration_seconds",
                "How long a run of the job took.",
                &["job"],
                vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0],
                r
            )
            .expect(VALID),
            runs: register_int_counter_vec_with_registry!(
                "verdict_job_runs_total",
                "Runs of the job, by outcome (ok, failed).",
                &["job", "outcome"],
                r
            )
            .expect(VALID),
            registry: r,
        }
    }

    /// Records one run of `job`: its duration, its outcome and, when it succeeded, the
    /// time it ended, `at_ms` (Unix ms, by the job's clock).
    pub fn record_run(&self, job: &str, took: std::time::Duration, ok: bool, at_ms: i64) {
        self.duration
            .with_label_values(&[job])
            .observe(took.as_secs_f64());
        self.runs
            .with_label_values(&[job, if ok { "ok" } else { "failed" }])
            .inc();
        if ok {
            self.last_success
                .with_label_values(&[job])
                .set(at_ms.div_euclid(1000));
        }
    }

    /// Every metric of the registry in Prometheus's text format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// Every metric the lake's jobs export, labelled by job.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    /// Their runs (and the registry the others are in).
    pub run: RunMetrics,
    /// `verdict_job_partitions_written_total{job}`.
    pub partitions_written: IntCounterVec,
    /// `verdict_job_removed_total{job}`: partitions (retention) or files (compaction)
    /// taken out of the tables.
    pub removed: IntCounterVec,
    /// `verdict_job_bytes_written_total{job}`.
    pub bytes_written: IntCounterVec,
    /// `verdict_job_bytes_removed_total{job}`.
    pub bytes_removed: IntCounterVec,
    /// `verdict_job_files_vacuumed_total{job}`: files vacuum deleted from the store.
    pub vacuumed: IntCounterVec,
    /// `verdict_job_bytes_vacuumed_total{job}`.
    pub bytes_vacuumed: IntCounterVec,
}

impl Default for JobMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl JobMetrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let run = RunMetrics::new();
        let r = &run.registry;
        let by_job = |name: &str, help: &str| {
            register_int_counter_vec_with_registry!(name, help, &["job"], r).expect(VALID)
        };
        Self {
            partitions_written: by_job(
                "verdict_job_partitions_written_total",
                "Partitions (or files) the job wrote.",
            ),
            removed: by_job(
                "verdict_job_removed_total",
                "Partitions (retention) or files (compaction) the job took out of its tables; their files stay in the store until vacuum deletes them.",
            ),
            bytes_written: by_job("verdict_job_bytes_written_total", "Bytes the job wrote."),
            bytes_removed: by_job(
                "verdict_job_bytes_removed_total",
                "Bytes the job took out of its tables.",
            ),
            vacuumed: by_job(
                "verdict_job_files_vacuumed_total",
                "Files vacuum deleted from the store.",
            ),
            bytes_vacuumed: by_job(
                "verdict_job_bytes_vacuumed_total",
                "Bytes vacuum deleted from the store.",
            ),
            run,
        }
    }

    /// See [`RunMetrics::record_run`].
    pub fn record_run(&self, job: &str, took: std::time::Duration, ok: bool, at_ms: i64) {
        self.run.record_run(job, took, ok, at_ms);
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        self.run.render()
    }
}
