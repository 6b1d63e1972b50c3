//! Retention: whole partitions are deleted once they are older than their table's window,
//! found by listing folders, never by reading rows. Raw hours and quarantine days go after
//! `raw_keep` (7 days); rollup hours and overage days after `rollup_keep` (5 years).
//! A partition is old once its *end* is further back than the window: the hour that
//! started exactly 7 days ago still has an hour to live.

use object_store::ObjectStore;
use object_store::path::Path;
use verdict_ingest::flush::QUARANTINE_PREFIX;
use verdict_schemas::layout::{
    DEMAND_HOURLY_PREFIX, DENIED_HOURLY_PREFIX, OVERAGE_PREFIX, RAW_PREFIX,
};

use crate::partitions::{day_folders, delete_under, hour_partitions, objects_under};
use crate::windows::{DAY, Windows, day_start_ms, ms};

/// A partition past its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// Its table: `raw`, `quarantine`, `denied_hourly` or `overage`.
    pub table: &'static str,
    /// Its folder.
    pub prefix: Path,
    /// Objects in it.
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// The partitions past their window, oldest first within each table, with their sizes.
pub async fn plan(
    store: &dyn ObjectStore,
    now_ms: i64,
    windows: &Windows,
) -> object_store::Result<Vec<Expired>> {
    let mut doomed: Vec<(&'static str, Path)> = Vec::new();
    let hourly = [
        ("raw", RAW_PREFIX, windows.raw_keep),
        ("denied_hourly", DENIED_HOURLY_PREFIX, windows.rollup_keep),
        ("demand_hourly", DEMAND_HOURLY_PREFIX, windows.rollup_keep),
    ];
    for (table, prefix, keep) in hourly {
        for hour in hour_partitions(store, prefix).await? {
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
        for (date, folder) in day_folders(store, prefix).await? {
            if day_start_ms(date) + ms(DAY) <= now_ms - ms(keep) {
                doomed.push((table, folder));
            }
        }
    }
    let mut out = Vec::with_capacity(doomed.len());
    for (table, prefix) in doomed {
        let objects = objects_under(store, &prefix).await?;
        out.push(Expired {
            table,
            objects: objects.len(),
            bytes: objects.iter().map(|m| m.size).sum(),
            prefix,
        });
    }
    Ok(out)
}

/// Deletes the partitions past their window (or, with `dry_run`, only lists them), and
/// returns them.
pub async fn run(
    store: &dyn ObjectStore,
    now_ms: i64,
    windows: &Windows,
    dry_run: bool,
) -> object_store::Result<Vec<Expired>> {
    let expired = plan(store, now_ms, windows).await?;
    for e in &expired {
        if dry_run {
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "would delete (dry run)");
        } else {
            delete_under(store, &e.prefix).await?;
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "deleted an expired partition");
        }
    }
    Ok(expired)
}
