//! Why a rollup failed: the one error of the crate's reading, grouping and writing.

use datafusion::error::DataFusionError;

/// Why a rollup failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RollupError {
    /// Listing, reading or writing the store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The raw table's log could not be read.
    #[error(transparent)]
    Lake(#[from] verdict_lake::LakeError),
    /// The query failed (an unreadable raw file, for example).
    #[error("query: {0}")]
    Query(#[from] DataFusionError),
    /// The result did not fit the rollup schema.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Reading a raw file's Parquet failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A file could not be encoded.
    #[error(transparent)]
    Encode(#[from] verdict_lake::files::EncodeError),
    /// A raw file could not be read, or lacks a column of the raw table.
    #[error("raw file {path}: {reason}")]
    RawFile {
        /// The object path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// A task reading raw files panicked or was cancelled.
    #[error("rollup task: {0}")]
    Task(String),
}
