//! Answer formats: JSON (collected, bounded by the row limit), and CSV, Arrow IPC stream and
//! Parquet, encoded batch by batch as the rows arrive.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

/// An answer format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`: `{"columns": [...], "rows": [{...}], "row_count": n}`.
    Json,
    /// `text/csv` with a header line; key ids as hex.
    Csv,
    /// `application/vnd.apache.arrow.stream`: an Arrow IPC stream.
    Arrow,
    /// `application/vnd.apache.parquet`: one zstd Parquet file.
    Parquet,
}

impl Format {
    /// The names `?format=` takes.
    pub const NAMES: [&str; 4] = ["json", "csv", "arrow", "parquet"];

    /// The format named by `?format=`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "json" => Some(Self::Json),
            "csv" => Some(Self::Csv),
            "arrow" | "arrows" | "ipc" => Some(Self::Arrow),
            "parquet" => Some(Self::Parquet),
            _ => None,
        }
    }

    /// The first format an `Accept` header asks for (`*/*` or none: JSON).
    pub fn from_accept(accept: &str) -> Option<Self> {
        for part in accept.split(',') {
            let media = part
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let format = match media.as_str() {
                "application/json" | "*/*" | "application/*" | "" => Some(Self::Json),
                "text/csv" | "text/*" => Some(Self::Csv),
                "application/vnd.apache.arrow.stream" => Some(Self::Arrow),
                "application/vnd.apache.parquet" | "application/x-parquet" => Some(Self::Parquet),
                _ => None,
            };
            if format.is_some() {
                return format;
            }
        }
        None
    }

    /// The `Content-Type` of an answer.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Csv => "text/csv; charset=utf-8",
            Self::Arrow => "application/vnd.apache.arrow.stream",
            Self::Parquet => "application/vnd.apache.parquet",
        }
    }
}

/// `batch` with its binary key ids as lowercase hex text (for CSV and the terminal).
pub fn hex_keys(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    fn hex_strings<'a>(values: impl Iterator<Item = Option<&'a [u8]>>) -> ArrayRef {
        Arc::new(values.map(|v| v.map(hex::encode)).collect::<StringArray>())
    }
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let hexed = match field.data_type() {
            DataType::FixedSizeBinary(_) => Some(hex_strings(column.as_fixed_size_binary().iter())),
            DataType::Binary => Some(hex_strings(column.as_binary::<i32>().iter())),
            _ => None,
        };
        match hexed {
            Some(c) => {
                fields.push(Field::new(
                    field.name(),
                    DataType::Utf8,
                    field.is_nullable(),
                ));
                columns.push(c);
            }
            None => {
                fields.push(field.as_ref().clone());
                columns.push(Arc::clone(column));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// The JSON answer of collected batches.
pub fn json(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut rows = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::JsonArray>(Vec::new());
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    rows.write_batches(&refs)?;
    rows.finish()?;
    let rows = rows.into_inner();
    let rows = if rows.is_empty() {
        b"[]".to_vec()
    } else {
        rows
    };
    let columns: Vec<serde_json::Value> = schema
        .fields()
        .iter()
        .map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string()}))
        .collect();
    let row_count: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let mut out = Vec::with_capacity(rows.len() + 256);
    out.extend_from_slice(b"{\"columns\":");
    out.extend_from_slice(
        &serde_json::to_vec(&columns).map_err(|e| ArrowError::JsonError(e.to_string()))?,
    );
    out.extend_from_slice(b",\"rows\":");
    out.extend_from_slice(&rows);
    out.extend_from_slice(format!(",\"row_count\":{row_count}}}").as_bytes());
    Ok(out)
}

/// Encodes a stream of batches in one of the streamed formats, a chunk per batch.
pub enum Encoder {
    /// CSV; `header` until the first chunk.
    Csv {
        /// Whether the header is still to be written.
        header: bool,
    },
    /// Arrow IPC stream.
    Arrow(Box<arrow::ipc::writer::StreamWriter<Vec<u8>>>),
    /// Parquet.
    Parquet(Box<ArrowWriter<Vec<u8>>>),
}

