//! Which raw files make up one hour of the raw table: the files of the hour's partition in
//! the raw Delta table's snapshot. A snapshot is one version of the table, so a compaction
//! or a flush committing meanwhile neither doubles nor hides a row.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use verdict_lake::log::data_object;
use verdict_lake::tables::{RAW, hour_partition};
use verdict_lake::{Add, LakeError, Snapshot};
use verdict_schemas::layout::HourPartition;

/// One raw file of an hour.
#[derive(Debug, Clone)]
pub struct RawFile {
    /// The object, as the snapshot gives it.
    pub meta: ObjectMeta,
    /// Its `add` in the snapshot.
    pub add: Add,
}

/// The files of one hour in one version of the raw table, ordered by path.
#[derive(Debug, Clone, Default)]
pub struct HourFiles {
    /// The files that make up the hour, each row in exactly one of them.
    pub files: Vec<RawFile>,
    /// The raw table's version they were taken from.
    pub version: i64,
}

impl HourFiles {
    /// Total bytes of the files taken.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.meta.size).sum()
    }

    /// Rows the files' statistics count.
    pub fn rows(&self) -> u64 {
        self.files.iter().filter_map(|f| f.add.num_records()).sum()
    }
}

/// The object of a raw file's `add`.
pub fn raw_object(add: &Add) -> ObjectMeta {
    data_object(&Path::from(RAW.root), add)
}

/// The files of `hour` in `snapshot` (of the raw table).
pub fn hour_files_in(snapshot: &Snapshot, hour: &HourPartition) -> HourFiles {
    let partition = hour_partition(hour);
    let mut files: Vec<RawFile> = snapshot
        .files_in(&partition)
        .map(|add| RawFile {
            meta: raw_object(add),
            add: add.clone(),
        })
        .collect();
    files.sort_by(|a, b| a.meta.location.cmp(&b.meta.location));
    HourFiles {
        files,
        version: snapshot.version(),
    }
}

/// The hour of a raw file's partition values, if they name one.
pub fn hour_of(add: &Add) -> Option<HourPartition> {
    let value = |k: &str| add.partition_values.get(k).cloned().flatten();
    let date = chrono::NaiveDate::parse_from_str(&value("date")?, "%Y-%m-%d").ok()?;
    HourPartition::new(date, value("hour")?.parse().ok()?)
}

/// The hours that have files in `snapshot` (of the raw table), in order.
pub fn hours_in(snapshot: &Snapshot) -> Vec<HourPartition> {
    let hours: std::collections::BTreeSet<HourPartition> =
        snapshot.files().filter_map(hour_of).collect();
    hours.into_iter().collect()
}

/// The files of `hour` in the raw table's latest snapshot. A store with no raw table (no
/// `raw/_delta_log/`: a wrong folder or bucket, or a folder of Parquet files no worker
/// committed) is an error that says so, not an hour of nothing.
pub async fn hour_files(
    store: &Arc<dyn ObjectStore>,
    hour: &HourPartition,
) -> Result<HourFiles, LakeError> {
    let snapshot = RAW.table(Arc::clone(store)).snapshot().await?;
    Ok(hour_files_in(&snapshot, hour))
}
