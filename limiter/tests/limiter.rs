//! `Limiter::check` on the memory store and a fake clock: the modes, the kill switches, one
//! event per decision, the queue that drops instead of blocking, the breaker and the local
//! fallback (with a store that fails on purpose), and the HTTP answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use verdict_limiter::breaker::{BreakerConfig, BreakerState};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Charge, Checked, CounterStore, FakeClock, Limiter, LimiterConfig, LimiterMetrics, Limits,
    Located, MemoryStore, PolicyHandle, PolicySnapshot, Request, StoreError, event_queue,
    http_answer,
};
use verdict_limiter::{EventReceiver, LimitKey};
use verdict_schemas::{DecisionSource, KeyId, RegionId, RouteClassId, TierId, Verdict};

const T0: i64 = 1_796_047_200_000;

const POLICY: &str = include_str!("../fixtures/policies/limiter.toml");

fn policy(edit: impl FnOnce(&mut verdict_limiter::PolicyDocument)) -> PolicySnapshot {
    let mut doc = parse_toml(POLICY).unwrap();
    edit(&mut doc);
    PolicySnapshot::build(doc).unwrap()
}

struct Rig<S> {
    limiter: Limiter<S>,
    events: EventReceiver,
    clock: FakeClock,
}

fn rig_with<S: CounterStore>(
    store: S,
    snapshot: PolicySnapshot,
    queue: usize,
    cfg: LimiterConfig,
    clock: FakeClock,
) -> Rig<S> {
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, events) = event_queue(queue, Arc::clone(&metrics));
    let limiter = Limiter::with_clock(
        store,
        PolicyHandle::new(snapshot, T0),
        queue,
        metrics,
        cfg,
        Arc::new(clock.clone()),
    );
    Rig {
        limiter,
        events,
        clock,
    }
}

fn rig(snapshot: PolicySnapshot) -> Rig<MemoryStore> {
    let clock = FakeClock::at(T0);
    let store = MemoryStore::with_clock(10_000, Arc::new(clock.clone()));
    rig_with(
        store,
        snapshot,
        10_000,
        LimiterConfig {
            region: RegionId(2),
            instance: 7,
            ..LimiterConfig::default()
        },
        clock,
    )
}

fn key(last: u8) -> KeyId {
    let mut k = [0u8; 16];
    k[15] = last;
    KeyId(k)
}

fn req(k: u8, tier: u8) -> Request<'static> {
    Request {
        key_id: key(k),
        route_class: RouteClassId(0),
        tier: TierId(tier),
        caller: b"client",
    }
}

/// A breaker that opens on the second failure in a row and stays open a second (the fake
/// clock stands still: the failures need not span any time).
fn breaker_after_two_failures() -> BreakerConfig {
    BreakerConfig {
        failure_threshold: 2,
        failing_for: Duration::ZERO,
        open_for: Duration::from_secs(1),
    }
}

#[tokio::test]
async fn enforce_denies_past_the_burst_and_every_decision_emits_one_event() {
    let mut r = rig(policy(|_| {}));
    let mut verdicts = Vec::new();
    for _ in 0..4 {
        verdicts.push(r.limiter.check(&req(1, 0)).await);
    }
    assert_eq!(
        verdicts.iter().map(|d| d.verdict).collect::<Vec<_>>(),
        [
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Denied
        ]
    );
    let denied = &verdicts[3];
    assert!(denied.denied_by.bucket && !denied.denied_by.window);
    assert_eq!(
        (
            denied.retry_after_ms,
            denied.remaining_tokens,
            denied.remaining_window
        ),
        (1000, 0, 97)
    );
    assert_eq!(denied.source, DecisionSource::CounterStore);

    for d in &verdicts {
        let e = r.events.try_recv().expect("one event per decision");
        assert_eq!(e, d.event);
        assert_eq!(
            (
                e.region,
                e.gateway_instance,
                e.policy_version,
                e.window_quota
            ),
            (RegionId(2), 7, 3, 100)
        );
    }
    assert!(r.events.try_recv().is_none());

    // A second later one token is back.
    r.clock.advance(1_000);
    assert!(r.limiter.check(&req(1, 0)).await.is_allowed());
}

