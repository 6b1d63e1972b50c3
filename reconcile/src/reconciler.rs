//! The regional reconcile: every 30 seconds (by default), for each key some region found
//! near its limit, read every region's usage, compute the global total and write new shares
//! so that their sum never exceeds the global limit and the region carrying the key's
//! traffic gets most of it.
//!
//! One round:
//!
//! 1. **Which keys.** Each region's gateways report the requests of keys near their
//!    regional limit into quarter-second buckets in the region's own Redis (`rl:near:<bucket>`,
//!    see `verdict_counters_redis::near_limit`). The round reads the buckets of the last interval from
//!    every region: only those keys, never a scan of the key space, and each region's
//!    *demand* for them (requests seen while near the limit).
//! 2. **Usage.** For each such key, each region's sliding-window count (`HGET` of its
//!    counter, summed over sub-keys of a split key).
//! 3. **Shares** ([`compute_shares`]). Weights: demand, with a floor of the static weight
//!    (10 % of it by default) so an idle region can start. Bucket share = weight. Window
//!    share = (own usage + weight × what is left of the global quota) / quota, so the shares
//!    of the quota sum to the whole and no region is handed what another already used.
//! 4. **Write** ([`ShareRounds::write_round`]): one transaction; every region gets a row for
//!    every key of the round (a region without a row would enforce its static weight and
//!    the sum could exceed the whole). A share that grows takes effect `increase_delay`
//!    later, a shrinking one at the gateways' next poll, so the sum in force never exceeds
//!    the whole while gateways poll in time.
//!
//! Failure: a region whose Redis does not answer keeps its last share (the others share
//! what is left). Once it has not been read for `stale_after`, its share moves linearly
//! back to its static weight over `decay`. The job never sits on a decision path: gateways
//! only read the shares it wrote, and without it every share returns to its static weight
//! when its rows expire (`share_ttl`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use std::sync::Arc;

pub use verdict_limiter::regions::{Reading, RegionInput, compute_shares};
use verdict_limiter::regions::{Share, ShareEntry, ShareKey, ShareRow};
use verdict_limiter::{LimitLookup, PolicySnapshot, PolicySource};
use verdict_policy_store::PolicyStoreError;
use verdict_schemas::RegionId;

use crate::metrics::ReconcileMetrics;
use crate::region_counters::RegionCounters;
use crate::round_log::{RoundLog, RoundRecord};
use crate::share_rounds::ShareRounds;

/// How the reconcile runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReconcileConfig {
    /// Between rounds; also how far back a round looks for near-limit keys.
    pub interval: Duration,
    /// How long after a round a share that grows takes effect (at least two of the
    /// gateways' share polls, so every region has applied the shares that shrank).
    pub increase_delay: Duration,
    /// A region not read for this long starts returning to its static weight.
    pub stale_after: Duration,
    /// Over how long it returns.
    pub decay: Duration,
    /// Rows not rewritten for this long are deleted (gateways ignore them from then too).
    pub share_ttl: Duration,
    /// Part of the static weight every region keeps in the demand weights (0 to 1).
    pub floor: f64,
    /// Deadline of each read of a region's Redis.
    pub redis_timeout: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            increase_delay: Duration::from_secs(12),
            stale_after: Duration::from_secs(90),
            decay: Duration::from_secs(300),
            share_ttl: verdict_limiter::regions::DEFAULT_SHARE_TTL,
            floor: 0.1,
            redis_timeout: Duration::from_millis(500),
        }
    }
}

impl ReconcileConfig {
    /// What a round applies of these settings, on the gateways' clock (for regional
    /// limiters living in one process: [`verdict_limiter::round_in_process`]).
    pub fn round_settings(&self) -> verdict_limiter::RoundSettings {
        verdict_limiter::RoundSettings {
            increase_delay_ms: self.increase_delay.as_millis() as i64,
            share_ttl_ms: self.share_ttl.as_millis() as i64,
            floor: self.floor,
        }
    }
}

/// One region as the job reaches it.
#[derive(Debug, Clone)]
pub struct RegionEndpoint {
    /// The region's id (as in the policy's `[[regions]]`).
    pub id: RegionId,
    /// Its counters.
    pub counters: RegionCounters,
}

