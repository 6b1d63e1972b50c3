//! Compaction of closed raw hours: the small files one Kafka partition wrote into an hour
//! (one per flush) are rewritten into one sorted file, named by the smallest and largest
//! offset among them, and only then are the small files deleted.
//!
//! Readers never count a row twice meanwhile: the new file's offset range covers each old
//! file's, and a reader leaves out covered files (`verdict_rollup::sources`). Readers never
//! miss a row either, because no file can appear later inside the new range: only files of
//! completed flushes (inside a `.done` marker's range) are compacted, and a partition with
//! a flush in progress at or below the range's end (an intent) is left for the next run.
//! A compaction that dies half way leaves the new file and some covered old ones; the next
//! run deletes the covered ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::{concat_batches, take_record_batch};
use arrow::row::{RowConverter, SortField};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use verdict_ingest::encode_raw_parquet;
use verdict_ingest::flush::delete_if_present;
use verdict_ingest::progress::{FlushRange, ProgressObject, partition_prefix};
use verdict_rollup::{RawFile, hour_files};
use verdict_schemas::layout::RAW_PREFIX;
use verdict_schemas::tables::raw;
use verdict_schemas::{HourPartition, RawFileName, raw_schema};

use crate::partitions::hour_partitions;
use crate::windows::Windows;

/// Why a compaction failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    /// The store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A raw file could not be read, or the merged one written.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Merging the rows failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Encoding the merged file failed.
    #[error(transparent)]
    Encode(#[from] verdict_ingest::RawFileError),
    /// A raw file name could not be formed.
    #[error(transparent)]
    Layout(#[from] verdict_schemas::LayoutError),
}

/// One compaction done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compacted {
    /// The hour.
    pub hour: HourPartition,
    /// The new file.
    pub output: Path,
    /// Files merged into it (and deleted).
    pub inputs: usize,
    /// Rows it holds.
    pub rows: usize,
    /// Bytes of the inputs.
    pub bytes_in: u64,
    /// Bytes of the new file.
    pub bytes_out: usize,
}

/// What one run of the compaction job did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Files merged.
    pub compacted: Vec<Compacted>,
    /// Covered files (left by an interrupted compaction) deleted.
    pub leftovers_deleted: usize,
    /// Partitions of an hour skipped because a flush there is not complete.
    pub skipped_in_progress: usize,
}

/// Compacts every closed raw hour (within the raw window) where one topic partition has
/// at least `min_files` files.
pub async fn run(
    store: &Arc<dyn ObjectStore>,
    now_ms: i64,
    windows: &Windows,
    min_files: usize,
) -> Result<CompactReport, CompactError> {
    let mut report = CompactReport::default();
    for hour in hour_partitions(store.as_ref(), RAW_PREFIX).await? {
        if windows.is_workable(&hour, now_ms) {
            compact_hour(store, hour, min_files, &mut report).await?;
        }
    }
    Ok(report)
}

