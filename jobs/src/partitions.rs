//! The partitions of the tables, found by listing folders (never by reading rows), and
//! whole partitions measured and deleted.

use chrono::NaiveDate;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use verdict_schemas::layout::parse_date_segment;

/// The day folders (`date=…/`) under `prefix`, oldest first.
pub async fn day_folders(
    store: &dyn ObjectStore,
    prefix: &str,
) -> object_store::Result<Vec<(NaiveDate, Path)>> {
    let top = store.list_with_delimiter(Some(&Path::from(prefix))).await?;
    let mut out: Vec<(NaiveDate, Path)> = top
        .common_prefixes
        .into_iter()
        .filter_map(|p| Some((p.filename().and_then(parse_date_segment)?, p)))
        .collect();
    out.sort();
    Ok(out)
}

/// Every object under `prefix`.
pub async fn objects_under(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> object_store::Result<Vec<ObjectMeta>> {
    store.list(Some(prefix)).try_collect().await
}

/// Deletes every object under `prefix`; returns how many and their bytes. An object
/// already gone (another job got there first) is not an error.
pub async fn delete_under(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> object_store::Result<(usize, u64)> {
    let objects = objects_under(store, prefix).await?;
    let bytes = objects.iter().map(|m| m.size).sum();
    let count = objects.len();
    let locations = futures::stream::iter(objects.into_iter().map(|m| Ok(m.location))).boxed();
    let mut deleted = store.delete_stream(locations);
    while let Some(r) = deleted.next().await {
        match r {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((count, bytes))
}
