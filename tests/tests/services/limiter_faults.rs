//! The limiter against a real Redis of its own that is stopped, slowed and restarted:
//! decisions keep flowing with no wait past the deadline, the breaker opens, the local
//! fallback enforces limit / instance count, and the breaker closes after recovery. Also the
//! modes and the event queue with the Redis store deciding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::breaker::{BreakerConfig, BreakerState};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, PolicyHandle, PolicySnapshot, Request, event_queue,
};
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId, Verdict};
use verdict_tests::eventually;
use verdict_tests::private::{PrivateRedis, TcpProxy};

const POLICY: &str = include_str!("../../fixtures/policies/limiter_faults.toml");

/// The decision deadline of production.
const DEADLINE: Duration = Duration::from_millis(5);
/// What a decision may take beyond the deadline on a loaded 2-core test machine (timer
/// granularity and scheduling); a hung connection would take seconds.
const SLACK: Duration = Duration::from_millis(45);

fn snapshot(edit: impl FnOnce(&mut verdict_limiter::PolicyDocument)) -> PolicySnapshot {
    let mut doc = parse_toml(POLICY).unwrap();
    edit(&mut doc);
    PolicySnapshot::build(doc).unwrap()
}

async fn limiter(
    url: &str,
    instance_count: u32,
    queue: usize,
) -> (Limiter<RedisStore>, verdict_limiter::EventReceiver) {
    let store = RedisStore::connect(&RedisStoreConfig {
        url: url.to_owned(),
        timeout: DEADLINE,
        ..RedisStoreConfig::default()
    })
    .await
    .expect("connect");
    let metrics = Arc::new(LimiterMetrics::new());
    let (q, rx) = event_queue(queue, Arc::clone(&metrics));
    let cfg = LimiterConfig {
        instance_count,
        breaker: BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_millis(300),
            ..BreakerConfig::default()
        },
        ..LimiterConfig::default()
    };
    (
        Limiter::new(
            store,
            PolicyHandle::new(snapshot(|_| {}), 0),
            q,
            metrics,
            cfg,
        ),
        rx,
    )
}

fn request(key: u8, tier: u8) -> Request<'static> {
    let mut id = [0x5a; 16];
    id[0] = key;
    Request {
        key_id: KeyId(id),
        route_class: RouteClassId(0),
        tier: TierId(tier),
        caller: b"c",
    }
}

/// Decides `n` requests, returning (allowed, sources seen, slowest decision).
async fn drive(
    l: &Limiter<RedisStore>,
    req: &Request<'_>,
    n: usize,
) -> (usize, Vec<DecisionSource>, Duration) {
    let (mut allowed, mut sources, mut slowest) = (0, Vec::new(), Duration::ZERO);
    for _ in 0..n {
        let started = Instant::now();
        let d = l.check(req).await;
        slowest = slowest.max(started.elapsed());
        allowed += usize::from(d.is_allowed());
        if !sources.contains(&d.source) {
            sources.push(d.source);
        }
    }
    (allowed, sources, slowest)
}

