//! Vacuum: deleting the bytes of data files the table no longer holds. A file goes when it
//! was removed (a `remove` in the log) longer ago than the retention, or when no commit
//! ever added it and it was written longer ago than the retention (an orphan: a writer
//! that died or was fenced between writing its files and committing them). Files the
//! snapshot holds are never deleted, and the retention (the table's
//! `delta.deletedFileRetentionDuration` unless given) is what keeps a query planned on an
//! older snapshot reading its files after a compaction has replaced them.
//!
//! The log folder, and folders and files whose names start with `_` or `.`, are not data.

use std::collections::HashMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;
use object_store::path::Path;

use crate::log::relative_path;
use crate::snapshot::Snapshot;
use crate::table::{LakeError, Table};

/// Why a file is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doomed {
    /// Removed by a commit before the retention.
    Removed,
    /// Never committed, and older than the retention.
    Orphan,
}

/// What vacuum deletes (or, dry, would delete).
#[derive(Debug, Clone, Default)]
pub struct VacuumPlan {
    /// The files, with why.
    pub files: Vec<(ObjectMeta, Doomed)>,
}

impl VacuumPlan {
    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(m, _)| m.size).sum()
    }
}

fn is_hidden(root: &Path, location: &Path) -> bool {
    location
        .prefix_match(root)
        .is_none_or(|mut parts| parts.any(|p| p.as_ref().starts_with(['_', '.'])))
}

/// The files vacuum deletes from `table` as of `snapshot` at `now_ms`.
pub async fn plan(
    table: &Table,
    snapshot: &Snapshot,
    retention: Option<Duration>,
    now_ms: i64,
) -> Result<VacuumPlan, LakeError> {
    let retention = retention.unwrap_or_else(|| snapshot.deleted_file_retention());
    let cutoff = now_ms - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let removed_at: HashMap<&str, i64> = snapshot
        .tombstones()
        .map(|r| (r.path.as_str(), r.deletion_timestamp.unwrap_or(0)))
        .collect();
    let root = table.root().clone();
    let listed: Vec<ObjectMeta> = table
        .store()
        .list(Some(&root))
        .try_collect()
        .await
        .map_err(|source| LakeError::Store {
            table: root.to_string(),
            source,
        })?;
    let mut out = VacuumPlan::default();
    for meta in listed {
        if is_hidden(&root, &meta.location) {
            continue;
        }
        let Some(rel) = relative_path(&root, &meta.location) else {
            continue;
        };
        if snapshot.file(&rel).is_some() {
            continue;
        }
        match removed_at.get(rel.as_str()) {
            Some(at) if *at < cutoff => out.files.push((meta, Doomed::Removed)),
            Some(_) => {}
            None if meta.last_modified.timestamp_millis() < cutoff => {
                out.files.push((meta, Doomed::Orphan));
            }
            None => {}
        }
    }
    out.files.sort_by(|a, b| a.0.location.cmp(&b.0.location));
    Ok(out)
}

/// Deletes what [`plan`] found.
pub async fn run(table: &Table, plan: &VacuumPlan) -> Result<usize, LakeError> {
    let paths: Vec<Path> = plan.files.iter().map(|(m, _)| m.location.clone()).collect();
    let n = paths.len();
    let stream = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
    let results: Vec<object_store::Result<Path>> =
        table.store().delete_stream(stream).collect().await;
    for r in results {
        match r {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(LakeError::Store {
                    table: table.root().to_string(),
                    source,
                });
            }
        }
    }
    Ok(n)
}
