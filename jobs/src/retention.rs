//! Retention: whole partitions go once they are older than their table's window, found from
//! the table's log (the Delta tables) or by listing folders (the quarantine, a plain prefix
//! of the rejected records), never by reading rows. Raw hours and quarantine days go after `raw_keep`
//! (7 days), the reconcile's round days a day later; rollup hours and overage days after
//! `rollup_keep` (5 years). A partition is
//! old once its *end* is further back than the window: the hour that started exactly 7
//! days ago still has an hour to live.
//!
//! Each table's expired partitions leave it in one Delta commit (a `remove` of each file);
//! vacuum then deletes the bytes of files removed longer ago than the table's retention
//! (an hour, so a query planned before the removal still finishes) and of files no commit
//! names (a flush or compaction that died, a fenced worker's).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeMap;
use verdict_schemas::layout::QUARANTINE_PREFIX;

use verdict_lake::tables::{DEMAND_HOURLY, DENIED_HOURLY, OVERAGE, RAW, RECONCILE_ROUNDS};
use verdict_lake::vacuum;
use verdict_lake::{Action, Add, Commit, LakeError, PartitionValues, Snapshot, Table, TableDef};
use verdict_rollup::{hour_files_in, hours_in};
use verdict_schemas::HourPartition;
use verdict_schemas::layout::{parse_date_segment, parse_hour_segment};

use crate::error::MaintenanceError;
use crate::lake::Lake;
use crate::partitions::{day_folders, delete_under, objects_under};
use crate::windows::{DAY, Windows, day_start_ms, ms};

/// A partition past its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// Its table: `raw`, `quarantine`, `denied_hourly`, `demand_hourly`, `overage` or
    /// `reconcile_rounds`.
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
    /// Files vacuum deleted from the Delta tables (dry: would delete).
    pub vacuumed: usize,
    /// Their bytes.
    pub vacuumed_bytes: u64,
}

async fn raw_snapshot(store: &Arc<dyn ObjectStore>) -> Result<Option<Snapshot>, LakeError> {
    RAW.table(Arc::clone(store)).snapshot_if_any().await
}

