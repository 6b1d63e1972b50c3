//! The hourly rollup job, late data included: every closed hour of the raw table (within
//! the raw window) whose rollup is missing, or was computed from other raw files than the
//! raw table holds for it now (late events arrived, or the hour was compacted), is rolled
//! up again. Comparing the hour's files in the raw table's snapshot with the fingerprint in
//! the rollup's footer catches files committed at any time, including during the previous
//! rollup's run.

use std::sync::Arc;

use verdict_lake::tables::RAW;
use verdict_rollup::{Rollup, RollupError, RollupReport, hour_files_in, hours_in};
use verdict_schemas::HourPartition;

use crate::windows::Windows;

/// Why an hour is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// It has never been rolled up.
    NeverRolledUp,
    /// Its raw files changed since it was rolled up.
    Changed {
        /// The fingerprint the rollup was computed from.
        was: String,
        /// The fingerprint of the folder now.
        now: String,
    },
}

/// An hour to roll up, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueHour {
    /// The hour.
    pub hour: HourPartition,
    /// Why.
    pub why: Why,
}

/// The closed hours within the raw window whose rollup is missing or stale, oldest first.
pub async fn due_hours(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<DueHour>, RollupError> {
    let snapshot = match RAW.table(Arc::clone(rollup.store())).snapshot().await {
        Ok(s) => s,
        Err(verdict_lake::LakeError::NotATable { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut due = Vec::new();
    for hour in hours_in(&snapshot) {
        if !windows.is_workable(&hour, now_ms) {
            continue;
        }
        let now = hour_files_in(&snapshot, &hour).fingerprint();
        let why = match rollup.state(hour).await? {
            None => Why::NeverRolledUp,
            Some(s) if s.fingerprint != now => Why::Changed {
                was: s.fingerprint,
                now,
            },
            Some(_) => continue,
        };
        due.push(DueHour { hour, why });
    }
    Ok(due)
}

/// Rolls up every due hour; returns what each rollup did.
pub async fn run(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<RollupReport>, RollupError> {
    let mut reports = Vec::new();
    for d in due_hours(rollup, now_ms, windows).await? {
        match &d.why {
            Why::NeverRolledUp => tracing::info!(hour = %d.hour, "rolling up a closed hour"),
            Why::Changed { was, now } => tracing::info!(
                hour = %d.hour, %was, %now,
                "raw files changed since the rollup (late data or compaction): rolling up again"
            ),
        }
        reports.push(rollup.run_hour(d.hour).await?);
    }
    Ok(reports)
}
