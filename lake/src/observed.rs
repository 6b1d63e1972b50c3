//! An object store that wraps another and sees its calls ([`Observed`]): every call goes
//! to the wrapped store, and an [`Observer`] hears of the writes and may change the
//! metadata that gets and listings return. The wrappers of the lake's users are observers:
//! a store under a prefix that names objects relative to it (`verdict_lake::Prefixed`), a
//! store that pauses after each commit for the crash tests, one that dates objects on a
//! simulated clock for `verdict-bench log`. The `ObjectStore` trait is implemented once,
//! here.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// What an [`Observed`] store does around the wrapped store's calls. Each method's default
/// changes nothing.
pub trait Observer: fmt::Debug + Send + Sync + 'static {
    /// The wrapper's name, as `Display` shows it (`name(inner)`).
    fn name(&self) -> &str;

    /// After a put of `location` in `mode` succeeded; the put returns when this does.
    fn written(&self, location: &Path, mode: &PutMode) -> impl Future<Output = ()> + Send {
        let _ = (location, mode);
        async {}
    }

    /// When a multipart upload of `location` starts.
    fn upload_started(&self, location: &Path) {
        let _ = location;
    }

    /// The metadata of an object a get (or a head) returns.
    fn got(&self, meta: &mut ObjectMeta) {
        let _ = meta;
    }

    /// Each object `list` and `list_with_offset` return.
    fn listed(&self, meta: &mut ObjectMeta) {
        let _ = meta;
    }
}

/// `inner`, observed by an [`Observer`].
#[derive(Debug)]
pub struct Observed<O> {
    inner: Arc<dyn ObjectStore>,
    observer: Arc<O>,
}

impl<O: Observer> Observed<O> {
    /// `inner`, observed by `observer`.
    pub fn new(inner: Arc<dyn ObjectStore>, observer: O) -> Self {
        Self {
            inner,
            observer: Arc::new(observer),
        }
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    fn listing(
        &self,
        objects: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let observer = Arc::clone(&self.observer);
        objects
            .map(move |meta| {
                meta.map(|mut meta| {
                    observer.listed(&mut meta);
                    meta
                })
            })
            .boxed()
    }
}

impl<O: Observer> fmt::Display for Observed<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.observer.name(), self.inner)
    }
}

#[async_trait::async_trait]
impl<O: Observer> ObjectStore for Observed<O> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mode = opts.mode.clone();
        let put = self.inner.put_opts(location, payload, opts).await?;
        self.observer.written(location, &mode).await;
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.observer.upload_started(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let mut got = self.inner.get_opts(location, options).await?;
        self.observer.got(&mut got.meta);
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
        self.listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listing(self.inner.list_with_offset(prefix, offset))
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
    use std::sync::Mutex;

    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    use super::*;

    /// Records the writes and renames what gets and listings return.
    #[derive(Debug, Default)]
    struct Recorder {
        writes: Mutex<Vec<(String, bool)>>,
    }

    impl Observer for Recorder {
        fn name(&self) -> &str {
            "Recorder"
        }

        async fn written(&self, location: &Path, mode: &PutMode) {
            let create = matches!(mode, PutMode::Create);
            self.writes
                .lock()
                .unwrap()
                .push((location.to_string(), create));
        }

        fn got(&self, meta: &mut ObjectMeta) {
            meta.location = Path::from(format!("got/{}", meta.location));
        }

        fn listed(&self, meta: &mut ObjectMeta) {
            meta.location = Path::from(format!("listed/{}", meta.location));
        }
    }

    #[tokio::test]
    async fn the_observer_hears_the_writes_and_shapes_what_is_read() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store = Observed::new(Arc::clone(&inner), Recorder::default());
        let a = Path::from("t/a");
        store.put(&a, PutPayload::from_static(b"12")).await.unwrap();
        store
            .put_opts(
                &Path::from("t/b"),
                PutPayload::from_static(b"3"),
                PutMode::Create.into(),
            )
            .await
            .unwrap();
        // A put that fails is not heard of.
        assert!(
            store
                .put_opts(&a, PutPayload::from_static(b"x"), PutMode::Create.into())
                .await
                .is_err()
        );
        assert_eq!(
            *store.observer().writes.lock().unwrap(),
            [("t/a".to_string(), false), ("t/b".to_string(), true)]
        );
        // The data is the wrapped store's; the metadata is the observer's.
        let got = store.get(&a).await.unwrap();
        assert_eq!(got.meta.location.as_ref(), "got/t/a");
        assert_eq!(got.bytes().await.unwrap().as_ref(), b"12");
        assert_eq!(store.head(&a).await.unwrap().location.as_ref(), "got/t/a");
        let mut listed: Vec<String> = store
            .list(Some(&Path::from("t")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        listed.sort();
        assert_eq!(listed, ["listed/t/a", "listed/t/b"]);
        assert_eq!(store.to_string(), format!("Recorder({inner})"));
    }
}
