//! The files the rollup writes: one batch of a table's schema, encoded as Parquet with the
//! rollup's writer settings.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::error::RollupError;

/// The writer settings of rollup files: zstd, statistics per page, rows sorted by key.
pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .build()
}

/// One Parquet file holding `batch`, written with [`writer_properties`].
pub fn encode_parquet(batch: &RecordBatch) -> Result<Bytes, RollupError> {
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(writer_properties()))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(out))
}

/// The result of a query as one batch of `schema`: its first column made by `lead` (a
/// constant, given the row count), the others the query's columns in order, cast to the
/// schema's types.
pub fn conform(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    lead: impl FnOnce(usize) -> ArrayRef,
) -> Result<RecordBatch, RollupError> {
    let Some(first) = batches.first() else {
        return Ok(RecordBatch::new_empty(Arc::clone(schema)));
    };
    let grouped = concat_batches(&first.schema(), batches)?;
    let mut columns = vec![lead(grouped.num_rows())];
    for (field, column) in schema.fields().iter().skip(1).zip(grouped.columns()) {
        columns.push(cast(column, field.data_type())?);
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}
