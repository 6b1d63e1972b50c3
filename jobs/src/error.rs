//! Why a lake maintenance job (compaction, retention) failed.

use verdict_lake::LakeError;

/// Why compaction or retention failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// The store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A table's log could not be read or committed to.
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// A raw file could not be read, or the merged one written.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Merging the rows failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Encoding the merged file failed.
    #[error(transparent)]
    Encode(#[from] verdict_lake::files::EncodeError),
}