/// Compacts one hour.
pub async fn compact_hour(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    min_files: usize,
    report: &mut CompactReport,
) -> Result<(), CompactError> {
    let files = hour_files(store.as_ref(), &hour).await?;
    for leftover in &files.covered {
        delete_if_present(store.as_ref(), &leftover.meta.location).await?;
        report.leftovers_deleted += 1;
        tracing::info!(path = %leftover.meta.location, "deleted a file a compacted file covers");
    }
    let mut groups: BTreeMap<(String, i32), Vec<RawFile>> = BTreeMap::new();
    for f in files.files {
        groups
            .entry((f.name.topic().to_owned(), f.name.partition()))
            .or_default()
            .push(f);
    }
    for ((topic, partition), group) in groups {
        if group.len() < min_files.max(2) {
            continue;
        }
        if !all_complete(store.as_ref(), &topic, partition, &group).await? {
            report.skipped_in_progress += 1;
            tracing::info!(%hour, %topic, partition, "a flush is in progress here; compacting later");
            continue;
        }
        match merge(store, hour, &topic, partition, &group).await {
            Ok(c) => report.compacted.push(c),
            // Another compactor (a second scheduler) finished first and deleted an input.
            Err(CompactError::Store(object_store::Error::NotFound { path, .. })) => {
                tracing::info!(%hour, %topic, partition, %path, "an input vanished: compacted by another run");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// True when every file lies inside a completed flush and no flush of the partition is in
/// progress at or below the group's last offset.
async fn all_complete(
    store: &dyn ObjectStore,
    topic: &str,
    partition: i32,
    group: &[RawFile],
) -> Result<bool, CompactError> {
    let prefix = Path::from(partition_prefix(topic, partition));
    let progress: Vec<ProgressObject> = store
        .list(Some(&prefix))
        .map_ok(|m| {
            m.location
                .filename()
                .and_then(|n| n.parse::<ProgressObject>().ok())
        })
        .try_filter_map(|p| futures::future::ready(Ok(p)))
        .try_collect()
        .await?;
    let last = group
        .iter()
        .map(|f| f.name.last_offset())
        .max()
        .unwrap_or(0);
    let done: Vec<FlushRange> = progress
        .iter()
        .filter_map(|p| match p {
            ProgressObject::Done(r) => Some(*r),
            ProgressObject::Intent { .. } => None,
        })
        .collect();
    let in_progress = progress
        .iter()
        .any(|p| matches!(p, ProgressObject::Intent { first } if *first <= last));
    let inside_done = group.iter().all(|f| {
        done.iter()
            .any(|r| r.first <= f.name.first_offset() && f.name.last_offset() <= r.last)
    });
    Ok(inside_done && !in_progress)
}

async fn merge(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    topic: &str,
    partition: i32,
    group: &[RawFile],
) -> Result<Compacted, CompactError> {
    let mut batches = Vec::new();
    for f in group {
        let body: Bytes = store.get(&f.meta.location).await?.bytes().await?;
        for b in ParquetRecordBatchReaderBuilder::try_new(body)?.build()? {
            batches.push(b?);
        }
    }
    let merged = sorted(&concat_batches(&raw_schema(), &batches)?)?;
    let first = group
        .iter()
        .map(|f| f.name.first_offset())
        .min()
        .unwrap_or(0);
    let last = group
        .iter()
        .map(|f| f.name.last_offset())
        .max()
        .unwrap_or(0);
    let name = RawFileName::new(topic, partition, first, last)?;
    let output = Path::from(name.raw_path(&hour));
    let body = encode_raw_parquet(std::slice::from_ref(&merged))?;
    let bytes_out = body.len();
    // The new file first: from now on readers take it and leave the old ones out.
    store.put(&output, PutPayload::from(body)).await?;
    for f in group {
        delete_if_present(store.as_ref(), &f.meta.location).await?;
    }
    let c = Compacted {
        hour,
        output,
        inputs: group.len(),
        rows: merged.num_rows(),
        bytes_in: group.iter().map(|f| f.meta.size).sum(),
        bytes_out,
    };
    tracing::info!(
        %hour, output = %c.output, inputs = c.inputs, rows = c.rows,
        bytes_in = c.bytes_in, bytes_out = c.bytes_out, "compacted"
    );
    Ok(c)
}

/// The raw table's row order: key id, event time, Kafka partition, offset.
fn sorted(batch: &RecordBatch) -> Result<RecordBatch, CompactError> {
    let columns = [
        raw::KEY_ID,
        raw::EVENT_TIME,
        raw::KAFKA_PARTITION,
        raw::KAFKA_OFFSET,
    ]
    .iter()
    .map(|name| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| arrow::error::ArrowError::SchemaError(format!("no column {name}")))
    })
    .collect::<Result<Vec<_>, _>>()?;
    let converter = RowConverter::new(
        columns
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect(),
    )?;
    let rows = converter.convert_columns(&columns)?;
    let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
    order.sort_unstable_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
    Ok(take_record_batch(
        batch,
        &arrow::array::UInt32Array::from(order),
    )?)
}