impl Encoder {
    /// An encoder of `format` (not JSON) for rows of `schema`.
    pub fn new(format: Format, schema: &SchemaRef) -> Result<Self, ArrowError> {
        Ok(match format {
            Format::Json | Format::Csv => Self::Csv { header: true },
            Format::Arrow => Self::Arrow(Box::new(arrow::ipc::writer::StreamWriter::try_new(
                Vec::new(),
                schema,
            )?)),
            Format::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .build();
                Self::Parquet(Box::new(
                    ArrowWriter::try_new(Vec::new(), Arc::clone(schema), Some(props))
                        .map_err(|e| ArrowError::ExternalError(Box::new(e)))?,
                ))
            }
        })
    }

    /// The bytes for one more batch (possibly none yet: Parquet buffers a row group).
    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Bytes, ArrowError> {
        match self {
            Self::Csv { header } => {
                let mut out = Vec::new();
                {
                    let mut w = arrow::csv::WriterBuilder::new()
                        .with_header(*header)
                        .build(&mut out);
                    w.write(&hex_keys(batch)?)?;
                }
                *header = false;
                Ok(Bytes::from(out))
            }
            Self::Arrow(w) => {
                w.write(batch)?;
                Ok(Bytes::from(std::mem::take(w.get_mut())))
            }
            Self::Parquet(w) => {
                w.write(batch)
                    .map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
                Ok(Bytes::from(std::mem::take(w.inner_mut())))
            }
        }
    }

    /// The closing bytes.
    pub fn finish(self, schema: &SchemaRef) -> Result<Bytes, ArrowError> {
        match self {
            Self::Csv { header } => {
                if !header {
                    return Ok(Bytes::new());
                }
                // No rows: still the header line.
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                Ok(Bytes::from(format!("{}\n", names.join(","))))
            }
            Self::Arrow(mut w) => {
                w.finish()?;
                Ok(Bytes::from(w.into_inner()?))
            }
            Self::Parquet(w) => Ok(Bytes::from(
                w.into_inner()
                    .map_err(|e| ArrowError::ExternalError(Box::new(e)))?,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{FixedSizeBinaryArray, Int64Array};

    use super::*;

    fn batch() -> RecordBatch {
        let key =
            FixedSizeBinaryArray::try_from_iter([[0xabu8; 16], [1u8; 16]].into_iter()).unwrap();
        RecordBatch::try_from_iter([
            ("key_id", Arc::new(key) as ArrayRef),
            ("n", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn csv_writes_a_header_once_and_keys_as_hex() {
        let b = batch();
        let mut e = Encoder::new(Format::Csv, &b.schema()).unwrap();
        let mut out = e.batch(&b).unwrap().to_vec();
        out.extend_from_slice(&e.batch(&b).unwrap());
        out.extend_from_slice(&e.finish(&b.schema()).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 5, "{text}");
        assert_eq!(text.lines().next(), Some("key_id,n"));
        assert!(text.contains(&format!("{},1", "ab".repeat(16))), "{text}");
    }

    #[test]
    fn arrow_and_parquet_read_back() {
        let b = batch();
        for format in [Format::Arrow, Format::Parquet] {
            let mut e = Encoder::new(format, &b.schema()).unwrap();
            let mut out = e.batch(&b).unwrap().to_vec();
            out.extend_from_slice(&e.finish(&b.schema()).unwrap());
            let rows: usize = match format {
                Format::Arrow => arrow::ipc::reader::StreamReader::try_new(&out[..], None)
                    .unwrap()
                    .map(|b| b.unwrap().num_rows())
                    .sum(),
                _ => parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                    Bytes::from(out),
                )
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap().num_rows())
                .sum(),
            };
            assert_eq!(rows, 2, "{format:?}");
        }
    }

    #[test]
    fn accept_headers_pick_a_format() {
        assert_eq!(Format::from_accept("text/csv"), Some(Format::Csv));
        assert_eq!(
            Format::from_accept("application/xml, */*;q=0.1"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::from_accept("application/vnd.apache.parquet"),
            Some(Format::Parquet)
        );
        assert_eq!(Format::from_accept("image/png"), None);
        assert_eq!(Format::from_name("ARROW"), Some(Format::Arrow));
    }
}
