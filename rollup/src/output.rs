//! The files the rollup writes: one batch of a table's schema (encoded by the lake's
//! `verdict_lake::files::encode_rollup_parquet`).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::SchemaRef;

use crate::error::RollupError;

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
