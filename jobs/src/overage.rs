//! The daily overage table for pricing: per key, tier and route class per UTC day, the
//! requests refused because the hourly quota was spent, enforced and in shadow mode, with
//! the quota in force. A Delta table partitioned by `date`, computed from the day's
//! `denied_hourly` files into one file per day, replaced in one commit. The table records,
//! in a `txn` of application [`OVERAGE_APP_ID`], the `denied_hourly` version the job last
//! computed from; the rollup commits after it name the days that changed.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::Date32Array;
use chrono::NaiveDate;
use object_store::path::Path;
use verdict_lake::log::data_path;
use verdict_lake::tables::{DENIED_HOURLY, OVERAGE, date_partition};
use verdict_lake::{Add, Snapshot};
use verdict_rollup::{Rollup, RollupError, conform};
use verdict_schemas::tables::{OVERAGE_SCHEMA_VERSION, denied_hourly_schema, overage_schema};

use crate::late::{again_on_conflict, changed_since};
use crate::windows::{DAY, Windows, day_start_ms, ms};

/// The overage of the table `denied_hourly` (one day of it). Enforced quota refusals are
/// the window's refusals minus its would-be ones.
pub const OVERAGE_SQL: &str = "\
SELECT key_id, tier, route_class,
  SUM(denied_by_window - would_deny_by_window) AS quota_denied,
  SUM(would_deny_by_window) AS quota_would_deny,
  MAX(window_quota) AS window_quota,
  MAX(policy_version) AS policy_version
FROM denied_hourly
GROUP BY key_id, tier, route_class
HAVING SUM(denied_by_window) > 0
ORDER BY key_id, tier, route_class";

/// The `txn` application of the overage job in the `overage` table: its version is the
/// `denied_hourly` version the job has computed from.
pub const OVERAGE_APP_ID: &str = "verdict-overage:denied_hourly";

/// The start of an overage file's name inside its day folder.
pub const OVERAGE_FILE: &str = "overage";

/// `add` tag: the `denied_hourly` version the day was computed from.
pub const TAG_DENIED_VERSION: &str = "verdict.deniedHourlyVersion";
/// `add` tag: the overage schema version.
pub const TAG_SCHEMA_VERSION: &str = "verdict.overageSchemaVersion";

/// What computing one day did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverageReport {
    /// The day.
    pub date: NaiveDate,
    /// Rollup hours read.
    pub hours: usize,
    /// Rows written.
    pub rows: usize,
    /// Bytes written.
    pub bytes: usize,
    /// Where.
    pub path: Path,
    /// The `overage` version whose commit put the day in.
    pub version: Option<i64>,
}

/// The folder of a day's files in the tables partitioned by `date`, with its trailing `/`.
pub fn day_dir(date: NaiveDate) -> String {
    format!("date={}/", date.format("%Y-%m-%d"))
}

/// The day of an `add` in a table partitioned by `date`.
pub fn date_of(add: &Add) -> Option<NaiveDate> {
    let value = add.partition_values.get("date")?.as_deref()?;
    NaiveDate::parse_from_str(value, "%Y-%m-%d").ok()
}

/// Computes the overage of `date` from `denied` (a snapshot of `denied_hourly`) and
/// writes its file, uncommitted.
async fn write_day(
    rollup: &Rollup,
    denied: Option<&Snapshot>,
    date: NaiveDate,
) -> Result<(OverageReport, Add), RollupError> {
    let dir = day_dir(date);
    let root = Path::from(DENIED_HOURLY.root);
    let files: Vec<Path> = denied
        .map(|s| {
            s.files_under(&dir)
                .map(|a| data_path(&root, &a.path))
                .collect()
        })
        .unwrap_or_default();
    let schema = overage_schema();
    // Date32 counts days since 1970-01-01.
    let days = i32::try_from((date - NaiveDate::default()).num_days()).unwrap_or(i32::MAX);
    let batch = if files.is_empty() {
        arrow::array::RecordBatch::new_empty(Arc::clone(&schema))
    } else {
        let paths: Vec<&Path> = files.iter().collect();
        let ctx = rollup
            .session_over("denied_hourly", &paths, &denied_hourly_schema())
            .await?;
        let batches = ctx.sql(OVERAGE_SQL).await?.collect().await?;
        conform(&schema, &batches, |rows| {
            Arc::new(Date32Array::from(vec![days; rows]))
        })?
    };
    let tags = [
        (
            TAG_DENIED_VERSION,
            denied.map_or(-1, Snapshot::version).to_string(),
        ),
        (TAG_SCHEMA_VERSION, OVERAGE_SCHEMA_VERSION.to_string()),
    ];
    let now = rollup.clock().now_ms();
    let add = rollup
        .put_file(
            &OVERAGE,
            &dir,
            OVERAGE_FILE,
            &batch,
            &tags,
            &date_partition(date),
            now,
        )
        .await?;
    let report = OverageReport {
        date,
        hours: files.len(),
        rows: batch.num_rows(),
        bytes: usize::try_from(add.size).unwrap_or(0),
        path: data_path(&Path::from(OVERAGE.root), &add.path),
        version: None,
    };
    Ok((report, add))
}

