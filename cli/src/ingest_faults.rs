//! Fault injection for the crash tests of `verdict ingest` (hidden options): a store that
//! holds the worker for a while right after a commit to a table's log has landed, before
//! the worker does anything else (the offset commit to Kafka is next), so that a test can
//! kill the process in that window deterministically.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// `inner`, except that a put creating a log entry (`…/_delta_log/<version>.json`, written
/// with `PutMode::Create`) returns only after `pause` once it has succeeded.
#[derive(Debug)]
pub struct PauseAfterCommit {
    inner: Arc<dyn ObjectStore>,
    pause: Duration,
}

impl PauseAfterCommit {
    /// `inner`, held `pause` after each commit.
    pub fn new(inner: Arc<dyn ObjectStore>, pause: Duration) -> Self {
        Self { inner, pause }
    }
}

/// Whether `location` is a commit's log entry (not a checkpoint or `_last_checkpoint`).
fn is_log_entry(location: &Path) -> bool {
    let mut parts = location.parts().collect::<Vec<_>>().into_iter().rev();
    let name = parts.next();
    let dir = parts.next();
    dir.is_some_and(|d| d.as_ref() == "_delta_log")
        && name.is_some_and(|n| {
            n.as_ref()
                .strip_suffix(".json")
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        })
}

impl std::fmt::Display for PauseAfterCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PauseAfterCommit({:?}, {})", self.pause, self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for PauseAfterCommit {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let commit = matches!(opts.mode, PutMode::Create) && is_log_entry(location);
        let put = self.inner.put_opts(location, payload, opts).await?;
        if commit {
            tracing::warn!(%location, pause = ?self.pause, "committed; pausing (fault injection)");
            tokio::time::sleep(self.pause).await;
        }
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
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
    use super::*;

    #[test]
    fn only_a_commits_log_entry_counts() {
        for (path, entry) in [
            ("raw/_delta_log/00000000000000000042.json", true),
            ("run/7/raw/_delta_log/00000000000000000000.json", true),
            (
                "raw/_delta_log/00000000000000000040.checkpoint.parquet",
                false,
            ),
            ("raw/_delta_log/_last_checkpoint", false),
            ("raw/date=2026-11-30/hour=14/x.json", false),
            ("raw/_delta_log/.json", false),
        ] {
            assert_eq!(is_log_entry(&Path::from(path)), entry, "{path}");
        }
    }
}
