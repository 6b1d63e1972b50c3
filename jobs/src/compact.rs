//! Compaction of closed raw hours, as a Delta operation: the small files the flushes wrote
//! into an hour (one per Kafka partition per flush) are rewritten into one sorted file, and
//! one commit removes them and adds it, both with `dataChange = false` (the table holds the
//! same rows before and after; engines reading the change feed or streaming skip it).
//!
//! Readers never count a row twice or miss one: a query reads one snapshot, which holds
//! either the small files or the compacted one. A query planned before the commit keeps
//! reading the small files, whose bytes stay until vacuum, which deletes only files removed
//! longer ago than the table's retention (an hour). A compaction that dies before its
//! commit leaves a file no commit names (vacuum removes it); two compactions of one hour
//! race on the commit and the loser, whose inputs are gone, is refused.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::{concat_batches, take_record_batch};
use arrow::row::{RowConverter, SortField};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::RngCore;
use verdict_lake::files::encode_raw_parquet;
use verdict_lake::tables::{RAW, hour_partition};
use verdict_lake::{Action, Add, Commit, Conflict, LakeError, Snapshot, Table};
use verdict_rollup::{RawFile, hour_files_in, hours_in};
use verdict_schemas::tables::raw;
use verdict_schemas::{HourPartition, raw_schema};

use crate::error::MaintenanceError;
use crate::lake::Lake;

/// What a compaction merged: a raw hour, or a final day of a rollup table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// An hour of the raw table.
    Hour(HourPartition),
    /// A day of `denied_hourly` or `demand_hourly` (see [`crate::compact_days`]).
    Day {
        /// The table.
        table: &'static str,
        /// The day.
        date: chrono::NaiveDate,
    },
}

/// One compaction done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compacted {
    /// What it merged.
    pub merged: Merged,
    /// The new file.
    pub output: Path,
    /// Files merged into it (and removed from the table).
    pub inputs: usize,
    /// Rows it holds.
    pub rows: usize,
    /// Bytes of the inputs.
    pub bytes_in: u64,
    /// Bytes of the new file.
    pub bytes_out: usize,
    /// The table's version that holds it.
    pub version: i64,
}

/// What one run of the compaction job did (to the raw table's hours, or the rollup's
/// days).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Hours (days) compacted.
    pub compacted: Vec<Compacted>,
    /// Hours (days) whose compaction was refused because a concurrent commit removed an
    /// input (another compaction, or retention).
    pub refused: usize,
}

