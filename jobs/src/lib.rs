//! The scheduled jobs that keep storage bounded and the history true.
//!
//! - [`late`]: the hourly rollup of closed hours, and the re-rollup of hours whose raw
//!   files changed since (late data, compaction);
//! - [`compact`]: small raw files of closed hours merged into one per Kafka partition,
//!   without a reader ever counting a row twice or missing one;
//! - [`overage`]: the daily table pricing reads, recomputed when a day's rollups change;
//! - [`retention`]: whole partitions deleted past their window (raw 7 days, rollups and
//!   overage 5 years), with a dry run;
//! - [`scheduler`]: running them once or on a schedule, with [`metrics`].
//!
//! Every job takes "now" as a parameter, so tests run them on a fake clock. The regional
//! reconcile, a job over Redis and PostgreSQL rather than the lake, is its own crate,
//! `verdict-reconcile`.

pub mod compact;
pub mod error;
pub mod late;
pub mod metrics;
pub mod overage;
pub mod partitions;
pub mod retention;
pub mod scheduler;
pub mod windows;

pub use error::MaintenanceError;
pub use scheduler::{Job, JobError, JobOutcome, Jobs, JobsConfig};
pub use windows::Windows;

use std::sync::Arc;

use object_store::ObjectStore;
use verdict_lake::Clock;

/// The lake a maintenance job works on, as of `now_ms`: its store, the clock its commits
/// are stamped by, and how long each table keeps its partitions.
#[derive(Clone, Copy)]
pub struct Lake<'a> {
    /// The lake's object store.
    pub store: &'a Arc<dyn ObjectStore>,
    /// What the jobs' commits are stamped with.
    pub clock: &'a Clock,
    /// Each table's window.
    pub windows: &'a Windows,
    /// The job's "now" (Unix ms), which the windows are counted back from.
    pub now_ms: i64,
}
