//! `verdict-bench ingest-with-faults`: `verdict ingest` with fault injection for its crash
//! tests (`bench/tests/ingest_crash.rs`). A store whose every put waits a while, so that a
//! flush spends seconds between its first file and its commit; and a store that holds the
//! worker for a while right after a commit to a table's log has landed, before the worker
//! does anything else (the offset commit to Kafka is next), so that a test can kill the
//! process in that window deterministically.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use object_store::path::Path;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{ObjectStore, PutMode};
use verdict::ingest::IngestArgs;
use verdict_lake::{Observed, Observer};

/// Options of `verdict-bench ingest-with-faults`: those of `verdict ingest`, and the faults.
#[derive(Debug, Clone, Args)]
pub struct IngestWithFaultsArgs {
    /// The worker's options, as `verdict ingest` takes them.
    #[command(flatten)]
    pub ingest: IngestArgs,
    /// Wait this long before every put to the store.
    #[arg(long, default_value_t = 0)]
    pub put_delay_ms: u64,
    /// Wait this long after each commit to the raw table's log, before the offsets go to
    /// Kafka.
    #[arg(long, default_value_t = 0)]
    pub commit_pause_ms: u64,
}

/// Runs `verdict ingest` through the faulty store until a signal asks it to stop.
pub async fn run(args: IngestWithFaultsArgs) -> anyhow::Result<()> {
    let (put_delay, commit_pause) = (args.put_delay_ms, args.commit_pause_ms);
    verdict::ingest::run_through(args.ingest, move |mut store| {
        if put_delay > 0 {
            let slow = ThrottleConfig {
                wait_put_per_call: Duration::from_millis(put_delay),
                ..ThrottleConfig::default()
            };
            store = Arc::new(ThrottledStore::new(store, slow)) as Arc<dyn ObjectStore>;
        }
        if commit_pause > 0 {
            let pause = Duration::from_millis(commit_pause);
            store = Arc::new(PauseAfterCommit::new(store, pause)) as Arc<dyn ObjectStore>;
        }
        store
    })
    .await
}

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
