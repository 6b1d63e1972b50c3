//! Retention: whole partitions go once they are older than their table's window, found from
//! the table's log (the raw table) or by listing folders (the rollups, the overage and the
//! quarantine), never by reading rows. Raw hours and quarantine days go after `raw_keep`
//! (7 days); rollup hours and overage days after `rollup_keep` (5 years). A partition is
//! old once its *end* is further back than the window: the hour that started exactly 7
//! days ago still has an hour to live.
//!
//! The raw table's expired hours leave it in one Delta commit (a `remove` of each file);
//! vacuum then deletes the bytes of files removed longer ago than the table's retention
//! (an hour, so a query planned before the removal still finishes) and of files no commit
//! names (a flush or compaction that died, a fenced worker's).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;
use verdict_ingest::flush::QUARANTINE_PREFIX;
use verdict_lake::tables::{RAW, hour_partition};
use verdict_lake::vacuum;
use verdict_lake::{Action, Commit, LakeError, Snapshot};
use verdict_rollup::{hour_files_in, hours_in};
use verdict_schemas::layout::{DEMAND_HOURLY_PREFIX, DENIED_HOURLY_PREFIX, OVERAGE_PREFIX};

use crate::partitions::{day_folders, delete_under, hour_partitions, objects_under};
use crate::windows::{DAY, Windows, day_start_ms, ms};

/// Why retention failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// The store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The raw table's log could not be read or committed to.
    #[error(transparent)]
    Lake(#[from] LakeError),
}

/// A partition past its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// Its table: `raw`, `quarantine`, `denied_hourly`, `demand_hourly` or `overage`.
    pub table: &'static str,
    /// Its folder.
    pub prefix: Path,
    /// Objects (for the raw table: files in the table) in it.
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// What a run did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// The partitions past their window.
    pub expired: Vec<Expired>,
    /// The raw table's version whose commit removed its expired hours.
    pub raw_version: Option<i64>,
    /// Files vacuum deleted from the raw table (dry: would delete).
    pub vacuumed: usize,
    /// Their bytes.
    pub vacuumed_bytes: u64,
}

async fn raw_snapshot(store: &Arc<dyn ObjectStore>) -> Result<Option<Snapshot>, LakeError> {
    match RAW.table(Arc::clone(store)).snapshot().await {
        Ok(s) => Ok(Some(s)),
        Err(LakeError::NotATable { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The partitions past their window, oldest first within each table, with their sizes.
pub async fn plan(
    store: &Arc<dyn ObjectStore>,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<Expired>, RetentionError> {
    let mut out = Vec::new();
    if let Some(snapshot) = raw_snapshot(store).await? {
        out.extend(raw_expired(&snapshot, now_ms, windows));
    }
    let mut doomed: Vec<(&'static str, Path)> = Vec::new();
    let hourly = [
        ("denied_hourly", DENIED_HOURLY_PREFIX, windows.rollup_keep),
        ("demand_hourly", DEMAND_HOURLY_PREFIX, windows.rollup_keep),
    ];
    for (table, prefix, keep) in hourly {
        for hour in hour_partitions(store.as_ref(), prefix).await? {
            if hour.end_ms() <= now_ms - ms(keep) {
                doomed.push((
                    table,
                    Path::from(format!("{prefix}/{}", hour.partition_path())),
                ));
            }
        }
    }
    let daily = [
        ("quarantine", QUARANTINE_PREFIX, windows.raw_keep),
        ("overage", OVERAGE_PREFIX, windows.rollup_keep),
    ];
    for (table, prefix, keep) in daily {
        for (date, folder) in day_folders(store.as_ref(), prefix).await? {
            if day_start_ms(date) + ms(DAY) <= now_ms - ms(keep) {
                doomed.push((table, folder));
            }
        }
    }
    for (table, prefix) in doomed {
        let objects = objects_under(store.as_ref(), &prefix).await?;
        out.push(Expired {
            table,
            objects: objects.len(),
            bytes: objects.iter().map(|m| m.size).sum(),
            prefix,
        });
    }
    Ok(out)
}

/// The raw table's hours past the window, from its snapshot.
fn raw_expired(snapshot: &Snapshot, now_ms: i64, windows: &Windows) -> Vec<Expired> {
    hours_in(snapshot)
        .into_iter()
        .filter(|hour| hour.end_ms() <= now_ms - ms(windows.raw_keep))
        .map(|hour| {
            let files = hour_files_in(snapshot, &hour);
            Expired {
                table: "raw",
                prefix: Path::from(hour.raw_prefix()),
                objects: files.files.len(),
                bytes: files.bytes(),
            }
        })
        .collect()
}

/// Removes the partitions past their window (or, with `dry_run`, only lists them) and
/// vacuums the raw table.
pub async fn run(
    store: &Arc<dyn ObjectStore>,
    now_ms: i64,
    windows: &Windows,
    dry_run: bool,
) -> Result<RetentionReport, RetentionError> {
    let expired = plan(store, now_ms, windows).await?;
    let mut report = RetentionReport::default();
    for e in &expired {
        if dry_run {
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "would delete (dry run)");
        } else if e.table != "raw" {
            delete_under(store.as_ref(), &e.prefix).await?;
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "deleted an expired partition");
        }
    }
    let table = RAW.table(Arc::clone(store));
    if let Some(mut snapshot) = raw_snapshot(store).await? {
        // From the snapshot the removal is committed on, so that an hour that received late
        // files since the plan loses them too.
        let hours: Vec<_> = hours_in(&snapshot)
            .into_iter()
            .filter(|hour| hour.end_ms() <= now_ms - ms(windows.raw_keep))
            .collect();
        if !dry_run && !hours.is_empty() {
            let removes: Vec<Action> = hours
                .iter()
                .flat_map(|h| hour_files_in(&snapshot, h).files)
                .map(|f| Action::Remove(f.add.remove(now_ms, true)))
                .collect();
            let version = table
                .commit(
                    &mut snapshot,
                    Commit::new("DELETE", removes)
                        .with_parameter(
                            "predicate",
                            format!(
                                "hours ending before {} days ago",
                                windows.raw_keep.as_secs() / 86_400
                            ),
                        )
                        .reading(hours.iter().map(hour_partition).collect()),
                )
                .await?;
            report.raw_version = Some(version);
            tracing::info!(
                hours = hours.len(),
                version,
                "removed the raw table's expired hours"
            );
        }
        let doomed = vacuum::plan(&table, &snapshot, None, now_ms).await?;
        report.vacuumed = doomed.files.len();
        report.vacuumed_bytes = doomed.bytes();
        if dry_run {
            for (m, why) in &doomed.files {
                tracing::info!(path = %m.location, bytes = m.size, ?why, "vacuum would delete (dry run)");
            }
        } else {
            vacuum::run(&table, &doomed).await?;
            if report.vacuumed > 0 {
                tracing::info!(
                    files = report.vacuumed,
                    bytes = report.vacuumed_bytes,
                    "vacuumed the raw table"
                );
            }
        }
    }
    report.expired = expired;
    Ok(report)
}
