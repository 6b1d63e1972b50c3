//! Moving the counters to a new Redis with no key's count reset: dual-write for two window
//! lengths (decide on the old store, apply to both), then cut over. Two Redis servers of
//! the test's own; a 1-second window stands for the hour.

use std::time::Duration;

use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::moving::{MovingStore, Phase};
use verdict_limiter::{CounterStore, LimitKey, Limits};
use verdict_reconcile::region_counters::RegionCounters;
use verdict_schemas::{KeyId, RouteClassId, TierId};
use verdict_tests::private::PrivateRedis;

const WINDOW_MS: i64 = 1_000;
const QUOTA: u32 = 40;

fn limits() -> Limits {
    Limits {
        capacity: 1_000,
        refill_units_per_ms: 1_000_000,
        quota: QUOTA,
        window_ms: WINDOW_MS,
    }
}

fn key(i: u8) -> LimitKey {
    LimitKey::new(KeyId([i; 16]), RouteClassId(0), TierId(0))
}

async fn store(url: &str) -> RedisStore {
    RedisStore::connect(&RedisStoreConfig {
        url: url.to_owned(),
        timeout: Duration::from_millis(200),
        ..RedisStoreConfig::default()
    })
    .await
    .expect("connect")
}

/// Each key's count in view at `now`: both stores are read at the same instant, since the
/// previous window's weight in a sliding count falls as time passes.
async fn counts(url: &str, keys: &[LimitKey], now: i64) -> Vec<f64> {
    let wanted: Vec<_> = keys
        .iter()
        .map(|k| ((k.key_id, k.route_class, k.tier), 1u8, WINDOW_MS))
        .collect();
    RegionCounters::new(url, Duration::from_secs(1))
        .unwrap()
        .window_used(&wanted, now)
        .await
        .expect("read counters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_two_windows_of_dual_writes_no_count_resets_at_cut_over() {
    let (old_redis, new_redis) = (PrivateRedis::start(), PrivateRedis::start());
    let (old, new) = (store(&old_redis.url()).await, store(&new_redis.url()).await);
    let moving = MovingStore::new(old.clone(), new.clone(), Phase::Old);
    let keys: Vec<LimitKey> = (1..=20).map(key).collect();
    let l = limits();

    // Before the move: counts only in the old store.
    for k in &keys {
        for _ in 0..10 {
            assert!(moving.check(k, &l, 1).await.unwrap().allowed);
        }
    }
    // Two and a half window lengths of dual writes, each key at its own steady rate.
    moving.set_phase(Phase::DualWrite);
    let started = std::time::Instant::now();
    // (key i every (i mod 4 + 1)-th tick of 50 ms: 20, 10, 6.7 or 5 requests a second).
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut n = 0usize;
    while started.elapsed() < Duration::from_millis(2_500) {
        tick.tick().await;
        n += 1;
        for (i, k) in keys.iter().enumerate() {
            if n.is_multiple_of(i % 4 + 1) {
                moving.check(k, &l, 1).await.unwrap();
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(moving.copies_failed(), 0);

    // The new store holds every count still in view: the same as the old one.
    let now = chrono::Utc::now().timestamp_millis();
    let (a, b) = (
        counts(&old_redis.url(), &keys, now).await,
        counts(&new_redis.url(), &keys, now).await,
    );
    eprintln!("old {a:?}\nnew {b:?}");
    for ((x, y), k) in a.iter().zip(&b).zip(&keys) {
        assert!(*x > 3.0, "key {:?} had traffic in view: {x}", k.key_id);
        assert!((x - y).abs() <= 1.0, "key {:?}: old {x}, new {y}", k.key_id);
    }

    // Cut over: the new store decides, and its answer is the old store's, not a reset one.
    moving.set_phase(Phase::CutOver);
    for k in &keys {
        let from_old = old.check(k, &l, 1).await.unwrap().remaining_window;
        let from_new = moving.check(k, &l, 1).await.unwrap().remaining_window;
        assert!(
            from_old.abs_diff(from_new) <= 1,
            "key {:?}: remaining {from_old} on the old store, {from_new} after the cut-over",
            k.key_id
        );
        assert!(
            from_new < QUOTA - 3,
            "the count reset: {from_new} of {QUOTA} left"
        );
    }
    // Without the dual writes the new store would have started from nothing.
    let fresh = key(99);
    for _ in 0..10 {
        old.check(&fresh, &l, 1).await.unwrap();
    }
    assert_eq!(
        moving.check(&fresh, &l, 1).await.unwrap().remaining_window,
        QUOTA - 1
    );
}