#[tokio::test]
async fn shadow_mode_decides_emits_and_allows() {
    let mut r = rig(policy(|_| {}));
    let mut out = Vec::new();
    for _ in 0..4 {
        out.push(r.limiter.check(&req(1, 1)).await);
    }
    assert_eq!(
        out.iter().map(|d| d.verdict).collect::<Vec<_>>(),
        [
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::WouldDeny,
            Verdict::WouldDeny
        ]
    );
    assert!(out.iter().all(|d| d.is_allowed()));
    assert!(out[2].denied_by.bucket);
    assert_eq!(
        out[2].retry_after_ms, 0,
        "nobody is told to wait in shadow mode"
    );
    assert_eq!(
        r.events.try_recv().map(|e| e.verdict),
        Some(Verdict::Allowed)
    );
    r.events.try_recv();
    assert_eq!(
        r.events.try_recv().map(|e| e.verdict),
        Some(Verdict::WouldDeny)
    );
    // Nothing was consumed by the would-denies: a token back after 1 s is enough.
    r.clock.advance(1_000);
    assert_eq!(r.limiter.check(&req(1, 1)).await.verdict, Verdict::Allowed);
}

#[tokio::test]
async fn mode_off_and_kill_switches_allow_without_counting_and_still_emit() {
    let mut r = rig(policy(|_| {}));
    for _ in 0..500 {
        let d = r.limiter.check(&req(1, 2)).await;
        assert_eq!(
            (d.verdict, d.source, d.limits),
            (Verdict::Allowed, DecisionSource::PolicyOff, None)
        );
    }
    assert_eq!(
        r.events.try_recv().map(|e| e.source),
        Some(DecisionSource::PolicyOff)
    );

    // The global kill switch, flipped at runtime: no restart, hard allow.
    r.limiter
        .policy()
        .store(policy(|d| d.kill_switch = true).with_version(4), T0);
    for _ in 0..10 {
        let d = r.limiter.check(&req(1, 0)).await;
        assert_eq!(
            (d.verdict, d.source, d.policy_version),
            (Verdict::Allowed, DecisionSource::KillSwitch, 4)
        );
    }
    // A tier's kill switch spares the other tiers.
    r.limiter.policy().store(
        policy(|d| d.tiers[0].kill_switch = true).with_version(5),
        T0,
    );
    assert_eq!(
        r.limiter.check(&req(2, 0)).await.source,
        DecisionSource::KillSwitch
    );
    assert_eq!(
        r.limiter.check(&req(2, 1)).await.source,
        DecisionSource::CounterStore
    );
    let m = r.limiter.metrics().render();
    assert!(
        m.contains(r#"verdict_decisions_total{source="kill_switch",verdict="allowed"} 11"#),
        "{m}"
    );
}

#[tokio::test]
async fn unknown_tier_is_allowed_and_counted_for_an_alert() {
    let r = rig(policy(|_| {}));
    let d = r.limiter.check(&req(1, 9)).await;
    assert_eq!(
        (d.verdict, d.source),
        (Verdict::Allowed, DecisionSource::PolicyOff)
    );
    assert!(
        r.limiter
            .metrics()
            .render()
            .contains("verdict_unconfigured_decisions_total 1")
    );
}

#[tokio::test]
async fn a_full_event_queue_drops_and_counts_without_touching_decisions() {
    let clock = FakeClock::at(T0);
    let r = rig_with(
        MemoryStore::with_clock(100, Arc::new(clock.clone())),
        policy(|_| {}),
        2,
        LimiterConfig::default(),
        clock,
    );
    let verdicts: Vec<Verdict> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(r.limiter.check(&req(1, 0)).await.verdict);
        }
        v
    };
    assert_eq!(
        verdicts,
        [
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Denied,
            Verdict::Denied
        ]
    );
    assert!(
        r.limiter
            .metrics()
            .render()
            .contains("verdict_events_dropped_total 3")
    );
}

