//! The scheduled jobs that keep storage bounded and the history true.
//!
//! - [`late`]: the hourly rollup of closed hours, and the re-rollup of hours whose raw
//!   files changed since (late data, compaction);
//! - [`compact`]: small raw files of closed hours merged into one per Kafka partition,
//!   without a reader ever counting a row twice or missing one; [`compact_days`]: the
//!   rollup's hourly files of a final day (past the raw window) merged into one;
//! - [`overage`]: the daily table pricing reads, recomputed when a day's rollups change;
//! - [`retention`]: whole partitions deleted past their window (raw 7 days, rollups and
//!   overage 5 years), with a dry run;
//! - [`scheduler`]: running them once or on a schedule, with [`metrics`], each on a [`Lake`].
//!
//! Every job takes "now" as a parameter, so tests run them on a fake clock. The regional
//! reconcile, a job over Redis and PostgreSQL rather than the lake, is its own crate,
//! `verdict-reconcile`.

pub mod compact;
pub mod compact_days;
pub mod error;
pub mod lake;
pub mod late;
pub mod metrics;
pub mod overage;
pub mod partitions;
pub mod retention;
pub mod scheduler;
pub mod windows;

pub use error::MaintenanceError;
pub use lake::Lake;
pub use scheduler::{Job, JobError, JobOutcome, Jobs, JobsConfig};
pub use windows::Windows;
