//! The limiter when this process, not Redis, is the bottleneck: requests that wait past
//! their deadline in the store's lanes are decided by the local fallback without opening a
//! breaker, and what the fallback admits is charged back to Redis, so the shared bucket
//! and window count every request admitted. And after an outage, the hourly window counts
//! the fallback's admissions once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::breaker::{BreakerConfig, BreakerState};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{Limiter, LimiterConfig, PolicyHandle, PolicySnapshot, Request};
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId, Verdict};
use verdict_tests::discarded_events;
use verdict_tests::private::{PrivateRedis, TcpProxy, redis_behind_a_proxy};

/// A bucket of 40 refilling 20 a second, and an hourly quota of 100,000 (far away, so the
/// window's count can be read back from what it says is left).
const POLICY: &str = include_str!("../../fixtures/policies/limiter_overload.toml");
const CAPACITY: f64 = 40.0;
const REFILL_PER_S: f64 = 20.0;
const QUOTA: u32 = 100_000;

/// The store's deadline: production's is 5 ms. Here 20 ms: the proxy's 1 ms delay is a
/// timer that on the loaded 2-core test machine wakes up to 10 ms late during a full test
/// run, and at 5 ms the calls Redis answers in time then time out for a second and more at
/// a stretch (232 timeouts and a breaker opening in one such run): the harness's timer, not
/// a store failing. What the tests claim (overload decided locally at the deadline, no
/// breaker, the fallback charged back, an outage counted once) does not depend on its
/// value, and the lane's queue still waits far past it.
const DEADLINE: Duration = Duration::from_millis(20);
/// What a decision may take beyond the deadline on a loaded 2-core test machine (timer
/// granularity and scheduling).
const SLACK: Duration = Duration::from_millis(45);
/// How many of the run's decisions may take longer than the deadline and its slack: one in
/// ten thousand. A worker thread the OS sets aside in the middle of a decision (a full test
/// run shares the two cores with Redis, Kafka, PostgreSQL and the S3 server) makes that
/// decision late while the other thread, and the lateness probe on it, carry on: one
/// decision of 243,302 took 75 ms in such a run, with the probe's 1 ms sleep at most 6 ms
/// late. (A stall of the whole process, which the probe sees, is added to the bound.)
/// Decisions that waited their turn in the lane instead of being answered at the
/// deadline would all be late: 64 callers queue 64 calls of at least 1 ms each.
const LATE_AT_MOST: f64 = 1e-4;

fn request(key: u8) -> Request<'static> {
    let mut id = [0x0c; 16];
    id[0] = key;
    Request {
        key_id: KeyId(id),
        route_class: RouteClassId(0),
        tier: TierId(0),
        caller: b"c",
    }
}

/// A private Redis, a loopback proxy in front of it (to slow or cut), and a limiter whose
/// store reaches Redis through the proxy.
async fn behind_a_proxy(
    max_batch: usize,
    breaker: BreakerConfig,
) -> (PrivateRedis, TcpProxy, Arc<Limiter<RedisStore>>) {
    let (redis, proxy, store) = redis_behind_a_proxy(RedisStoreConfig {
        timeout: DEADLINE,
        max_batch,
        ..RedisStoreConfig::default()
    })
    .await;
    let (q, metrics) = discarded_events(1 << 20);
    let doc = parse_toml(POLICY).unwrap();
    let limiter = Limiter::new(
        store,
        PolicyHandle::new(PolicySnapshot::build(doc).unwrap(), 0),
        q,
        metrics,
        LimiterConfig {
            breaker,
            ..LimiterConfig::default()
        },
    );
    (redis, proxy, Arc::new(limiter))
}

/// A metric's value; a labelled series not exported yet (never counted) is 0.
fn metric(l: &Limiter<RedisStore>, name: &str) -> u64 {
    let text = l.metrics().render();
    verdict_tests::metric_in(&text, name).unwrap_or_else(|| {
        assert!(name.contains('{'), "{name} is not exported:\n{text}");
        0
    })
}

