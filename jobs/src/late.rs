//! The hourly rollup job, late data included. The rollup tables record, in a `txn` of
//! application [`ROLLUP_APP_ID`], the raw table's version the job last rolled up to; the
//! raw commits after it name the hours that changed (their `add`s with `dataChange`: a
//! flush, late events included, and not a compaction, which only rewrites rows). An hour is
//! due when it is closed and still in the raw window, and has no rollup yet or changed
//! since. Every due hour is rolled up from one raw snapshot and the lot is committed with
//! the job's new progress, so an hour committed to raw during a run is seen by the next.

use std::collections::BTreeMap;
use std::sync::Arc;

use verdict_lake::tables::{DEMAND_HOURLY, DENIED_HOURLY, RAW};
use verdict_lake::{Snapshot, Table};
use verdict_rollup::{
    Progress, ROLLUP_APP_ID, Rollup, RollupError, RollupReport, hour_dir, hour_files_in, hour_of,
    hours_in,
};
use verdict_schemas::HourPartition;

use crate::windows::Windows;

/// Why an hour is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// It has never been rolled up.
    NeverRolledUp,
    /// Raw commits since the last run added files to it (late data).
    Changed {
        /// The files they added.
        files: usize,
    },
    /// The job has no progress recorded yet, or the raw log no longer holds every commit
    /// since it: every workable hour is rolled up again.
    Unknown,
}

/// An hour to roll up, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueHour {
    /// The hour.
    pub hour: HourPartition,
    /// Why.
    pub why: Why,
}

/// What a run works from.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The raw table's snapshot the due hours are read from.
    pub raw: Snapshot,
    /// The due hours, oldest first.
    pub due: Vec<DueHour>,
    /// The progress the run's commit carries.
    pub progress: Progress,
}

/// The changed partitions' keys (`key_of` of each `add`) in `table`'s commits after
/// `since` up to `to`, with the files each gained; `None` when there is no progress yet or
/// the log no longer holds those commits.
pub async fn changed_since<K: Ord>(
    table: &Table,
    since: Option<i64>,
    to: i64,
    key_of: impl Fn(&verdict_lake::Add) -> Option<K>,
) -> Result<Option<BTreeMap<K, usize>>, verdict_lake::LakeError> {
    let Some(since) = since else {
        return Ok(None);
    };
    let Some(adds) = table.changes(Some(since), to).await? else {
        return Ok(None);
    };
    let mut out = BTreeMap::new();
    for add in &adds {
        if let Some(k) = key_of(add) {
            *out.entry(k).or_insert(0) += 1;
        }
    }
    Ok(Some(out))
}

/// The closed hours within the raw window whose rollup is missing or stale, and the raw
/// snapshot and progress a run commits with; `None` before the raw table's first commit.
pub async fn plan(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Option<Plan>, RollupError> {
    let store = Arc::clone(rollup.store());
    let raw_table = RAW.table(Arc::clone(&store));
    let Some(raw) = raw_table.snapshot_if_any().await? else {
        return Ok(None);
    };
    let denied = DENIED_HOURLY
        .table(Arc::clone(&store))
        .snapshot_if_any()
        .await?;
    let demand = DEMAND_HOURLY.table(store).snapshot_if_any().await?;
    let progress_of = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.txn_version(ROLLUP_APP_ID));
    let (denied_expected, demand_expected) = (progress_of(&denied), progress_of(&demand));
    let since = denied_expected.zip(demand_expected).map(|(a, b)| a.min(b));
    let changed = changed_since(&raw_table, since, raw.version(), hour_of).await?;
    let has = |s: &Option<Snapshot>, h: &HourPartition| {
        s.as_ref()
            .is_some_and(|s| s.files_under(&hour_dir(h)).next().is_some())
    };
    let mut due = Vec::new();
    let mut held_back = false;
    for hour in hours_in(&raw) {
        let rolled_up = has(&denied, &hour) && has(&demand, &hour);
        let why = match &changed {
            _ if !rolled_up => Why::NeverRolledUp,
            None => Why::Unknown,
            Some(c) => match c.get(&hour) {
                Some(&files) => Why::Changed { files },
                None => continue,
            },
        };
        if windows.is_workable(&hour, now_ms) {
            due.push(DueHour { hour, why });
        } else if rolled_up && why != Why::Unknown {
            // Rolled up on demand before it closed, and changed since: the progress stays
            // where it is until the hour is rolled up again.
            held_back = true;
        }
    }
    let raw_version = if held_back {
        since.unwrap_or(-1)
    } else {
        raw.version()
    };
    Ok(Some(Plan {
        due,
        progress: Progress {
            raw_version,
            denied_expected,
            demand_expected,
        },
        raw,
    }))
}

/// The closed hours within the raw window whose rollup is missing or stale, oldest first.
pub async fn due_hours(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<DueHour>, RollupError> {
    Ok(plan(rollup, now_ms, windows)
        .await?
        .map(|p| p.due)
        .unwrap_or_default())
}

/// How often a run starts over when another run committed first.
const ATTEMPTS: usize = 3;

/// Runs `job` again (up to [`ATTEMPTS`] times in all) while its commit meets another
/// run's (another scheduler's): the next attempt plans afresh, usually finding nothing
/// left to do, and the files the failed attempt wrote are left to vacuum.
pub(crate) async fn again_on_conflict<T, Fut>(
    job: &str,
    mut attempt_once: impl FnMut() -> Fut,
) -> Result<T, RollupError>
where
    Fut: std::future::Future<Output = Result<T, RollupError>>,
{
    let mut attempt = 1;
    loop {
        match attempt_once().await {
            Err(RollupError::Lake(e @ verdict_lake::LakeError::Conflict { .. }))
                if attempt < ATTEMPTS =>
            {
                tracing::info!(job, error = %e, attempt, "another run committed first: looking again at what is due");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Rolls up every due hour and commits them with the job's progress; returns what each
/// rollup did. When another run commits first (another scheduler), this one looks again
/// at what is due then, up to three attempts in all.
pub async fn run(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<RollupReport>, RollupError> {
    again_on_conflict("rollup", || run_plan(rollup, now_ms, windows)).await
}

async fn run_plan(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<RollupReport>, RollupError> {
    let Some(plan) = plan(rollup, now_ms, windows).await? else {
        // A lake in the making (no flush committed yet), or a store that is not the lake:
        // either way the operator is told, every run, rather than shown nothing to do.
        tracing::warn!(
            table = RAW.root,
            "no raw table in this store (no raw/_delta_log/): nothing to roll up until the ingest workers' first flush creates it; if they have flushed, the jobs are pointed at another store than theirs"
        );
        return Ok(Vec::new());
    };
    // Nothing due: no commit (the progress moves with the next hour rolled up).
    if plan.due.is_empty() {
        return Ok(Vec::new());
    }
    let mut written = Vec::with_capacity(plan.due.len());
    for d in &plan.due {
        match &d.why {
            Why::NeverRolledUp => tracing::info!(hour = %d.hour, "rolling up a closed hour"),
            Why::Changed { files } => tracing::info!(
                hour = %d.hour, files,
                "raw files were committed to the hour since the last rollup (late data): rolling up again"
            ),
            Why::Unknown => tracing::info!(
                hour = %d.hour,
                "no record of the raw commits since the last rollup: rolling up again"
            ),
        }
        let files = hour_files_in(&plan.raw, &d.hour);
        written.push(rollup.write_hour(d.hour, &files).await?);
    }
    rollup.commit_hours(written, Some(plan.progress)).await
}