/// Decides `req` every 50 ms until Redis is the one deciding, failing the test with `what`
/// after `within`.
async fn until_redis_decides(
    l: &Limiter<RedisStore>,
    req: &Request<'_>,
    within: Duration,
    what: &str,
) {
    eventually(within, what, || async {
        l.check(req).await.source == DecisionSource::CounterStore
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_run_falls_back_within_the_deadline_and_recovers() {
    let mut redis = PrivateRedis::start();
    let (l, _events) = limiter(&redis.url(), 3, 100_000).await;

    // Redis decides (a decision past the 5 ms deadline on a busy machine may fall back on
    // its own; the breaker stays closed).
    let (allowed, sources, _) = drive(&l, &request(1, 0), 10).await;
    assert_eq!(allowed, 10);
    assert!(
        sources.contains(&DecisionSource::CounterStore),
        "{sources:?}"
    );
    assert_eq!(l.breaker_state(), BreakerState::Closed);

    redis.stop();
    // A fresh key: 30 tokens shared by 3 instances, so this instance's fallback allows 10.
    let (allowed, sources, slowest) = drive(&l, &request(2, 0), 200).await;
    println!("slowest decision with Redis stopped: {slowest:?}");
    assert!(slowest <= DEADLINE + SLACK, "a decision waited {slowest:?}");
    assert!(
        sources.contains(&DecisionSource::LocalFallback),
        "{sources:?}"
    );
    assert!(
        allowed <= 10 + 3,
        "the fallback let {allowed} of 200 through; its ceiling is 10 (+ the decisions before the breaker opened)"
    );
    assert!(
        allowed >= 10,
        "the fallback enforces its share, it does not deny everything: {allowed}"
    );
    assert_eq!(l.breaker_state(), BreakerState::Open);

    redis.restart();
    until_redis_decides(
        &l,
        &request(3, 0),
        Duration::from_secs(20),
        "the breaker closed after Redis came back",
    )
    .await;
    assert_eq!(l.breaker_state(), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redis_opens_the_breaker_and_recovery_closes_it() {
    let redis = PrivateRedis::start();
    let proxy = TcpProxy::start(redis.port())
        .await
        .expect("a loopback proxy");
    let port = proxy.port();
    let (l, _events) = limiter(&format!("redis://127.0.0.1:{port}"), 1, 100_000).await;
    // Redis decides before the slowdown. The first decision on a new connection through the
    // proxy may pass the 5 ms deadline on a busy machine and fall back on its own (the
    // breaker stays closed), so the store is given a few tries.
    until_redis_decides(
        &l,
        &request(1, 0),
        Duration::from_secs(2),
        "Redis deciding through the proxy",
    )
    .await;
    assert_eq!(l.breaker_state(), BreakerState::Closed);

    proxy.set_delay_ms(20);
    let (_, sources, slowest) = drive(&l, &request(1, 0), 20).await;
    assert!(
        sources.contains(&DecisionSource::LocalFallback),
        "{sources:?}"
    );
    assert_eq!(l.breaker_state(), BreakerState::Open);
    assert!(
        slowest <= DEADLINE + SLACK,
        "a decision waited {slowest:?} on a slow Redis"
    );
    let metrics = l.metrics().render();
    assert!(
        metrics.contains("verdict_store_errors_total{kind=\"timeout\"}"),
        "{metrics}"
    );

    proxy.set_delay_ms(0);
    until_redis_decides(
        &l,
        &request(1, 0),
        Duration::from_secs(20),
        "the breaker closed after Redis sped up",
    )
    .await;
    assert_eq!(l.breaker_state(), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_deciding_shadow_allows_kill_switch_bypasses_and_a_full_queue_drops() {
    let redis = PrivateRedis::start();
    let (l, mut events) = limiter(&redis.url(), 1, 4).await;

    let verdicts: Vec<Verdict> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(l.check(&request(1, 1)).await.verdict);
        }
        v
    };
    assert_eq!(
        verdicts,
        [
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::WouldDeny,
            Verdict::WouldDeny
        ]
    );
    let mut seen = Vec::new();
    while let Some(e) = events.try_recv() {
        seen.push(e.verdict);
    }
    assert_eq!(seen, verdicts, "one event per decision, in order");

    // The queue holds 4: 10 more decisions, 6 dropped, and the decisions are unaffected.
    let (allowed, _, _) = drive(&l, &request(2, 0), 10).await;
    assert_eq!(allowed, 10);
    assert!(
        l.metrics()
            .render()
            .contains("verdict_events_dropped_total 6")
    );

    l.policy()
        .store(snapshot(|d| d.kill_switch = true).with_version(2), 0);
    let d = l.check(&request(1, 1)).await;
    assert_eq!(
        (d.verdict, d.source, d.policy_version),
        (Verdict::Allowed, DecisionSource::KillSwitch, 2)
    );
}
