//! `Limiter::check`: one request in, one [`Decision`] out, and one event on the queue. This
//! is the one place that decides what happens when the shared store fails (the breaker
//! opens and the local fallback enforces limit / instance count) or this process is too
//! overloaded to ask it in time (the fallback decides that request, no breaker opens), what
//! becomes of the fallback's admissions (charged back to the store when it answers), and
//! what the policy's modes mean (shadow: decide, emit, allow; off and kill switch: allow,
//! emit, count nothing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};

use crate::algo::{CounterCheck, CounterState, Limits};
use crate::breaker::{Admit, Breaker, BreakerConfig, BreakerState};
use crate::charge_back::ChargeBack;
use crate::counter_store::CounterStore;
use crate::events::EventQueue;
use crate::key::LimitKey;
use crate::memory::MemoryStore;
use crate::metrics::LimiterMetrics;
use crate::policy::{LimitLookup, Mode, PolicyHandle, PolicySnapshot};
use crate::regions::{DEFAULT_SHARE_TTL, NearLimit, Share, ShareHandle, is_near_limit};
use verdict_schemas::clock::{Clock, SystemClock};

/// Where this limiter runs.
#[derive(Debug, Clone)]
pub struct LimiterConfig {
    /// The region whose counters decide (stamped on events).
    pub region: RegionId,
    /// This gateway instance's id (stamped on events).
    pub instance: u32,
    /// How many gateway instances share the limits: the local fallback enforces limit / N.
    pub instance_count: u32,
    /// The breaker in front of each shard of the shared store.
    pub breaker: BreakerConfig,
    /// Limit keys the local fallback keeps at most.
    pub fallback_max_keys: usize,
    /// The local fallback starts a key from this instance's part of what the store last
    /// said was left of it (true), not from a full part (false): a key near its limit when
    /// the store fails gets no fresh allowance. Costs one write to the fallback's memory
    /// per store decision, and the fallback holds every key seen below a full part (up to
    /// `fallback_max_keys`).
    pub fallback_from_store: bool,
    /// Limit keys whose fallback admissions are kept to be charged back to the store when
    /// it answers again; the requests of keys past this are never counted there (and are
    /// counted in `verdict_charges_dropped_total`).
    pub charge_max_keys: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            region: RegionId(0),
            instance: 0,
            instance_count: 1,
            breaker: BreakerConfig::default(),
            fallback_max_keys: 1_000_000,
            fallback_from_store: true,
            charge_max_keys: 100_000,
        }
    }
}

/// A gateway in one of several regions: the shares the reconcile job computed, and the
/// notes of near-limit keys it reports back (see [`crate::regions`]). Without it, a limiter
/// under a policy that lists regions enforces its region's static weight.
#[derive(Debug, Clone)]
pub struct Regional {
    /// The shares in force (kept fresh by `verdict_policy_store::spawn_share_refresher`).
    pub shares: ShareHandle,
    /// Near-limit notes (reported by `verdict_counters_redis::spawn_near_limit_reporter`).
    pub near: Arc<NearLimit>,
}

/// How often a regional limiter's background tasks run, and how long a share lives.
#[derive(Debug, Clone, Copy)]
pub struct RegionalTimings {
    /// Between polls of the region's share version.
    pub share_poll: Duration,
    /// Between near-limit reports to the region's Redis.
    pub report_every: Duration,
    /// A share not rewritten for this long gives way to the static weight.
    pub share_ttl: Duration,
}

impl Default for RegionalTimings {
    fn default() -> Self {
        Self {
            share_poll: Duration::from_secs(5),
            report_every: Duration::from_secs(1),
            share_ttl: DEFAULT_SHARE_TTL,
        }
    }
}

impl Regional {
    /// No shares yet (the static weights are in force) and no notes; the tasks that keep
    /// them are started by the caller (`verdict_gateway::regional::start`: the shares
    /// polled from the policy store, the notes reported to the region's Redis).
    pub fn new(share_ttl: Duration) -> Self {
        Self {
            shares: ShareHandle::new(share_ttl),
            near: Arc::new(NearLimit::default()),
        }
    }
}

/// One request, as the gateway identifies it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The caller's key id.
    pub key_id: KeyId,
    /// The route class of the path.
    pub route_class: RouteClassId,
    /// The caller's tier.
    pub tier: TierId,
    /// A stable attribute of the caller (client id, address) that places it on a sub-key
    /// when its key is split.
    pub caller: &'a [u8],
}