#[tokio::test]
async fn a_hot_key_is_split_and_each_caller_sticks_to_its_sub_key() {
    let r = rig(policy(|_| {}));
    let hot = Request {
        key_id: key(11),
        route_class: RouteClassId(0),
        tier: TierId(0),
        caller: b"caller-a",
    };
    // 3 tokens split 4 ways: 1 per sub-key.
    let first = r.limiter.check(&hot).await;
    assert!(first.is_allowed());
    assert_eq!(
        (first.event.sub_keys, first.limits.unwrap().capacity),
        (4, 1)
    );
    assert_eq!(
        r.limiter.check(&hot).await.verdict,
        Verdict::Denied,
        "the same caller, the same sub-key"
    );
    let mut allowed = 1;
    for i in 0..64 {
        let caller = format!("caller-{i}");
        let d = r
            .limiter
            .check(&Request {
                caller: caller.as_bytes(),
                ..hot
            })
            .await;
        allowed += u32::from(d.is_allowed());
    }
    assert_eq!(allowed, 4, "four sub-keys of one token each");
}

/// A counter store that fails while told to (to drive the breaker; the real Redis fault
/// tests are in tests/), or answers that its requests waited past their deadline in this
/// process while `overloaded`. It takes charges while it answers.
#[derive(Clone)]
struct Flaky {
    failing: Arc<AtomicBool>,
    inner: MemoryStore,
    overloaded: Arc<AtomicBool>,
}

impl Flaky {
    fn new(failing: &Arc<AtomicBool>, clock: &FakeClock) -> Self {
        Self {
            failing: Arc::clone(failing),
            inner: MemoryStore::with_clock(100, Arc::new(clock.clone())),
            overloaded: Arc::new(AtomicBool::new(false)),
        }
    }

    fn down(&self) -> bool {
        self.failing.load(Ordering::SeqCst) || self.overloaded.load(Ordering::SeqCst)
    }
}

impl CounterStore for Flaky {
    type Place = ();

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        if self.failing.load(Ordering::SeqCst) {
            Err(StoreError::timeout(Duration::from_millis(5)))
        } else if self.overloaded.load(Ordering::SeqCst) {
            Err(StoreError::overloaded(Duration::from_millis(5)))
        } else {
            Ok(self.inner.decide(key, limits, hits))
        }
    }

    fn charge(&self, charges: Vec<Charge<()>>) -> Vec<Charge<()>> {
        if self.down() {
            return charges;
        }
        self.inner.charge(charges)
    }
}