/// A stale region's share on its way back to its static weight: `last` until
/// `stale_after` has passed since it was last read, then linearly to `static_ppm` over
/// `decay`.
pub fn decayed(last: Share, static_ppm: u32, unseen: Duration, cfg: &ReconcileConfig) -> Share {
    let Some(late) = unseen.checked_sub(cfg.stale_after) else {
        return last;
    };
    let a = if cfg.decay.is_zero() {
        1.0
    } else {
        (late.as_secs_f64() / cfg.decay.as_secs_f64()).min(1.0)
    };
    let mix = |v: u32| (f64::from(v) + a * (f64::from(static_ppm) - f64::from(v))).floor() as u32;
    Share {
        bucket_ppm: mix(last.bucket_ppm),
        window_ppm: mix(last.window_ppm),
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundOutcome {
    /// Keys near their limit in some region.
    pub keys: usize,
    /// Share rows written.
    pub rows: usize,
    /// Regions read.
    pub reachable: Vec<RegionId>,
    /// Regions that could not be read (they kept their last share).
    pub unreachable: Vec<RegionId>,
}

/// Why a round failed (nothing was written).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The policy could not be read.
    #[error("reading the policy: {0}")]
    Policy(verdict_limiter::SourceError),
    /// The policy lists regions the job was not given.
    #[error("the policy lists regions {0:?} that the job has no Redis for; no shares written")]
    UnknownRegions(Vec<u16>),
    /// The shares could not be read or written.
    #[error("policy store (shares): {0}")]
    Shares(PolicyStoreError),
}

/// The reconcile job.
#[derive(Debug)]
pub struct Reconciler {
    regions: Vec<RegionEndpoint>,
    policy: Arc<dyn PolicySource>,
    shares: ShareRounds,
    cfg: ReconcileConfig,
    last_policy: Option<PolicySnapshot>,
    metrics: ReconcileMetrics,
    log: Option<RoundLog>,
    /// The time the rounds run at, when the job runs them on its schedule.
    clock: verdict_lake::Clock,
}

impl Reconciler {
    /// A job over `regions` (every region of the policy), reading the global limits from
    /// `policy` and writing the shares to `shares`.
    pub fn new(
        regions: Vec<RegionEndpoint>,
        policy: Arc<dyn PolicySource>,
        shares: ShareRounds,
        cfg: ReconcileConfig,
    ) -> Self {
        Self {
            regions,
            policy,
            shares,
            cfg,
            last_policy: None,
            metrics: ReconcileMetrics::new(),
            log: None,
            clock: Arc::new(verdict_schemas::SystemClock),
        }
    }

    /// The same job running its scheduled rounds at `clock`'s time.
    #[must_use]
    pub fn with_clock(mut self, clock: verdict_lake::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The same job recording its rounds in the lake (`reconcile_rounds`, see
    /// [`crate::round_log`]).
    pub fn with_log(mut self, log: RoundLog) -> Self {
        self.log = Some(log);
        self
    }

    /// Appends the rounds not yet in the lake (the job does every
    /// [`RoundLog::every`] rounds and when it stops).
    ///
    /// # Errors
    /// When the lake refuses them (they stay pending).
    pub async fn append_rounds(
        &mut self,
        now_ms: i64,
    ) -> Result<usize, verdict_rollup::RollupError> {
        match &mut self.log {
            Some(log) => log.append(now_ms).await,
            None => Ok(0),
        }
    }

    /// The job's metrics (`verdict_job_*{job="reconcile"}`, `verdict_reconcile_*`).
    pub fn metrics(&self) -> &ReconcileMetrics {
        &self.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &ReconcileConfig {
        &self.cfg
    }

    /// One round at `now_ms`.
    ///
    /// # Errors
    /// When the policy was never read, or the policy store refuses the shares; a region
    /// that cannot be read is not an error (it keeps its share).
    pub async fn run_once(&mut self, now_ms: i64) -> Result<RoundOutcome, ReconcileError> {
        match self.policy.load().await {
            Ok(p) => self.last_policy = Some(p),
            Err(e) => match &self.last_policy {
                Some(_) => {
                    tracing::warn!(error = %e, "policy not re-read; reconciling under the last one")
                }
                None => return Err(ReconcileError::Policy(e)),
            },
        }
        let Some(policy) = self.last_policy.as_ref() else {
            return Ok(RoundOutcome::default());
        };
        // A region of the policy the job cannot reach at all would enforce its static weight
        // on top of the shares computed for the others: no round until it is given.
        let missing: Vec<u16> = policy
            .document()
            .regions
            .iter()
            .filter(|r| !self.regions.iter().any(|e| e.id.0 == r.id))
            .map(|r| r.id)
            .collect();
        if !missing.is_empty() {
            return Err(ReconcileError::UnknownRegions(missing));
        }
        let from = now_ms - self.cfg.interval.as_millis() as i64;

        // 1. The keys near their limit, and each region's demand for them (every region at
        //    once: a round costs the slowest region's round trips, not their sum).
        let near: Vec<Option<HashMap<ShareKey, u64>>> =
            futures::future::join_all(self.regions.iter().map(|r| async move {
                match r.counters.near_limit(from, now_ms).await {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::warn!(region = r.id.0, error = %e, "region not reachable; it keeps its last shares");
                        None
                    }
                }
            }))
            .await;
        let mut keys: Vec<ShareKey> = near
            .iter()
            .flatten()
            .flat_map(|m| m.keys().copied())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        keys.sort();
        // Keys the policy counts (a kill switch, mode off or an unknown tier: no share).
        let checked: Vec<(ShareKey, u32, u8, i64)> = keys
            .iter()
            .filter_map(|key| match policy.resolve(&key.0, key.1, key.2) {
                LimitLookup::Check {
                    limits, sub_keys, ..
                } => Some((
                    *key,
                    limits.quota.saturating_mul(u32::from(sub_keys)),
                    sub_keys,
                    limits.window_ms,
                )),
                _ => None,
            })
            .collect();

        // 2. What each region enforces now.
        let (prior, last_seen) = self
            .shares
            .read_for(&keys)
            .await
            .map_err(ReconcileError::Shares)?;
        let prior: HashMap<(RegionId, ShareKey), ShareEntry> = prior
            .into_iter()
            .map(|r| ((r.region, r.key), r.entry))
            .collect();

        // 3. Usage in every region at once, and the new shares.
        let wanted: Vec<(ShareKey, u8, i64)> =
            checked.iter().map(|(k, _, s, w)| (*k, *s, *w)).collect();
        let usage: Vec<Option<Vec<f64>>> =
            futures::future::join_all(self.regions.iter().zip(&near).map(|(r, n)| {
                let wanted = &wanted;
                async move {
                    n.as_ref()?;
                    match r.counters.window_used(wanted, now_ms).await {
                        Ok(u) => Some(u),
                        Err(e) => {
                            tracing::warn!(region = r.id.0, error = %e, "region stopped answering; it keeps its last shares");
                            None
                        }
                    }
                }
            }))
            .await;
        let reachable: Vec<bool> = usage.iter().map(Option::is_some).collect();
        let ttl_ms = self.cfg.share_ttl.as_millis() as i64;
        let mut rows = Vec::new();
        for (k, (key, quota, ..)) in checked.iter().enumerate() {
            let mut inputs = Vec::with_capacity(self.regions.len());
            for (i, r) in self.regions.iter().enumerate() {
                let static_ppm = policy.region_static_ppm(r.id);
                let last = prior
                    .get(&(r.id, *key))
                    .and_then(|e| e.in_force_within(now_ms, ttl_ms))
                    .unwrap_or(Share::uniform(static_ppm));
                let reading = usage[i].as_ref().map(|u| Reading {
                    used: u[k],
                    demand: near[i]
                        .as_ref()
                        .and_then(|m| m.get(key).copied())
                        .unwrap_or(0),
                });
                let last = match reading {
                    Some(_) => last,
                    None => {
                        let unseen = last_seen.get(&r.id).map_or(Duration::MAX, |&t| {
                            Duration::from_millis((now_ms - t).max(0) as u64)
                        });
                        decayed(last, static_ppm, unseen, &self.cfg)
                    }
                };
                inputs.push(RegionInput {
                    static_ppm,
                    reading,
                    last,
                });
            }
            let shares = compute_shares(*quota, &inputs, self.cfg.floor);
            for ((r, input), share) in self.regions.iter().zip(&inputs).zip(shares) {
                rows.push(ShareRow {
                    region: r.id,
                    key: *key,
                    entry: ShareEntry {
                        before: input.last,
                        after: share,
                        effective_ms: now_ms + self.cfg.increase_delay.as_millis() as i64,
                        computed_ms: now_ms,
                    },
                });
            }
        }

        // 4. One transaction.
        let ids: Vec<RegionId> = self.regions.iter().map(|r| r.id).collect();
        let (seen, unseen): (Vec<_>, Vec<_>) = ids.iter().zip(&reachable).partition(|(_, ok)| **ok);
        let seen: Vec<RegionId> = seen.into_iter().map(|(id, _)| *id).collect();
        let unseen: Vec<RegionId> = unseen.into_iter().map(|(id, _)| *id).collect();
        self.shares
            .write_round(&rows, &ids, &seen, now_ms, self.cfg.share_ttl)
            .await
            .map_err(ReconcileError::Shares)?;
        let outcome = RoundOutcome {
            keys: keys.len(),
            rows: rows.len(),
            reachable: seen,
            unreachable: unseen,
        };
        if let Some(log) = &mut self.log {
            log.push(RoundRecord::of(now_ms, &self.cfg, &outcome));
        }
        Ok(outcome)
    }

    /// Rounds every interval until `stop` resolves. A failed round is logged and the next
    /// one runs on time.
    pub async fn run(&mut self, stop: impl std::future::Future<Output = ()>) {
        let mut ticker = tokio::time::interval(self.cfg.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => {
                    self.append_logged().await;
                    return;
                }
                _ = ticker.tick() => {}
            }
            let started = Instant::now();
            let now = self.clock.now_ms();
            let result = self.run_once(now).await;
            self.metrics.run.record_run(
                "reconcile",
                started.elapsed(),
                result.is_ok(),
                self.clock.now_ms(),
            );
            match result {
                Ok(o) => {
                    self.metrics.keys.set(o.keys as i64);
                    self.metrics.unreachable.set(o.unreachable.len() as i64);
                    tracing::info!(
                        keys = o.keys,
                        rows = o.rows,
                        unreachable = ?o.unreachable.iter().map(|r| r.0).collect::<Vec<_>>(),
                        seconds = started.elapsed().as_secs_f64(),
                        "reconcile round"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "reconcile round failed; the shares in force stay")
                }
            }
            if self.log.as_ref().is_some_and(RoundLog::due) {
                self.append_logged().await;
            }
        }
    }

    async fn append_logged(&mut self) {
        let now = self.clock.now_ms();
        match self.append_rounds(now).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rounds = n, "reconcile_rounds appended to the lake"),
            Err(e) => {
                tracing::warn!(error = %e, pending = self.log.as_ref().map_or(0, RoundLog::pending), "reconcile_rounds not appended; the rounds stay for the next append")
            }
        }
    }
}