impl CompactReport {
    /// Records a compaction's outcome: done, or refused because an input left the table
    /// meanwhile (another compaction, or retention), in which case `snapshot` is brought up
    /// to date for the next; any other error is returned.
    pub(crate) async fn settle(
        &mut self,
        table: &Table,
        snapshot: &mut Snapshot,
        outcome: Result<Compacted, MaintenanceError>,
    ) -> Result<(), MaintenanceError> {
        match outcome {
            Ok(c) => self.compacted.push(c),
            Err(MaintenanceError::Lake(LakeError::Conflict {
                conflict: Conflict::FileGone { path },
                ..
            })) => {
                self.refused += 1;
                tracing::info!(table = %table.root(), %path, "an input left the table meanwhile (another compaction, or retention); not compacted");
                table.update(snapshot).await?;
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// Compacts every closed raw hour (within the raw window) that has at least `min_files`
/// files.
pub async fn run(lake: Lake<'_>, min_files: usize) -> Result<CompactReport, MaintenanceError> {
    let (store, clock, windows, now_ms) = (lake.store, lake.clock, lake.windows, lake.now_ms);
    let mut report = CompactReport::default();
    let table = RAW.table_at(Arc::clone(store), Arc::clone(clock));
    let Some(mut snapshot) = table.snapshot_if_any().await? else {
        return Ok(report);
    };
    // A writer's open: compaction rewrites the rows in verdict's schema, so a table another
    // engine changed is named before any file is read or written.
    table.check_writable(&snapshot)?;
    RAW.check_schema(snapshot.metadata())?;
    for hour in hours_in(&snapshot) {
        if windows.is_workable(&hour, now_ms) {
            compact_hour(&table, &mut snapshot, hour, min_files, &mut report).await?;
        }
    }
    Ok(report)
}

/// Compacts one hour of the raw table, on `snapshot` (which the commit moves on).
pub async fn compact_hour(
    table: &Table,
    snapshot: &mut Snapshot,
    hour: HourPartition,
    min_files: usize,
    report: &mut CompactReport,
) -> Result<(), MaintenanceError> {
    let files = hour_files_in(snapshot, &hour).files;
    if files.len() < min_files.max(2) {
        return Ok(());
    }
    let merged = merge(table, snapshot, hour, &files).await;
    report.settle(table, snapshot, merged).await
}

async fn merge(
    table: &Table,
    snapshot: &mut Snapshot,
    hour: HourPartition,
    group: &[RawFile],
) -> Result<Compacted, MaintenanceError> {
    let store = table.store();
    let mut batches = Vec::new();
    for f in group {
        let body: Bytes = store.get(&f.meta.location).await?.bytes().await?;
        for b in ParquetRecordBatchReaderBuilder::try_new(body)?.build()? {
            batches.push(b?);
        }
    }
    let merged = sorted(&concat_batches(&raw_schema(), &batches)?)?;
    let mut nonce = [0u8; 8];
    rand::rng().fill_bytes(&mut nonce);
    let name = format!("compacted-{}.parquet", hex::encode(nonce));
    let relative = format!("{}/{name}", hour.partition_path());
    let body = encode_raw_parquet(std::slice::from_ref(&merged))?;
    let stats = verdict_lake::stats::file_stats(std::slice::from_ref(&merged), &[]);
    let inputs: Vec<&Add> = group.iter().map(|f| &f.add).collect();
    let (output, bytes_out, version) = put_in_place_of(
        table,
        snapshot,
        &inputs,
        (relative, hour_partition(&hour)),
        body.into(),
        stats,
    )
    .await?;
    let c = Compacted {
        merged: Merged::Hour(hour),
        output,
        inputs: group.len(),
        rows: merged.num_rows(),
        bytes_in: group.iter().map(|f| f.meta.size).sum(),
        bytes_out,
        version,
    };
    tracing::info!(
        %hour, output = %c.output, inputs = c.inputs, rows = c.rows,
        bytes_in = c.bytes_in, bytes_out = c.bytes_out, version, "compacted"
    );
    Ok(c)
}

/// Puts `body` (the rows of `inputs`, with their `stats`) at `file` (its path under the
/// table's root, and its partition) and commits it in place of `inputs`: one `OPTIMIZE`
/// commit removing them and adding it, both with `dataChange = false`. Returns the file's
/// location, its bytes and the version.
pub(crate) async fn put_in_place_of(
    table: &Table,
    snapshot: &mut Snapshot,
    inputs: &[&Add],
    (relative, partition): (String, verdict_lake::PartitionValues),
    body: Bytes,
    stats: String,
) -> Result<(Path, usize, i64), MaintenanceError> {
    let output = Path::from(format!("{}/{relative}", table.root()));
    let bytes_out = body.len();
    let now = table.now_ms();
    let folder = relative
        .rsplit_once('/')
        .map_or(String::new(), |(dir, _)| dir.to_owned());
    let add = Add::new(relative, partition, bytes_out as i64, now)
        .with_stats(stats)
        .rearranging();
    table.store().put(&output, PutPayload::from(body)).await?;
    let mut actions: Vec<Action> = inputs
        .iter()
        .map(|a| Action::Remove(a.remove(now, false)))
        .collect();
    actions.push(Action::Add(add));
    let version = table
        .commit(
            snapshot,
            Commit::new("OPTIMIZE", actions)
                .with_parameter("partition", folder)
                .with_parameter("inputs", inputs.len()),
        )
        .await?;
    Ok((output, bytes_out, version))
}

/// The raw table's row order: key id, event time, Kafka partition, offset.
fn sorted(batch: &RecordBatch) -> Result<RecordBatch, MaintenanceError> {
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