/// The limiter's answer. A denial is a value, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, denied (429) or would-deny (shadow mode: allowed).
    pub verdict: Verdict,
    /// Where the decision came from.
    pub source: DecisionSource,
    /// Which limit refused (for a would-deny too).
    pub denied_by: DeniedBy,
    /// Whole tokens left.
    pub remaining_tokens: u32,
    /// Requests left in the window.
    pub remaining_window: u32,
    /// When refused: ms until a request would pass.
    pub retry_after_ms: u32,
    /// The limits applied (none for kill switch, mode off, or an unknown tier/route).
    pub limits: Option<Limits>,
    /// The mode applied.
    pub mode: Option<Mode>,
    /// The policy version that decided.
    pub policy_version: u64,
    /// The decision time (the store's clock when it decided).
    pub now_ms: i64,
    /// The event emitted for this decision.
    pub event: DecisionEvent,
}

impl Decision {
    /// True unless the request is refused.
    pub fn is_allowed(&self) -> bool {
        self.verdict != Verdict::Denied
    }
}

/// The limiter of one gateway instance.
pub struct Limiter<S> {
    store: S,
    /// What the fallback admitted, by shard, until the shard answers again (placed again
    /// when handed over: finding a key's place costs less than keeping it).
    charges: ChargeBack<()>,
    fallback: MemoryStore,
    policy: PolicyHandle,
    /// One breaker per shard of the store ([`CounterStore::shards`]).
    breakers: Box<[Breaker]>,
    events: EventQueue,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    cfg: LimiterConfig,
    regional: Option<Regional>,
}

impl<S> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("cfg", &self.cfg)
            .field("breakers", &self.shard_breaker_states())
            .finish()
    }
}

impl<S> Limiter<S> {
    /// The shared counter store it decides with.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The state of each shard's breaker, by shard.
    pub fn shard_breaker_states(&self) -> Vec<BreakerState> {
        self.breakers.iter().map(Breaker::state).collect()
    }

    /// The most open of the shards' breakers: [`BreakerState::Open`] when any shard's
    /// breaker is open (with a store of one shard, its breaker's state).
    pub fn breaker_state(&self) -> BreakerState {
        self.breakers
            .iter()
            .map(Breaker::state)
            .max_by_key(|s| *s as u8)
            .unwrap_or(BreakerState::Closed)
    }
}

impl<S: CounterStore> Limiter<S> {
    /// A limiter deciding with `store`, under `policy`, emitting onto `events`.
    pub fn new(
        store: S,
        policy: PolicyHandle,
        events: EventQueue,
        metrics: Arc<LimiterMetrics>,
        cfg: LimiterConfig,
    ) -> Self {
        Self::with_clock(store, policy, events, metrics, cfg, Arc::new(SystemClock))
    }

    /// The same on a given clock (the fallback, the breaker and event times of decisions
    /// not made by the store use it).
    pub fn with_clock(
        store: S,
        policy: PolicyHandle,
        events: EventQueue,
        metrics: Arc<LimiterMetrics>,
        cfg: LimiterConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let breakers: Box<[Breaker]> = (0..store.shards().max(1))
            .map(|_| Breaker::new(cfg.breaker))
            .collect();
        Self {
            charges: ChargeBack::new(breakers.len(), cfg.charge_max_keys),
            store,
            fallback: MemoryStore::with_clock(cfg.fallback_max_keys, Arc::clone(&clock)),
            policy,
            breakers,
            events,
            metrics,
            clock,
            cfg,
            regional: None,
        }
    }

