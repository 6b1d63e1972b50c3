//! The gateway's side of the near-limit notes (`verdict_limiter::regions`): every report
//! interval, the notes are added to quarter-second buckets in the region's Redis, where the
//! reconcile job reads them.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use verdict_limiter::periodic::spawn_every;
use verdict_limiter::regions::{
    NEAR_BUCKET_TTL_MS, NearLimit, ShareKey, near_bucket_key, near_field,
};
use verdict_limiter::{Clock, LimiterMetrics};

/// Every `every`, adds the gateway's near-limit notes to its region's Redis. Off the
/// decision path: a failed report is logged and counted, never retried (the next one
/// carries the next notes).
pub fn spawn_near_limit_reporter(
    near: Arc<NearLimit>,
    redis: Client,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    spawn_every(every, move || {
        let notes = near.drain();
        let (redis, metrics, clock) = (redis.clone(), Arc::clone(&metrics), Arc::clone(&clock));
        async move {
            if notes.is_empty() {
                return;
            }
            let total: u64 = notes.iter().map(|(_, n)| n).sum();
            match report(&redis, &notes, clock.now_ms()).await {
                Ok(()) => metrics.near_limit_reported.inc_by(total),
                Err(e) => {
                    metrics.near_limit_dropped.inc_by(total);
                    tracing::warn!(error = %e, keys = notes.len(), "near-limit report failed; the reconcile job will not see these requests");
                }
            }
        }
    })
}

async fn report(redis: &Client, notes: &[(ShareKey, u64)], now_ms: i64) -> Result<(), Error> {
    let bucket = near_bucket_key(now_ms);
    let pipe = redis.pipeline();
    for (key, n) in notes {
        let _: () = pipe
            .hincrby(bucket.as_str(), near_field(key), *n as i64)
            .await?;
    }
    let _: () = pipe
        .pexpire(bucket.as_str(), NEAR_BUCKET_TTL_MS, None)
        .await?;
    let _: Vec<Value> = pipe.all().await?;
    Ok(())
}
