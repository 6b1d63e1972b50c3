//! Fault injection for the crash tests of `verdict ingest` (hidden options): a store that
//! holds the worker for a while right after a commit to a table's log has landed, before
//! the worker does anything else (the offset commit to Kafka is next), so that a test can
//! kill the process in that window deterministically.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, PutMode};
use verdict_lake::{Observed, Observer};

/// `inner`, except that a put creating a log entry (`…/_delta_log/<version>.json`, written
/// with `PutMode::Create`) returns only after `pause` once it has succeeded:
/// [`PauseAfterCommit::new`] makes it.
#[derive(Debug)]
pub struct PauseAfterCommit {
    pause: Duration,
}

impl PauseAfterCommit {
    /// `inner`, held `pause` after each commit.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: Arc<dyn ObjectStore>, pause: Duration) -> Observed<PauseAfterCommit> {
        Observed::new(inner, Self { pause })
    }
}

impl Observer for PauseAfterCommit {
    fn name(&self) -> &str {
        "PauseAfterCommit"
    }

    async fn written(&self, location: &Path, mode: &PutMode) {
        if matches!(mode, PutMode::Create) && is_log_entry(location) {
            tracing::warn!(%location, pause = ?self.pause, "committed; pausing (fault injection)");
            tokio::time::sleep(self.pause).await;
        }
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