#[tokio::test]
async fn a_failing_store_opens_the_breaker_and_the_fallback_enforces_its_share() {
    let clock = FakeClock::at(T0);
    let failing = Arc::new(AtomicBool::new(true));
    let store = Flaky::new(&failing, &clock);
    let cfg = LimiterConfig {
        instance_count: 3,
        breaker: breaker_after_two_failures(),
        ..LimiterConfig::default()
    };
    let r = rig_with(
        store,
        policy(|d| d.limits[0].capacity = 9),
        100,
        cfg,
        clock.clone(),
    );
    // Tokens 9 shared by 3 instances: this instance's fallback allows 3.
    let mut fallback_allowed = 0;
    for _ in 0..10 {
        let d = r.limiter.check(&req(1, 0)).await;
        assert_eq!(d.source, DecisionSource::LocalFallback);
        fallback_allowed += u32::from(d.is_allowed());
    }
    assert_eq!(fallback_allowed, 3);
    assert_eq!(r.limiter.breaker_state(), BreakerState::Open);

    // The store recovers; after open_for one probe closes the breaker.
    failing.store(false, Ordering::SeqCst);
    assert_eq!(
        r.limiter.check(&req(2, 0)).await.source,
        DecisionSource::LocalFallback
    );
    clock.advance(1_000);
    assert_eq!(
        r.limiter.check(&req(2, 0)).await.source,
        DecisionSource::CounterStore
    );
    assert_eq!(r.limiter.breaker_state(), BreakerState::Closed);
    let m = r.limiter.metrics().render();
    assert!(
        m.contains(r#"verdict_store_errors_total{kind="timeout"} 2"#),
        "{m}"
    );
    assert!(m.contains("verdict_fallback_decisions_total 11"), "{m}");
    assert!(m.contains("verdict_breaker_state 0"), "{m}");
}

/// Two instances share a key with a burst of 10. Nine requests pass through the store,
/// alternating instances, then the store fails and both instances' fallbacks decide 40 more
/// at the same instant (no refill). Returns what the fallbacks allowed.
async fn fallback_allowance_after_nine_of_ten(fallback_from_store: bool) -> u32 {
    let clock = FakeClock::at(T0);
    let failing = Arc::new(AtomicBool::new(false));
    let store = Flaky::new(&failing, &clock);
    let instances: Vec<Rig<Flaky>> = (0..2)
        .map(|i| {
            let cfg = LimiterConfig {
                instance: i,
                instance_count: 2,
                breaker: breaker_after_two_failures(),
                fallback_from_store,
                ..LimiterConfig::default()
            };
            let snapshot = policy(|d| d.limits[0].capacity = 10);
            rig_with(store.clone(), snapshot, 100, cfg, clock.clone())
        })
        .collect();
    for i in 0..9 {
        let d = instances[i % 2].limiter.check(&req(1, 0)).await;
        assert_eq!(
            (d.source, d.is_allowed()),
            (DecisionSource::CounterStore, true)
        );
    }
    failing.store(true, Ordering::SeqCst);
    let mut allowed = 0;
    for i in 0..40 {
        let d = instances[i % 2].limiter.check(&req(1, 0)).await;
        assert_eq!(d.source, DecisionSource::LocalFallback);
        allowed += u32::from(d.is_allowed());
    }
    allowed
}

#[tokio::test]
async fn the_fallback_starts_a_key_from_what_the_store_last_said_was_left() {
    // Started full, each instance's fallback would allow its half of the burst again: the
    // key would get 19 where its limit allows 10.
    assert_eq!(fallback_allowance_after_nine_of_ten(false).await, 10);
    // Started from the store's last answers (instance 1 last saw 2 tokens left, so 1 is
    // its part; instance 0 saw 1, so half a token): one more, ten in all.
    assert_eq!(fallback_allowance_after_nine_of_ten(true).await, 1);
}

#[tokio::test]
async fn a_request_is_decided_under_the_snapshot_it_was_resolved_against() {
    let r = rig(policy(|d| d.limits[0].capacity = 1));
    let resolved = r.limiter.policy().load();
    let newer = policy(|d| d.limits[0].capacity = 100).with_version(resolved.version() + 1);
    r.limiter.policy().store(newer, 0);

    let first = r.limiter.check_under(&resolved, &req(1, 0)).await;
    let second = r.limiter.check_under(&resolved, &req(1, 0)).await;
    assert!(first.is_allowed());
    assert_eq!(
        (second.verdict, second.policy_version),
        (Verdict::Denied, resolved.version()),
        "the resolved snapshot's burst of 1, not the newer one's 100"
    );
    let now = r.limiter.check(&req(2, 0)).await;
    assert_eq!(now.policy_version, resolved.version() + 1);
}

/// A store of two shards (a key id's last byte, even or odd), the odd one failing.
struct OddShardDown {
    inner: MemoryStore,
}

impl CounterStore for OddShardDown {
    type Place = ();

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        if self.locate(key).shard == 1 {
            Err(StoreError::timeout(Duration::from_millis(5)).deciding(key))
        } else {
            Ok(self.inner.decide(key, limits, hits))
        }
    }

    fn shards(&self) -> usize {
        2
    }

    fn locate(&self, key: &LimitKey) -> Located<()> {
        Located {
            shard: usize::from(key.key_id.0[15] % 2),
            place: (),
        }
    }
}

