//! Putting a finished raw file into the object store, at the path the layout gives it.

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, PutResult};
use verdict_schemas::{HourPartition, RawFileName};

/// The object path of a raw file: `raw/date=…/hour=…/<topic>+<partition>+<first>+<last>.parquet`.
pub fn raw_object_path(hour: &HourPartition, name: &RawFileName) -> Path {
    Path::from(name.raw_path(hour))
}

/// Writes one encoded raw file; returns what the store answered.
pub async fn put_raw_file(
    store: &dyn ObjectStore,
    hour: &HourPartition,
    name: &RawFileName,
    bytes: Vec<u8>,
) -> object_store::Result<PutResult> {
    store
        .put(&raw_object_path(hour, name), PutPayload::from(bytes))
        .await
}