/// Decides `req` until Redis decides it twice in a row. Returns how many requests of the
/// key Redis's window counted that were admitted before this call (from what the last
/// answer says is left, less what this call admitted), and how many this call admitted.
/// The first of the two answers hands the waiting charges to the lane; the second is
/// decided after them.
async fn counted_by_redis(l: &Limiter<RedisStore>, req: &Request<'_>) -> (u32, u32) {
    let mut in_a_row = 0;
    let mut admitted = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "Redis never decided twice in a row"
        );
        let d = l.check(req).await;
        admitted += u32::from(d.verdict == Verdict::Allowed);
        in_a_row = if d.source == DecisionSource::CounterStore {
            in_a_row + 1
        } else {
            0
        };
        if in_a_row == 2 {
            return (QUOTA - d.remaining_window - admitted, admitted);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_decided_locally_without_a_breaker_opening_and_charged_back() {
    // One request per call, each call at least 1 ms: the lane decides under 1,000 a
    // second, and 64 callers in a closed loop keep its queue far past the deadline. Redis
    // itself answers every call it gets well within the deadline.
    let (_redis, proxy, l) = behind_a_proxy(
        1,
        BreakerConfig {
            failure_threshold: 3,
            // The harness's pauses (the probe below prints how late a 1 ms timer wakes; a
            // full test run once stalled the process for 58 ms) make some calls time out
            // now and then, which must not open it (production's 25 ms is for its own
            // machines). Overload counted as failures would still open it within the first
            // of the run's three seconds: it goes on for the whole run, hundreds of
            // thousands of decisions.
            failing_for: Duration::from_secs(1),
            ..BreakerConfig::default()
        },
    )
    .await;
    let key = request(1);
    // The key is known to Redis before the load.
    let (counted, before) = counted_by_redis(&l, &key).await;
    assert_eq!(counted, 0);
    let store_allowed = "verdict_decisions_total{source=\"counter_store\",verdict=\"allowed\"}";
    let store_before = metric(&l, store_allowed);
    proxy.set_delay_ms(1);

    let started = Instant::now();
    let run = Duration::from_secs(3);
    // How late a 1 ms sleep wakes in this process meanwhile: its stalls.
    let lateness = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        while started.elapsed() < run {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
        }
        worst
    });
    let allowed = Arc::new(AtomicU32::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (l, allowed) = (Arc::clone(&l), Arc::clone(&allowed));
        callers.spawn(async move {
            let mut took = Vec::new();
            while started.elapsed() < run {
                let t = Instant::now();
                let d = l.check(&key).await;
                took.push(t.elapsed());
                allowed.fetch_add(u32::from(d.is_allowed()), Ordering::Relaxed);
                // A gateway's request yields to the runtime between decisions (its I/O);
                // a decision made locally at once does not.
                tokio::task::yield_now().await;
            }
            took
        });
    }
    let took: Vec<Duration> = callers.join_all().await.concat();
    let stall = lateness.await.expect("the lateness probe");
    let elapsed = started.elapsed().as_secs_f64();
    proxy.set_delay_ms(0);
    let allowed = allowed.load(Ordering::Relaxed);
    // Late: past the deadline, the slack, and the longest the whole process stood still.
    let bound = DEADLINE + SLACK + stall;
    let late = took.iter().filter(|t| **t > bound).count();
    let slowest = took.iter().max().copied().unwrap_or_default();
    let overload = metric(&l, "verdict_overload_decisions_total");
    let openings = metric(&l, "verdict_breaker_openings_total");
    let timeouts = metric(&l, "verdict_store_errors_total{kind=\"timeout\"}");
    let store_decided = metric(&l, store_allowed);
    // Admitted in the run by this process's own decisions (overload and fallback).
    let local_allowed = u64::from(allowed).saturating_sub(store_decided - store_before);
    let limit = CAPACITY + REFILL_PER_S * elapsed;
    println!(
        "{elapsed:.2} s: {allowed} allowed (limit {limit:.0}, {:.3}x), {overload} of {} decided as overload, {timeouts} timeouts, {openings} breaker openings, {late} over {bound:?}, slowest {slowest:?}, a 1 ms sleep woke up to {stall:?} late, {store_decided} allowed by Redis in all, {local_allowed} by this process",
        f64::from(allowed) / limit,
        took.len(),
    );
    assert!(
        overload > 1_000,
        "the process was meant to be overloaded: {overload} overload decisions"
    );
    assert_eq!(openings, 0, "overload opened a breaker");
    assert_eq!(l.breaker_state(), BreakerState::Closed);
    assert!(
        late as f64 <= LATE_AT_MOST * took.len() as f64,
        "{late} of {} decisions took longer than {bound:?} under overload (slowest {slowest:?})",
        took.len()
    );
    assert!(
        f64::from(allowed) <= 1.10 * limit,
        "{allowed} allowed against a limit of {limit:.0} over {elapsed:.2} s"
    );
    // The local decisions enforce the limit, they do not refuse everything: they admit
    // what Redis left of it, and with Redis's admissions the run admits most of the limit
    // (Redis alone admitted 53 to 71 of 100 in these runs: a local path refusing everything
    // stays under three quarters).
    assert!(local_allowed > 0, "the local decisions admitted nothing");
    assert!(
        f64::from(allowed) >= 0.75 * limit,
        "{allowed} allowed against a limit of {limit:.0} ({local_allowed} by the local decisions)"
    );

    // Every request admitted is counted in Redis's window: the store's own admissions and
    // the charges. A request Redis counted but answered after its deadline (a timeout) was
    // decided by the fallback too, and may be counted twice; nothing else may.
    let (counted, _) = counted_by_redis(&l, &key).await;
    let charged = metric(&l, "verdict_charged_back_total");
    println!("Redis counted {counted} ({before} before the load), {charged} charged back");
    assert_eq!(metric(&l, "verdict_charges_dropped_total"), 0);
    assert!(
        counted >= before + allowed && u64::from(counted) <= u64::from(before + allowed) + timeouts,
        "Redis counted {counted}; {before} before the load, {allowed} allowed in it, {timeouts} timeouts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_the_hourly_window_counts_the_fallbacks_admissions_once() {
    let (_redis, proxy, l) = behind_a_proxy(
        64,
        BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_millis(200),
            ..BreakerConfig::default()
        },
    )
    .await;
    let key = request(2);
    let (counted, before) = counted_by_redis(&l, &key).await;
    assert_eq!(counted, 0);

    // F = 3 s without Redis, a request every 5 ms; the breaker probes every 200 ms and
    // opens again each time.
    proxy.cut();
    let started = Instant::now();
    let mut allowed = 0u32;
    while started.elapsed() < Duration::from_secs(3) {
        allowed += u32::from(l.check(&key).await.is_allowed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let outage = started.elapsed().as_secs_f64();
    let openings = metric(&l, "verdict_breaker_openings_total");
    proxy.restore();
    let (counted, _) = counted_by_redis(&l, &key).await;
    // The fallback began from Redis's last answer: the outage admits at most a bucket plus
    // the refill over its length.
    let bound = CAPACITY + REFILL_PER_S * outage;
    println!(
        "outage of {outage:.2} s: {allowed} allowed by the fallback (bound {bound:.0}), {openings} breaker openings; Redis counted {counted} after it ({before} before)"
    );
    assert!(openings >= 5, "the breaker opened {openings} times");
    assert!(
        f64::from(allowed) <= bound,
        "{allowed} allowed in the outage; one bucket plus the refill is {bound:.0}"
    );
    assert_eq!(
        counted,
        before + allowed,
        "the window counts the {before} requests before and every admission of the outage, once"
    );
    assert_eq!(metric(&l, "verdict_charges_dropped_total"), 0);
}