#[tokio::test]
async fn one_failing_shard_opens_its_own_breaker_and_the_other_keeps_deciding() {
    let clock = FakeClock::at(T0);
    let store = OddShardDown {
        inner: MemoryStore::with_clock(100, Arc::new(clock.clone())),
    };
    let cfg = LimiterConfig {
        breaker: breaker_after_two_failures(),
        ..LimiterConfig::default()
    };
    let r = rig_with(store, policy(|_| {}), 100, cfg, clock.clone());
    for _ in 0..3 {
        assert_eq!(
            r.limiter.check(&req(1, 0)).await.source,
            DecisionSource::LocalFallback
        );
        assert_eq!(
            r.limiter.check(&req(2, 0)).await.source,
            DecisionSource::CounterStore,
            "a key of the healthy shard is decided by the store"
        );
    }
    assert_eq!(
        r.limiter.shard_breaker_states(),
        vec![BreakerState::Closed, BreakerState::Open]
    );
    assert_eq!(r.limiter.breaker_state(), BreakerState::Open);
    let m = r.limiter.metrics().render();
    assert!(m.contains("verdict_breaker_open_shards 1"), "{m}");
    assert!(m.contains("verdict_breaker_state 2"), "{m}");
    // Two store errors opened it; the third decision went straight to the fallback.
    assert!(
        m.contains(r#"verdict_store_errors_total{kind="timeout"} 2"#),
        "{m}"
    );
}

#[tokio::test]
async fn the_http_answer_carries_retry_after_and_the_rate_limit_fields() {
    let r = rig(policy(|_| {}));
    let ok = r.limiter.check(&req(1, 0)).await;
    let a = http_answer(&ok);
    assert_eq!(a.status, None);
    assert_eq!(
        a.headers,
        vec![
            (
                "ratelimit-policy",
                r#""burst";q=3;w=3, "hourly";q=100;w=3600"#.to_string()
            ),
            (
                "ratelimit",
                r#""burst";r=2;t=1, "hourly";r=99;t=3600"#.to_string()
            ),
        ]
    );
    r.limiter.check(&req(1, 0)).await;
    r.limiter.check(&req(1, 0)).await;
    r.clock.advance(250);
    let denied = r.limiter.check(&req(1, 0)).await;
    let a = http_answer(&denied);
    assert_eq!(a.status, Some(429));
    assert_eq!(a.headers[1].1, r#""burst";r=0;t=1, "hourly";r=97;t=3600"#);
    assert_eq!(a.headers[2], ("retry-after", "1".to_string()));
    let body: serde_json::Value = serde_json::from_str(a.body.as_deref().unwrap()).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated_policies"], serde_json::json!(["burst"]));
    assert_eq!(body["retry_after_seconds"], 1);
    assert_eq!(body["remaining"]["hourly"], 97);
}

#[tokio::test]
async fn with_several_regions_a_limiter_enforces_its_share() {
    use verdict_limiter::regions::{NearLimit, Share, ShareEntry, ShareHandle, ShareSnapshot};
    use verdict_limiter::{RegionRow, Regional};

    // Region 2 (the rig's) weighs 3 of 4: three quarters of every limit. No refill to
    // speak of, so the number allowed is the bucket's capacity.
    let regional_policy = || {
        policy(|d| {
            d.limits[0].capacity = 100;
            d.limits[0].refill_per_s = 0.001;
            d.limits[0].hourly_quota = 1_000;
            d.regions = vec![
                RegionRow {
                    id: 0,
                    name: "us-east-1".into(),
                    weight: 1.0,
                },
                RegionRow {
                    id: 2,
                    name: "eu-central-1".into(),
                    weight: 3.0,
                },
            ];
        })
    };
    async fn allowed<S: CounterStore>(r: &Rig<S>, k: u8) -> usize {
        let mut n = 0;
        for _ in 0..200 {
            n += usize::from(r.limiter.check(&req(k, 0)).await.is_allowed());
        }
        n
    }

    // The static weight.
    let r = rig(regional_policy());
    assert_eq!(allowed(&r, 1).await, 75);

    // The reconcile job's shares: a shrinking one at once, a growing one from its time.
    let mut r = rig(regional_policy());
    let shares = ShareHandle::new(Duration::from_secs(300));
    let near = Arc::new(NearLimit::default());
    let entry = |before: u32, after: u32| ShareEntry {
        before: Share::uniform(before),
        after: Share::uniform(after),
        effective_ms: T0 + 1_000,
        computed_ms: T0,
    };
    let route = RouteClassId(0);
    shares.store(ShareSnapshot {
        version: 1,
        entries: [
            ((key(2), route, TierId(0)), entry(750_000, 200_000)),
            ((key(3), route, TierId(0)), entry(200_000, 900_000)),
            ((key(4), route, TierId(0)), entry(200_000, 900_000)),
        ]
        .into_iter()
        .collect(),
    });
    r.limiter = r.limiter.with_regional(Regional {
        shares,
        near: Arc::clone(&near),
    });
    assert_eq!(allowed(&r, 2).await, 20);
    assert_eq!(allowed(&r, 3).await, 20);
    r.clock.advance(1_000);
    assert_eq!(allowed(&r, 4).await, 90);
    // The decision and its event carry the regional limits.
    let d = r.limiter.check(&req(4, 0)).await;
    assert_eq!(d.limits.map(|l| (l.capacity, l.quota)), Some((90, 900)));

    // Every request of a key near its regional limit was noted for the reconcile job: all
    // of them past the first half of the bucket, and for a key given more than its static
    // share (90 of the bucket where the weight gives 75), all of them past half of the
    // static share (from its 38th token on), so that its share is renewed while it uses it.
    let mut notes = near.drain();
    notes.sort();
    let count = |k: u8| notes.iter().find(|(n, _)| n.0 == key(k)).map(|(_, c)| *c);
    assert_eq!(count(2), Some(200 - 10));
    assert_eq!(count(4), Some(201 - 37));
}

/// A limiter of two instances over a store that can be overloaded, deciding a bucket of 10
/// and a window of 20.
fn overloadable() -> (Flaky, Rig<Flaky>) {
    let clock = FakeClock::at(T0);
    let failing = Arc::new(AtomicBool::new(false));
    let store = Flaky::new(&failing, &clock);
    let cfg = LimiterConfig {
        instance_count: 2,
        breaker: breaker_after_two_failures(),
        ..LimiterConfig::default()
    };
    let r = rig_with(
        store.clone(),
        policy(|d| {
            d.limits[0].capacity = 10;
            d.limits[0].hourly_quota = 20;
        }),
        100,
        cfg,
        clock,
    );
    (store, r)
}

#[tokio::test]
async fn overload_opens_no_breaker_and_what_the_fallback_admits_is_charged_back() {
    let (store, r) = overloadable();
    // Four through the store; then the process is overloaded for 20 requests: the fallback
    // decides them at its part (half of the 6 tokens left: 3), and no breaker opens.
    for _ in 0..4 {
        assert_eq!(
            r.limiter.check(&req(1, 0)).await.source,
            DecisionSource::CounterStore
        );
    }
    store.overloaded.store(true, Ordering::SeqCst);
    let mut local = 0;
    for _ in 0..20 {
        let d = r.limiter.check(&req(1, 0)).await;
        assert_eq!(d.source, DecisionSource::LocalFallback);
        local += u32::from(d.is_allowed());
    }
    assert_eq!(local, 3);
    assert_eq!(r.limiter.breaker_state(), BreakerState::Closed);
    let m = r.limiter.metrics().render();
    assert!(m.contains("verdict_overload_decisions_total 20"), "{m}");
    assert!(m.contains("verdict_breaker_openings_total 0"), "{m}");
    assert!(
        m.contains(r#"verdict_store_errors_total{kind="overloaded"} 20"#),
        "{m}"
    );

    // The store answers again: the answer is the 8th request it counts (4 + 3 charged +
    // this one), so 12 of the window's 20 are left; the 3 go to the store with it.
    store.overloaded.store(false, Ordering::SeqCst);
    let d = r.limiter.check(&req(1, 0)).await;
    assert_eq!(d.source, DecisionSource::CounterStore);
    assert_eq!(d.remaining_window, 15, "the charge rides after the answer");
    let d = r.limiter.check(&req(1, 0)).await;
    assert_eq!(
        d.remaining_window, 11,
        "4 + 1 + 3 charged + 1: the window counts every request admitted"
    );
    let m = r.limiter.metrics().render();
    assert!(m.contains("verdict_charged_back_total 3"), "{m}");
    assert!(m.contains("verdict_charges_dropped_total 0"), "{m}");
}

#[tokio::test]
async fn a_request_of_n_hits_the_fallback_admits_is_charged_back_as_n() {
    let (store, r) = overloadable();
    let limiter = &r.limiter;
    let hits = |n| async move {
        let policy = limiter.policy().load();
        limiter.check_hits_under(&policy, &req(1, 0), n).await
    };
    for _ in 0..2 {
        assert_eq!(hits(1).await.source, DecisionSource::CounterStore);
    }
    // Overloaded: the fallback's part is half of the 8 tokens left. 3 hits pass, 3 more do
    // not fit in the 1 left, a check of none passes and counts nothing, and 1 takes the last.
    store.overloaded.store(true, Ordering::SeqCst);
    let mut local = Vec::new();
    for n in [3, 3, 0, 1] {
        let d = hits(n).await;
        assert_eq!(d.source, DecisionSource::LocalFallback);
        local.push((d.is_allowed(), d.remaining_tokens));
    }
    assert_eq!(local, [(true, 1), (false, 1), (true, 1), (true, 0)]);

    // Back: the first answer is the store's third request; the 4 hits ride after it.
    store.overloaded.store(false, Ordering::SeqCst);
    assert_eq!(hits(1).await.remaining_window, 17);
    assert_eq!(
        hits(1).await.remaining_window,
        12,
        "2 + 1 + 4 charged + 1: the window counts every hit admitted"
    );
    let m = r.limiter.metrics().render();
    assert!(m.contains("verdict_charged_back_total 4"), "{m}");
}

#[tokio::test]
async fn an_outage_is_charged_back_once_whatever_the_breaker_openings() {
    let clock = FakeClock::at(T0);
    let failing = Arc::new(AtomicBool::new(false));
    let store = Flaky::new(&failing, &clock);
    let cfg = LimiterConfig {
        breaker: BreakerConfig {
            failure_threshold: 1,
            failing_for: Duration::ZERO,
            open_for: Duration::from_millis(100),
        },
        ..LimiterConfig::default()
    };
    // A bucket of 5 refilling 10/s, a quota of 1,000 an hour: 60 s of outage admit 5 + 600.
    let r = rig_with(
        store.clone(),
        policy(|d| {
            d.limits[0].capacity = 5;
            d.limits[0].refill_per_s = 10.0;
            d.limits[0].hourly_quota = 1_000;
        }),
        100_000,
        cfg,
        clock.clone(),
    );
    failing.store(true, Ordering::SeqCst);
    let mut admitted = 0u32;
    // 20 requests a second for 60 s; the breaker probes (and opens again) every 100 ms.
    for _ in 0..1_200 {
        clock.advance(50);
        admitted += u32::from(r.limiter.check(&req(1, 0)).await.is_allowed());
    }
    let m = r.limiter.metrics().render();
    let openings: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("verdict_breaker_openings_total "))
        .and_then(|v| v.parse().ok())
        .expect("openings exported");
    assert!(openings > 100, "the breaker opened {openings} times");
    assert!(
        (600..=605).contains(&admitted),
        "one bucket plus the refill over 60 s: {admitted}"
    );

    // Back: the first answer carries the charge; the window then holds every admission.
    failing.store(false, Ordering::SeqCst);
    clock.advance(100);
    loop {
        let d = r.limiter.check(&req(1, 0)).await;
        if d.source == DecisionSource::CounterStore {
            break;
        }
        clock.advance(10);
    }
    // The charge left the bucket a bucket in debt (its floor): the next request waits for
    // six tokens' refill, 600 ms.
    let d = r.limiter.check(&req(1, 0)).await;
    assert_eq!(
        (d.source, d.verdict),
        (DecisionSource::CounterStore, Verdict::Denied)
    );
    assert!((590..=600).contains(&d.retry_after_ms), "{d:?}");
    clock.advance(600);
    let d = r.limiter.check(&req(1, 0)).await;
    assert_eq!(
        (d.source, d.verdict),
        (DecisionSource::CounterStore, Verdict::Allowed)
    );
    assert_eq!(
        d.remaining_window,
        1_000 - admitted - 2,
        "the window counts the outage's {admitted} admissions once, and the two answers"
    );
}