impl RoundRecord {
    /// The record of a round at `time_ms` that did `outcome` under `cfg`.
    pub fn of(time_ms: i64, cfg: &ReconcileConfig, outcome: &RoundOutcome) -> Self {
        Self {
            time_ms,
            interval_ms: cfg.interval.as_millis() as i64,
            increase_delay_ms: cfg.increase_delay.as_millis() as i64,
            share_ttl_ms: cfg.share_ttl.as_millis() as i64,
            floor: cfg.floor,
            keys: u32::try_from(outcome.keys).unwrap_or(u32::MAX),
            share_rows: u32::try_from(outcome.rows).unwrap_or(u32::MAX),
            unreachable_regions: u16::try_from(outcome.unreachable.len()).unwrap_or(u16::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_limiter::algo::PPM;

    const THIRD: u32 = PPM / 3;

    fn input(used: f64, demand: u64) -> RegionInput {
        RegionInput {
            static_ppm: THIRD,
            reading: Some(Reading { used, demand }),
            last: Share::uniform(THIRD),
        }
    }

    fn sums(s: &[Share]) -> (u32, u32) {
        (
            s.iter().map(|x| x.bucket_ppm).sum(),
            s.iter().map(|x| x.window_ppm).sum(),
        )
    }

    #[test]
    fn the_region_carrying_the_traffic_gets_most_and_the_sum_stays_whole() {
        let s = compute_shares(
            1_000,
            &[input(0.0, 0), input(100.0, 900), input(0.0, 0)],
            0.1,
        );
        let (b, w) = sums(&s);
        assert!(b <= PPM && b > PPM - 10, "{s:?}");
        assert!(w <= PPM && w > PPM - 10, "{s:?}");
        // 90 % of the weight by demand, plus its part of the 10 % floor.
        assert!(s[1].bucket_ppm > 930_000, "{s:?}");
        // Its window share: its own 100 plus ~93 % of the 900 left.
        assert!((935_000..=940_000).contains(&s[1].window_ppm), "{s:?}");
        assert_eq!(s[0], s[2]);
    }

    #[test]
    fn usage_already_spent_stays_with_the_region_that_spent_it() {
        // Traffic moved from region 0 (which used 600 of 1,000) to region 1.
        let s = compute_shares(
            1_000,
            &[input(600.0, 0), input(10.0, 500), input(0.0, 0)],
            0.1,
        );
        let (b, w) = sums(&s);
        assert!(b <= PPM && w <= PPM, "{s:?}");
        assert!(s[0].window_ppm >= 600_000, "{s:?}");
        assert!(s[1].bucket_ppm > 900_000, "{s:?}");
        // Region 1 gets most of the 390 left, beyond its own 10.
        assert!(s[1].window_ppm > 10_000 + 350_000, "{s:?}");
        // Over the quota: each keeps exactly what it used, in proportion.
        let s = compute_shares(
            1_000,
            &[input(900.0, 10), input(300.0, 10), input(0.0, 0)],
            0.1,
        );
        assert_eq!(s[0].window_ppm, 750_000);
        assert_eq!(s[1].window_ppm, 250_000);
        assert_eq!(s[2].window_ppm, 0);
    }

    #[test]
    fn an_unreachable_region_keeps_its_share_and_the_others_share_the_rest() {
        let down = RegionInput {
            static_ppm: THIRD,
            reading: None,
            last: Share {
                bucket_ppm: 500_000,
                window_ppm: 400_000,
            },
        };
        let s = compute_shares(1_000, &[input(0.0, 0), input(50.0, 100), down], 0.1);
        assert_eq!(s[2], down.last);
        let (b, w) = sums(&s);
        assert!(b <= PPM && w <= PPM, "{s:?}");
        assert!(s[0].bucket_ppm + s[1].bucket_ppm <= 500_000, "{s:?}");
        assert!(s[1].bucket_ppm > 450_000, "{s:?}");
    }

    #[test]
    fn without_demand_the_static_weights_apply() {
        let s = compute_shares(1_000, &[input(0.0, 0), input(0.0, 0), input(0.0, 0)], 0.1);
        assert!(
            s.iter()
                .all(|x| x.bucket_ppm == THIRD && x.window_ppm == THIRD),
            "{s:?}"
        );
    }

    #[test]
    fn a_stale_region_returns_to_its_static_weight() {
        let cfg = ReconcileConfig {
            stale_after: Duration::from_secs(90),
            decay: Duration::from_secs(300),
            ..ReconcileConfig::default()
        };
        let last = Share::uniform(900_000);
        assert_eq!(decayed(last, THIRD, Duration::from_secs(60), &cfg), last);
        let half = decayed(last, THIRD, Duration::from_secs(240), &cfg);
        assert_eq!(half.bucket_ppm, (900_000 + THIRD) / 2);
        assert_eq!(
            decayed(last, THIRD, Duration::from_secs(400), &cfg),
            Share::uniform(THIRD)
        );
        assert_eq!(
            decayed(last, THIRD, Duration::MAX, &cfg),
            Share::uniform(THIRD)
        );
    }
}
