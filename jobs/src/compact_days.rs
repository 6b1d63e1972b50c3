//! Compaction of the rollup's final days: once every hour of a day is past the raw window,
//! no rollup can run for it again (the late-data job works only on hours the raw table
//! holds), so its hourly files in `denied_hourly` and `demand_hourly`, one per hour in
//! `date=…/hour=…/`, are rewritten into one file in `date=…/`, in one commit that removes
//! them and adds it, `dataChange = false`. The rollup keeps five years: a report over the
//! last month opens 191 files per table instead of 720 (one for each of its 23 final
//! days, one for each hour of the 7 the raw table holds), over five years 1,826 instead of
//! 43,824.
//!
//! The rows and their order stay the same (the hours' files in hour order, each as the
//! rollup sorted it), so the `hour` column's statistics still rule out most of a day's
//! pages. The inputs are streamed into the output a batch at a time, so the merge holds
//! one input's bytes and the output's, not the day's rows. A rollup asked afterwards to
//! replace one hour of a compacted day is refused (`LakeError::Compacted`): the day file
//! holds that hour's rows too.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use bytes::Bytes;
use chrono::NaiveDate;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use verdict_lake::files::RollupEncoder;
use verdict_lake::stats::FileStats;
use verdict_lake::tables::{DEMAND_HOURLY, DENIED_HOURLY, date_partition, uuid};
use verdict_lake::{Add, Snapshot, Table, TableDef};

use crate::compact::{CompactReport, Compacted, Merged, put_in_place_of};
use crate::error::MaintenanceError;
use crate::lake::Lake;
use crate::overage::{date_of, day_dir};
use crate::windows::{DAY, day_start_ms, ms};

/// True for a day none of whose hours the raw table keeps any longer at `now_ms`: its
/// rollup is final.
pub fn is_final(date: NaiveDate, lake: &Lake<'_>) -> bool {
    day_start_ms(date) + ms(DAY) + ms(lake.windows.raw_keep) <= lake.now_ms
}

/// Compacts every final day of `denied_hourly` and `demand_hourly` that has more than one
/// file.
pub async fn run(lake: Lake<'_>) -> Result<CompactReport, MaintenanceError> {
    let mut report = CompactReport::default();
    for def in [&DENIED_HOURLY, &DEMAND_HOURLY] {
        let table = def.table_at(Arc::clone(lake.store), Arc::clone(lake.clock));
        let Some(mut snapshot) = table.snapshot_if_any().await? else {
            continue;
        };
        table.check_writable(&snapshot)?;
        def.check_schema(snapshot.metadata())?;
        let mut days: BTreeMap<NaiveDate, usize> = BTreeMap::new();
        for add in snapshot.files() {
            if let Some(date) = date_of(add) {
                *days.entry(date).or_default() += 1;
            }
        }
        for (date, files) in days {
            if files < 2 || !is_final(date, &lake) {
                continue;
            }
            let merged = compact_day(def, &table, &mut snapshot, date).await;
            report.settle(&table, &mut snapshot, merged).await?;
        }
    }
    Ok(report)
}

/// Rewrites the files of `date` in `def`'s table into one, on `snapshot` (which the commit
/// moves on).
async fn compact_day(
    def: &'static TableDef,
    table: &Table,
    snapshot: &mut Snapshot,
    date: NaiveDate,
) -> Result<Compacted, MaintenanceError> {
    let dir = day_dir(date);
    // In path order: the hours' folders in hour order.
    let inputs: Vec<Add> = snapshot.files_under(&dir).cloned().collect();
    let store = table.store();
    let root = Path::from(def.root);
    // The inputs streamed into the output a batch at a time: one input's bytes and the
    // output's encoded bytes held, never the day's rows (millions at the design's scale).
    let schema = (def.schema)();
    let mut encoder = RollupEncoder::new(&schema)?;
    let partitions = def.partition_names();
    let mut stats = FileStats::new(&partitions);
    for add in &inputs {
        let location = Path::from(format!("{root}/{}", add.path));
        let body: Bytes = store.get(&location).await?.bytes().await?;
        for b in ParquetRecordBatchReaderBuilder::try_new(body)?.build()? {
            let b = RecordBatch::try_new(Arc::clone(&schema), b?.columns().to_vec())?;
            encoder.write(&b)?;
            stats.add(&b);
        }
    }
    let rows = stats.rows();
    let relative = format!("{dir}{}-day-{}.parquet", def.name, uuid());
    let body = encoder.finish()?;
    let stats = stats.finish();
    let files: Vec<&Add> = inputs.iter().collect();
    let (output, bytes_out, version) = put_in_place_of(
        table,
        snapshot,
        &files,
        (relative, date_partition(date)),
        body,
        stats,
    )
    .await?;
    let c = Compacted {
        merged: Merged::Day {
            table: def.name,
            date,
        },
        output,
        inputs: inputs.len(),
        rows,
        bytes_in: inputs
            .iter()
            .map(|a| u64::try_from(a.size).unwrap_or(0))
            .sum(),
        bytes_out,
        version,
    };
    tracing::info!(
        table = def.name, %date, output = %c.output, inputs = c.inputs, rows = c.rows,
        bytes_in = c.bytes_in, bytes_out = c.bytes_out, version, "compacted a final rollup day"
    );
    Ok(c)
}