/// The partitions past their window, oldest first within each table, with their sizes.
pub async fn plan(
    store: &Arc<dyn ObjectStore>,
    now_ms: i64,
    windows: &Windows,
) -> Result<Vec<Expired>, MaintenanceError> {
    let mut out = Vec::new();
    // An append-only table's partitions are refused here, where the dry run and the run
    // both begin: removing them would remove data, which `delta.appendOnly` forbids.
    let removable = |table: &Table, snapshot: &Snapshot, expired: &[Expired]| {
        let files = expired.iter().map(|e| e.objects).sum();
        table.check_removable(snapshot, "retention", files)
    };
    if let Some(snapshot) = raw_snapshot(store).await? {
        let expired = raw_expired(&snapshot, now_ms, windows);
        removable(&RAW.table(Arc::clone(store)), &snapshot, &expired)?;
        out.extend(expired);
    }
    for (def, keep) in derived(windows) {
        let table = def.table(Arc::clone(store));
        if let Some(snapshot) = table.snapshot_if_any().await? {
            let expired: Vec<Expired> = derived_expired(def, &snapshot, now_ms, keep)
                .into_iter()
                .map(|(e, _)| e)
                .collect();
            removable(&table, &snapshot, &expired)?;
            out.extend(expired);
        }
    }
    let mut doomed: Vec<(&'static str, Path)> = Vec::new();
    for (date, folder) in day_folders(store.as_ref(), QUARANTINE_PREFIX).await? {
        if day_start_ms(date) + ms(DAY) <= now_ms - ms(windows.raw_keep) {
            doomed.push(("quarantine", folder));
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

/// The tables partitioned by day or hour beside raw, each with its window. The reconcile's
/// rounds are read only to replay the raw table's range (and the hour before it), so they
/// are kept a day longer than raw.
fn derived(windows: &Windows) -> [(&'static TableDef, std::time::Duration); 4] {
    [
        (&DENIED_HOURLY, windows.rollup_keep),
        (&DEMAND_HOURLY, windows.rollup_keep),
        (&OVERAGE, windows.rollup_keep),
        (&RECONCILE_ROUNDS, windows.raw_keep + DAY),
    ]
}

/// The partitions of a derived table past `keep`, from its snapshot: the hour folders
/// (`date=…/hour=…/`) of the rollups, the day folders of the overage, each with its files.
fn derived_expired(
    def: &'static TableDef,
    snapshot: &Snapshot,
    now_ms: i64,
    keep: std::time::Duration,
) -> Vec<(Expired, Vec<Add>)> {
    let mut folders: BTreeMap<String, (i64, Vec<Add>)> = BTreeMap::new();
    for add in snapshot.files() {
        let mut parts = add.path.split('/');
        let Some(date) = parts.next().and_then(parse_date_segment) else {
            continue;
        };
        let hour = if def.name == OVERAGE.name || def.name == RECONCILE_ROUNDS.name {
            None
        } else {
            parts.next().and_then(parse_hour_segment)
        };
        let (folder, end) = match hour.and_then(|h| HourPartition::new(date, h)) {
            Some(h) => (h.partition_path(), h.end_ms()),
            None => (
                format!("date={}", date.format("%Y-%m-%d")),
                day_start_ms(date) + ms(DAY),
            ),
        };
        folders
            .entry(folder)
            .or_insert((end, Vec::new()))
            .1
            .push(add.clone());
    }
    folders
        .into_iter()
        .filter(|(_, (end, _))| *end <= now_ms - ms(keep))
        .map(|(folder, (_, files))| {
            (
                Expired {
                    table: def.name,
                    prefix: Path::from(format!("{}/{folder}", def.root)),
                    objects: files.len(),
                    bytes: files
                        .iter()
                        .map(|a| u64::try_from(a.size).unwrap_or(0))
                        .sum(),
                },
                files,
            )
        })
        .collect()
}

/// Removes a derived table's expired partitions in one commit and vacuums it; the files
/// vacuum deleted and their bytes (dry: would delete).
async fn expire_derived(
    table: Table,
    def: &'static TableDef,
    keep: std::time::Duration,
    now_ms: i64,
    dry_run: bool,
) -> Result<(usize, u64), MaintenanceError> {
    let Some(mut snapshot) = table.snapshot_if_any().await? else {
        return Ok((0, 0));
    };
    let expired = derived_expired(def, &snapshot, now_ms, keep);
    if !dry_run && !expired.is_empty() {
        let files = expired
            .iter()
            .flat_map(|(_, files)| files.iter().cloned())
            .collect();
        let predicate = format!(
            "partitions ending before {} days ago",
            keep.as_secs() / 86_400
        );
        let version = delete_files(&table, &mut snapshot, files, predicate, now_ms).await?;
        tracing::info!(
            table = def.name,
            partitions = expired.len(),
            version,
            "removed expired partitions"
        );
    }
    vacuum_table(&table, &snapshot, now_ms, dry_run).await
}

/// Removes `files` from `table` in one `DELETE` commit on `snapshot`, which reads their
/// partitions (a file committed to one of them meanwhile makes it conflict); the version.
async fn delete_files(
    table: &Table,
    snapshot: &mut Snapshot,
    files: Vec<Add>,
    predicate: String,
    now_ms: i64,
) -> Result<i64, LakeError> {
    let partitions: std::collections::BTreeSet<PartitionValues> =
        files.iter().map(|a| a.partition_values.clone()).collect();
    let removes = files
        .iter()
        .map(|a| Action::Remove(a.remove(now_ms, true)))
        .collect();
    table
        .commit(
            snapshot,
            Commit::new("DELETE", removes)
                .with_parameter("predicate", predicate)
                .reading(partitions.into_iter().collect()),
        )
        .await
}

/// Vacuums `table` as of `snapshot`: the files removed longer ago than its retention and
/// the orphans; how many and their bytes (dry: would delete, listed in the log).
async fn vacuum_table(
    table: &Table,
    snapshot: &Snapshot,
    now_ms: i64,
    dry_run: bool,
) -> Result<(usize, u64), MaintenanceError> {
    let doomed = vacuum::plan(table, snapshot, None, now_ms).await?;
    let counts = (doomed.files.len(), doomed.bytes());
    if dry_run {
        for (m, why) in &doomed.files {
            tracing::info!(path = %m.location, bytes = m.size, ?why, "vacuum would delete (dry run)");
        }
    } else {
        vacuum::run(table, &doomed).await?;
        if counts.0 > 0 {
            tracing::info!(
                table = %table.root(),
                files = counts.0,
                bytes = counts.1,
                "vacuumed"
            );
        }
    }
    Ok(counts)
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
/// vacuums the Delta tables, as of the lake's `now_ms`; the commits are stamped by its clock.
pub async fn run(lake: Lake<'_>, dry_run: bool) -> Result<RetentionReport, MaintenanceError> {
    let (store, clock, windows, now_ms) = (lake.store, lake.clock, lake.windows, lake.now_ms);
    let expired = plan(store, now_ms, windows).await?;
    let mut report = RetentionReport::default();
    for e in &expired {
        if dry_run {
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "would delete (dry run)");
        } else if e.table == "quarantine" {
            delete_under(store.as_ref(), &e.prefix).await?;
            tracing::info!(table = e.table, prefix = %e.prefix, objects = e.objects, bytes = e.bytes, "deleted an expired partition");
        }
    }
    let table = RAW.table_at(Arc::clone(store), Arc::clone(clock));
    if let Some(mut snapshot) = raw_snapshot(store).await? {
        // From the snapshot the removal is committed on, so that an hour that received late
        // files since the plan loses them too.
        let hours: Vec<_> = hours_in(&snapshot)
            .into_iter()
            .filter(|hour| hour.end_ms() <= now_ms - ms(windows.raw_keep))
            .collect();
        if !dry_run && !hours.is_empty() {
            let files = hours
                .iter()
                .flat_map(|h| hour_files_in(&snapshot, h).files)
                .map(|f| f.add)
                .collect();
            let predicate = format!(
                "hours ending before {} days ago",
                windows.raw_keep.as_secs() / 86_400
            );
            let version = delete_files(&table, &mut snapshot, files, predicate, now_ms).await?;
            report.raw_version = Some(version);
            tracing::info!(
                hours = hours.len(),
                version,
                "removed the raw table's expired hours"
            );
        }
        let (files, bytes) = vacuum_table(&table, &snapshot, now_ms, dry_run).await?;
        report.vacuumed += files;
        report.vacuumed_bytes += bytes;
    }
    for (def, keep) in derived(windows) {
        let table = def.table_at(Arc::clone(store), Arc::clone(clock));
        let (files, bytes) = expire_derived(table, def, keep, now_ms, dry_run).await?;
        report.vacuumed += files;
        report.vacuumed_bytes += bytes;
    }
    report.expired = expired;
    Ok(report)
}