/// Commits days written by [`write_day`], with the job's progress if given.
async fn commit_days(
    rollup: &Rollup,
    days: Vec<(OverageReport, Add)>,
    txn: Option<(Option<i64>, i64)>,
) -> Result<Vec<OverageReport>, RollupError> {
    let files = days
        .iter()
        .map(|(r, add)| (day_dir(r.date), add.clone()))
        .collect();
    let version = OVERAGE
        .replace(rollup.store(), rollup.clock(), OVERAGE_APP_ID, files, txn)
        .await?;
    Ok(days
        .into_iter()
        .map(|(mut r, _)| {
            r.version = Some(version);
            tracing::info!(date = %r.date, hours = r.hours, rows = r.rows, bytes = r.bytes, version, "overage committed");
            r
        })
        .collect())
}

/// Computes the overage of `date` from the day's rollups now and replaces it (the job's
/// progress is left as it is: this is the on-demand run).
pub async fn run_day(rollup: &Rollup, date: NaiveDate) -> Result<OverageReport, RollupError> {
    let denied = DENIED_HOURLY
        .table(Arc::clone(rollup.store()))
        .snapshot_if_any()
        .await?;
    let day = write_day(rollup, denied.as_ref(), date).await?;
    Ok(commit_days(rollup, vec![day], None).await?.remove(0))
}

/// What a run works from: the due days, the rollup snapshot and the progress to commit.
struct Plan {
    due: Vec<NaiveDate>,
    denied: Option<Snapshot>,
    expected: Option<i64>,
    version: i64,
}

async fn plan(rollup: &Rollup, now_ms: i64, windows: &Windows) -> Result<Plan, RollupError> {
    let store = Arc::clone(rollup.store());
    let denied_table = DENIED_HOURLY.table(Arc::clone(&store));
    let denied = denied_table.snapshot_if_any().await?;
    let overage = OVERAGE.table(store).snapshot_if_any().await?;
    let expected = overage.as_ref().and_then(|s| s.txn_version(OVERAGE_APP_ID));
    let Some(d) = &denied else {
        return Ok(Plan {
            due: Vec::new(),
            denied,
            expected,
            version: expected.unwrap_or(-1),
        });
    };
    let changed = changed_since(&denied_table, expected, d.version(), date_of).await?;
    let days: BTreeSet<NaiveDate> = d.files().filter_map(date_of).collect();
    let mut due = Vec::new();
    let mut held_back = false;
    for date in days {
        let computed = overage
            .as_ref()
            .is_some_and(|s| s.files_under(&day_dir(date)).next().is_some());
        let stale = !computed || changed.as_ref().is_none_or(|c| c.contains_key(&date));
        if !stale {
            continue;
        }
        let end = day_start_ms(date) + ms(DAY);
        let closed = end + ms(windows.lateness) <= now_ms;
        let changeable = end > now_ms - ms(windows.raw_keep) - ms(DAY);
        if closed && changeable {
            due.push(date);
        } else if computed && changed.is_some() && !closed {
            held_back = true;
        }
    }
    let version = if held_back {
        expected.unwrap_or(-1)
    } else {
        d.version()
    };
    Ok(Plan {
        due,
        denied,
        expected,
        version,
    })
}

/// The closed days with rollups whose overage is missing or whose rollups changed since it
/// was computed. Only days that late data can still change are looked at: those that ended
/// within the raw window (older days are final; `run_day` computes one on demand).
pub async fn due_days(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<NaiveDate>, RollupError> {
    Ok(plan(rollup, now_ms, windows).await?.due)
}

/// Computes every due day and commits them with the job's progress. When another run
/// commits first (another scheduler), this one looks again at what is due then.
pub async fn run(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<OverageReport>, RollupError> {
    again_on_conflict("overage", || run_plan(rollup, now_ms, windows)).await
}

async fn run_plan(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<OverageReport>, RollupError> {
    let plan = plan(rollup, now_ms, windows).await?;
    // Nothing due: no commit (the progress moves with the next day computed).
    if plan.due.is_empty() {
        return Ok(Vec::new());
    }
    let mut days = Vec::with_capacity(plan.due.len());
    for date in &plan.due {
        days.push(write_day(rollup, plan.denied.as_ref(), *date).await?);
    }
    commit_days(rollup, days, Some((plan.expected, plan.version))).await
}