    /// The same limiter enforcing the shares in `regional` and reporting near-limit keys.
    pub fn with_regional(mut self, regional: Regional) -> Self {
        self.regional = Some(regional);
        self
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<LimiterMetrics> {
        &self.metrics
    }

    /// The policy handle (sources refresh it).
    pub fn policy(&self) -> &PolicyHandle {
        &self.policy
    }

    /// Decides one request.
    pub async fn check(&self, req: &Request<'_>) -> Decision {
        self.check_under(&self.policy.load(), req).await
    }

    /// Decides one request under `policy`: the snapshot the caller already resolved the
    /// request's route class and tier against, so one request sees one policy even when a
    /// new one is put in force meanwhile.
    pub async fn check_under(&self, policy: &PolicySnapshot, req: &Request<'_>) -> Decision {
        self.check_hits_under(policy, req, 1).await
    }

    /// Decides one request that counts as `hits` requests under `policy`: both limits must
    /// have room for all of them, and an admitted request takes them all (the bucket's
    /// tokens, the window's count, what the fallback charges back). Zero hits checks
    /// without counting: allowed unless the key is already past a limit
    /// ([`crate::algo::decide_hits`]). Envoy's `hits_addend`. The decision event is one
    /// event, whatever the hits.
    pub async fn check_hits_under(
        &self,
        policy: &PolicySnapshot,
        req: &Request<'_>,
        hits: u32,
    ) -> Decision {
        let version = policy.version();
        let (limits, mode, key) = match policy.resolve(&req.key_id, req.route_class, req.tier) {
            LimitLookup::KillSwitch => return self.pass(req, version, DecisionSource::KillSwitch),
            LimitLookup::Off => return self.pass(req, version, DecisionSource::PolicyOff),
            LimitLookup::Unknown => {
                self.metrics.unconfigured.inc();
                return self.pass(req, version, DecisionSource::PolicyOff);
            }
            LimitLookup::Check {
                limits,
                mode,
                sub_keys,
                ..
            } => {
                let key = LimitKey::new(req.key_id, req.route_class, req.tier);
                let key = if sub_keys > 1 {
                    key.split(sub_keys, req.caller)
                } else {
                    key
                };
                (limits, mode, key)
            }
        };
        // The policy's limits are global; with several regions this one enforces its share.
        let global = limits;
        let static_ppm = policy
            .is_multi_region()
            .then(|| policy.region_static_ppm(self.cfg.region));
        let limits = if let Some(static_ppm) = static_ppm {
            let share = match &self.regional {
                Some(r) => r.shares.share(
                    &(req.key_id, req.route_class, req.tier),
                    self.clock.now_ms(),
                    static_ppm,
                ),
                None => Share::uniform(static_ppm),
            };
            limits.scaled(share.bucket_ppm, share.window_ppm)
        } else {
            limits
        };

        let (outcome, source) = self.decide(&key, &limits, hits).await;
        if let Some(r) = &self.regional
            && source == DecisionSource::CounterStore
            && is_near_limit(
                outcome.allowed,
                outcome.remaining_tokens,
                outcome.remaining_window,
                &limits,
                // The static limits, scaled only when the near check runs.
                &static_ppm.map_or(limits, |p| global.scaled(p, p)),
            )
            && !r.near.record((req.key_id, req.route_class, req.tier))
        {
            self.metrics.near_limit_dropped.inc();
        }
        let denied_by = DeniedBy {
            bucket: outcome.denied_by_bucket,
            window: outcome.denied_by_window,
        };
        let verdict = match (outcome.allowed, mode) {
            (true, _) => Verdict::Allowed,
            (false, Mode::Shadow) => Verdict::WouldDeny,
            (false, _) => Verdict::Denied,
        };
        let event = DecisionEvent {
            event_time_ms: outcome.now_ms,
            key_id: req.key_id,
            route_class: req.route_class,
            tier: req.tier,
            region: self.cfg.region,
            gateway_instance: self.cfg.instance,
            verdict,
            denied_by,
            source,
            remaining_tokens: outcome.remaining_tokens,
            remaining_window: outcome.remaining_window,
            retry_after_ms: outcome.retry_after_ms,
            window_quota: limits.quota,
            policy_version: version,
            sub_key: key.sub_key,
            sub_keys: key.sub_keys,
        };
        self.finish(Decision {
            verdict,
            source,
            denied_by,
            remaining_tokens: outcome.remaining_tokens,
            remaining_window: outcome.remaining_window,
            retry_after_ms: if verdict == Verdict::Denied {
                outcome.retry_after_ms
            } else {
                0
            },
            limits: Some(limits),
            mode: Some(mode),
            policy_version: version,
            now_ms: outcome.now_ms,
            event,
        })
    }

    /// Asks the store, unless the breaker of the key's shard is open; on failure, or while
    /// open, the local fallback decides at limit / instance count, from this instance's
    /// part of what the store last said was left of the key. So does it when the deadline
    /// passed while the request waited in this process (overload), without counting that
    /// against the store. What the fallback admits is charged back to the store with the
    /// shard's next answer.
    async fn decide(
        &self,
        key: &LimitKey,
        limits: &Limits,
        hits: u32,
    ) -> (CounterCheck, DecisionSource) {
        let now = self.clock.now_ms();
        let at = self.store.locate(key);
        let shard = at.shard.min(self.breakers.len() - 1);
        let breaker = &self.breakers[shard];
        let admit = breaker.admit(now);
        if admit != Admit::Fallback {
            let started = Instant::now();
            let result = self.store.check_located(key, at.place, limits, hits).await;
            self.metrics
                .store_latency
                .observe(started.elapsed().as_secs_f64());
            let answered_ms = self.clock.now_ms();
            match result {
                Ok(outcome) => {
                    self.record(breaker, admit, true, answered_ms);
                    if self.cfg.fallback_from_store && self.store.can_fail() {
                        let n = self.cfg.instance_count;
                        let share = limits.divided(n);
                        let part =
                            CounterState::from_store_answer(&outcome, &share, n, answered_ms);
                        self.fallback.seed(key, part, &share);
                    }
                    if self.charges.waiting(shard) {
                        self.charge_back(shard, answered_ms);
                    }
                    return (outcome, DecisionSource::CounterStore);
                }
                Err(e) => {
                    self.metrics
                        .store_errors
                        .with_label_values(&[e.kind()])
                        .inc();
                    if e.is_overload() {
                        self.metrics.overload_decisions.inc();
                        if admit == Admit::Probe {
                            breaker.release_probe(answered_ms);
                        }
                    } else {
                        self.record(breaker, admit, false, answered_ms);
                    }
                    tracing::debug!(error = %e, cause = ?std::error::Error::source(&e), "the counter store did not decide; the local fallback does");
                }
            }
        }
        self.metrics.fallback_decisions.inc();
        let share = limits.divided(self.cfg.instance_count);
        let outcome = self.fallback.decide(key, &share, hits);
        if outcome.allowed
            && hits > 0
            && self.store.can_fail()
            && !self.charges.add(shard, key, (), limits, hits, now)
        {
            self.metrics.charges_dropped.inc_by(u64::from(hits));
        }
        (outcome, DecisionSource::LocalFallback)
    }

    /// Records a store call's outcome on its shard's breaker, exporting a change.
    fn record(&self, breaker: &Breaker, admit: Admit, ok: bool, now_ms: i64) {
        let before = breaker.state();
        breaker.record(admit, ok, now_ms);
        let after = breaker.state();
        if after != before {
            if after == BreakerState::Open {
                self.metrics.breaker_openings.inc();
            }
            self.breaker_changed();
        }
    }

    /// Hands `shard`'s waiting charges to the store, keeping what it cannot take now.
    fn charge_back(&self, shard: usize, now_ms: i64) {
        let (charges, expired) = self.charges.take(shard, now_ms);
        let offered: u64 = charges.iter().map(|c| u64::from(c.count)).sum();
        let placed = charges
            .into_iter()
            .map(|c| c.at(self.store.locate(&c.key).place))
            .collect();
        let refused: Vec<_> = self
            .store
            .charge(placed)
            .into_iter()
            .map(|c| c.at(()))
            .collect();
        let kept: u64 = refused.iter().map(|c| u64::from(c.count)).sum();
        self.metrics.charged_back.inc_by(offered - kept);
        let dropped = expired + self.charges.put_back(shard, refused);
        if dropped > 0 {
            self.metrics.charges_dropped.inc_by(dropped);
        }
    }

    /// Exports the breakers after one changed: the most open state, and how many are open.
    fn breaker_changed(&self) {
        self.metrics.breaker_state.set(self.breaker_state() as i64);
        let open = self
            .breakers
            .iter()
            .filter(|b| b.state() == BreakerState::Open)
            .count();
        self.metrics
            .breaker_open_shards
            .set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// Allow without counting (kill switch, mode off, unknown tier or route class).
    fn pass(&self, req: &Request<'_>, version: u64, source: DecisionSource) -> Decision {
        let now = self.clock.now_ms();
        let event = DecisionEvent {
            event_time_ms: now,
            key_id: req.key_id,
            route_class: req.route_class,
            tier: req.tier,
            region: self.cfg.region,
            gateway_instance: self.cfg.instance,
            verdict: Verdict::Allowed,
            denied_by: DeniedBy::NONE,
            source,
            remaining_tokens: 0,
            remaining_window: 0,
            retry_after_ms: 0,
            window_quota: 0,
            policy_version: version,
            sub_key: 0,
            sub_keys: 1,
        };
        self.finish(Decision {
            verdict: Verdict::Allowed,
            source,
            denied_by: DeniedBy::NONE,
            remaining_tokens: 0,
            remaining_window: 0,
            retry_after_ms: 0,
            limits: None,
            mode: None,
            policy_version: version,
            now_ms: now,
            event,
        })
    }

    fn finish(&self, d: Decision) -> Decision {
        self.metrics
            .decisions
            .with_label_values(&[d.verdict.as_str(), d.source.as_str()])
            .inc();
        self.events.offer(d.event);
        d
    }
}
