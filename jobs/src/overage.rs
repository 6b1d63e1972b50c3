//! The daily overage table for pricing: per key, tier and route class per UTC day, the
//! requests refused because the hourly quota was spent, enforced and in shadow mode, with
//! the quota in force. Computed from the day's `denied_hourly` rollups into one object,
//! `overage/date=YYYY-MM-DD/overage.parquet` (replaced whole by a single PUT). Its footer
//! holds a fingerprint of the rollup objects it was computed from; when late data
//! re-rolls an hour of the day, the fingerprint no longer matches and the day is due again.

use std::sync::Arc;

use arrow::array::Date32Array;
use chrono::NaiveDate;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use verdict_rollup::{
    ROLLUP_FILE, Rollup, RollupError, conform, encode_parquet, fingerprint, read_footer,
};
use verdict_schemas::layout::{DENIED_HOURLY_PREFIX, overage_prefix};
use verdict_schemas::tables::{OVERAGE_SCHEMA_VERSION, denied_hourly_schema, overage_schema};

use crate::partitions::{day_folders, objects_under};
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

/// The overage object's name inside its day folder.
pub const OVERAGE_FILE: &str = "overage.parquet";
/// Footer key: the fingerprint of the rollup objects the day was computed from.
pub const META_SOURCE_FINGERPRINT: &str = "verdict.overage.source_fingerprint";
/// Footer key: the overage schema version.
pub const META_SCHEMA_VERSION: &str = "verdict.overage.schema_version";

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
}

/// Where the overage of `date` lives.
pub fn overage_path(date: NaiveDate) -> Path {
    Path::from(format!("{}/{OVERAGE_FILE}", overage_prefix(date)))
}

/// The rollup objects of `date` and their fingerprint (names, sizes and entity tags: a
/// rollup rewritten with other content has another tag).
async fn day_rollups(
    rollup: &Rollup,
    date: NaiveDate,
) -> Result<(Vec<ObjectMeta>, String), RollupError> {
    let folder = Path::from(format!(
        "{DENIED_HOURLY_PREFIX}/date={}",
        date.format("%Y-%m-%d")
    ));
    let mut files: Vec<ObjectMeta> = objects_under(rollup.store().as_ref(), &folder)
        .await?
        .into_iter()
        .filter(|m| m.location.filename() == Some(ROLLUP_FILE))
        .collect();
    files.sort_by(|a, b| a.location.cmp(&b.location));
    let print = fingerprint(files.iter().map(|m| {
        format!(
            "{} {} {}",
            m.location,
            m.size,
            m.e_tag
                .clone()
                .unwrap_or_else(|| m.last_modified.timestamp_millis().to_string())
        )
    }));
    Ok((files, print))
}

/// Computes and writes the overage of `date` from its rollups.
pub async fn run_day(rollup: &Rollup, date: NaiveDate) -> Result<OverageReport, RollupError> {
    let (files, print) = day_rollups(rollup, date).await?;
    let schema = overage_schema();
    // Date32 counts days since 1970-01-01.
    let days = i32::try_from((date - NaiveDate::default()).num_days()).unwrap_or(i32::MAX);
    let batch = if files.is_empty() {
        arrow::array::RecordBatch::new_empty(Arc::clone(&schema))
    } else {
        let paths: Vec<&Path> = files.iter().map(|m| &m.location).collect();
        let ctx = rollup
            .session_over("denied_hourly", &paths, &denied_hourly_schema())
            .await?;
        let batches = ctx.sql(OVERAGE_SQL).await?.collect().await?;
        conform(&schema, &batches, |rows| {
            Arc::new(Date32Array::from(vec![days; rows]))
        })?
    };
    let body = encode_parquet(
        &batch,
        &[
            (META_SOURCE_FINGERPRINT, print),
            (META_SCHEMA_VERSION, OVERAGE_SCHEMA_VERSION.to_string()),
        ],
    )?;
    let path = overage_path(date);
    let bytes = body.len();
    rollup.store().put(&path, PutPayload::from(body)).await?;
    let report = OverageReport {
        date,
        hours: files.len(),
        rows: batch.num_rows(),
        bytes,
        path,
    };
    tracing::info!(%date, hours = report.hours, rows = report.rows, bytes, "overage written");
    Ok(report)
}

/// The fingerprint an overage object was computed from; `None` when the day has none.
async fn computed_from(rollup: &Rollup, date: NaiveDate) -> Result<Option<String>, RollupError> {
    let footer = read_footer(rollup.store().as_ref(), &overage_path(date)).await?;
    Ok(footer.map(|f| {
        f.meta
            .get(META_SOURCE_FINGERPRINT)
            .cloned()
            .unwrap_or_default()
    }))
}

/// The closed days with rollups whose overage is missing or was computed from other
/// rollups. Only days that late data can still change are looked at: those that ended
/// within the raw window (older days are final; `run_day` computes one on demand).
pub async fn due_days(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<NaiveDate>, RollupError> {
    let mut due = Vec::new();
    for (date, _) in day_folders(rollup.store().as_ref(), DENIED_HOURLY_PREFIX).await? {
        let end = day_start_ms(date) + ms(DAY);
        let closed = end + ms(windows.lateness) <= now_ms;
        let changeable = end > now_ms - ms(windows.raw_keep) - ms(DAY);
        if !(closed && changeable) {
            continue;
        }
        let (_, now) = day_rollups(rollup, date).await?;
        if computed_from(rollup, date).await?.as_deref() != Some(now.as_str()) {
            due.push(date);
        }
    }
    Ok(due)
}

/// Computes every due day.
pub async fn run(
    rollup: &Rollup,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<OverageReport>, RollupError> {
    let mut reports = Vec::new();
    for date in due_days(rollup, now_ms, windows).await? {
        reports.push(run_day(rollup, date).await?);
    }
    Ok(reports)
}
