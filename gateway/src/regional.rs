//! A region's part in a multi-region policy: the shares this region enforces, polled from
//! the policy store, and the near-limit notes it reports to its Redis for the reconcile
//! job.

use std::sync::Arc;

use verdict_counters_redis::spawn_near_limit_reporter;
use verdict_limiter::{Clock, LimiterMetrics, Regional, RegionalTimings};
use verdict_policy_store::{PgShares, spawn_share_refresher};
use verdict_schemas::RegionId;

/// `region`'s shares and near-limit notes, with the two tasks that keep them: the shares
/// polled from `shares`, the notes reported to the region's Redis `redis`.
pub fn start(
    shares: PgShares,
    region: RegionId,
    redis: fred::prelude::Client,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    timings: RegionalTimings,
) -> Regional {
    let regional = Regional::new(timings.share_ttl);
    spawn_share_refresher(
        shares,
        region,
        regional.shares.clone(),
        Arc::clone(&metrics),
        timings.share_poll,
    );
    spawn_near_limit_reporter(
        Arc::clone(&regional.near),
        redis,
        metrics,
        clock,
        timings.report_every,
    );
    regional
}
