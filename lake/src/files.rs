//! How the tables' data files are encoded: each table's Parquet writer settings, and a list
//! of batches made into one file in memory. Every writer of a table (the ingest, the
//! compaction, the rollup, the jobs) encodes through here, so a table's files read the same
//! whoever wrote them.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;
use verdict_schemas::raw_schema;
use verdict_schemas::tables::raw;

/// Why a file could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Arrow refused the columns.
    #[error("building the record batch: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The Parquet encoder failed.
    #[error("encoding parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// The writer settings of the raw table: zstd, statistics down to the page (so readers can
/// skip pages by key and time), a bloom filter on key id, and per-column encodings chosen
/// for the sorted layout: dictionary for the low-cardinality columns (the default), delta
/// for the two monotone-ish integers that would defeat a dictionary.
pub fn raw_writer_properties() -> WriterProperties {
    let delta = |name: &str| ColumnPath::from(name);
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(1 << 20))
        .set_sorting_columns(Some(vec![
            ascending(raw::KEY_ID),
            ascending(raw::EVENT_TIME),
        ]))
        .set_column_bloom_filter_enabled(delta(raw::KEY_ID), true)
        .set_column_dictionary_enabled(delta(raw::EVENT_TIME), false)
        .set_column_encoding(delta(raw::EVENT_TIME), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled(delta(raw::KAFKA_OFFSET), false)
        .set_column_encoding(delta(raw::KAFKA_OFFSET), Encoding::DELTA_BINARY_PACKED)
        .build()
}

fn ascending(column: &str) -> SortingColumn {
    SortingColumn {
        column_idx: column_index(column),
        descending: false,
        nulls_first: false,
    }
}

fn column_index(name: &str) -> i32 {
    raw_schema()
        .index_of(name)
        .ok()
        .and_then(|i| i32::try_from(i).ok())
        .unwrap_or_default()
}

/// Encodes batches of the raw schema as one Parquet file, in memory.
pub fn encode_raw_parquet(batches: &[RecordBatch]) -> Result<Vec<u8>, EncodeError> {
    encode(&raw_schema(), batches, raw_writer_properties())
}

/// The writer settings of the rollup's tables (`denied_hourly`, `demand_hourly`,
/// `overage`, `reconcile_rounds`): zstd, statistics per page; their writers sort the rows.
pub fn rollup_writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .build()
}

/// One Parquet file of a rollup table holding `batch`, written with
/// [`rollup_writer_properties`].
pub fn encode_rollup_parquet(batch: &RecordBatch) -> Result<Bytes, EncodeError> {
    let mut encoder = RollupEncoder::new(&batch.schema())?;
    encoder.write(batch)?;
    encoder.finish()
}

/// A rollup table's Parquet file written a batch at a time, in memory, with
/// [`rollup_writer_properties`]: the file [`encode_rollup_parquet`] writes from the same
/// rows, without holding them all (a compaction streams its inputs' batches into it).
pub struct RollupEncoder {
    writer: ArrowWriter<Vec<u8>>,
}

impl RollupEncoder {
    /// An encoder of rows of `schema`.
    pub fn new(schema: &SchemaRef) -> Result<Self, EncodeError> {
        let writer = ArrowWriter::try_new(
            Vec::new(),
            Arc::clone(schema),
            Some(rollup_writer_properties()),
        )?;
        Ok(Self { writer })
    }

    /// Encodes `batch`'s rows after those written before.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), EncodeError> {
        Ok(self.writer.write(batch)?)
    }

    /// The file.
    pub fn finish(self) -> Result<Bytes, EncodeError> {
        Ok(Bytes::from(self.writer.into_inner()?))
    }
}

/// The writer settings of the query service's stored parts of its reports' first levels
/// (`levels/`, one file a day, mostly one row per key, its writer sorting the rows by key):
/// zstd at level 9 (written once, read by every service), and the key ids without a
/// dictionary (each is in a file once per limit, next to its other rows).
pub fn level_writer_properties(schema: &SchemaRef) -> WriterProperties {
    let mut builder = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(9).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page);
    for field in schema.fields() {
        if matches!(field.data_type(), DataType::FixedSizeBinary(_)) {
            let column = ColumnPath::from(field.name().as_str());
            builder = builder.set_column_dictionary_enabled(column, false);
        }
    }
    builder.build()
}

/// One Parquet file of `schema` holding `batches`, written with
/// [`level_writer_properties`].
pub fn encode_level_parquet(
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<Bytes, EncodeError> {
    encode(schema, batches, level_writer_properties(schema)).map(Bytes::from)
}

/// `batches` of `schema` as one Parquet file written with `properties`, in memory.
fn encode(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    properties: WriterProperties,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, Arc::clone(schema), Some(properties))?;
    for b in batches {
        writer.write(b)?;
    }
    writer.close()?;
    Ok(out)
}
