//! A store under a prefix, like `object_store::prefix::PrefixStore`, except that the
//! metadata returned by `get` and `head` names the object relative to the prefix, as
//! `list` does. (`PrefixStore` 0.13 returns the full path there; DataFusion then thinks a
//! file it has just looked up is outside the table and reads nothing.)

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// `inner` seen under `prefix`.
#[derive(Debug)]
pub struct Prefixed {
    prefix: Path,
    inner: PrefixStore<Arc<dyn ObjectStore>>,
}

impl Prefixed {
    /// `inner` under `prefix` (a path such as `runs/42`).
    pub fn new(inner: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self {
            prefix: Path::from(prefix),
            inner: PrefixStore::new(inner, prefix),
        }
    }

    fn relative(&self, location: Path) -> Path {
        let relative = location.prefix_match(&self.prefix).map(Path::from_iter);
        relative.unwrap_or(location)
    }
}

impl std::fmt::Display for Prefixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prefixed({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Prefixed {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let mut got = self.inner.get_opts(location, options).await?;
        got.meta.location = self.relative(std::mem::take(&mut got.meta.location));
        Ok(got)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    use super::*;

    #[tokio::test]
    async fn head_and_get_name_the_object_relative_to_the_prefix() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store = Prefixed::new(Arc::clone(&inner), "runs/42");
        let path = Path::from("raw/date=2026-11-30/hour=14/t+00000+1+2.parquet");
        store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(store.head(&path).await.unwrap().location, path);
        assert_eq!(store.get(&path).await.unwrap().meta.location, path);
        assert!(
            inner
                .head(&Path::from(format!("runs/42/{path}")))
                .await
                .is_ok()
        );
    }
}
