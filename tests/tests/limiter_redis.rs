//! The Redis counter store against the real Redis: the conformance suite every store
//! passes, the Lua script computing exactly what the Rust core computes for the same
//! requests, the key layout and TTL, and the reload after a `SCRIPT FLUSH`.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use proptest::prelude::*;
use verdict_limiter::conformance::{self, fresh_key};
use verdict_limiter::{CounterState, Limits, RedisStore, RedisStoreConfig, decide};
use verdict_tests::{Service, redis_url, require};

async fn store() -> RedisStore {
    require(Service::Redis);
    RedisStore::connect(&RedisStoreConfig {
        url: redis_url(),
        // Tests run on a busy machine: a generous deadline, so only real failures fail.
        timeout: Duration::from_secs(2),
        ..RedisStoreConfig::default()
    })
    .await
    .expect("connect to Redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_conforms() {
    conformance::run_all(Arc::new(store().await)).await;
}

#[tokio::test]
async fn counters_live_in_one_hash_per_key_with_a_ttl_of_two_windows() {
    let store = store().await;
    let key = fresh_key(20);
    let limits = Limits::per_hour(10, 1.0, 100);
    use verdict_limiter::CounterStore;
    assert!(store.check(&key, &limits).await.unwrap().allowed);
    let client = store.client();
    let fields: Vec<String> = client.hkeys(key.redis_key()).await.unwrap();
    assert_eq!(fields, vec![key.redis_field()]);
    let ttl: i64 = client.pttl(key.redis_key()).await.unwrap();
    assert!(
        (2 * 3_600_000 - 5_000..=2 * 3_600_000).contains(&ttl),
        "ttl {ttl} ms"
    );
    // A denial writes nothing: the TTL is not refreshed by it.
    let exhausted = Limits::per_hour(1, 0.001, 100);
    let key2 = fresh_key(21);
    assert!(store.check(&key2, &exhausted).await.unwrap().allowed);
    let before: Vec<u8> = client
        .hget(key2.redis_key(), key2.redis_field())
        .await
        .unwrap();
    assert!(!store.check(&key2, &exhausted).await.unwrap().allowed);
    let after: Vec<u8> = client
        .hget(key2.redis_key(), key2.redis_field())
        .await
        .unwrap();
    assert_eq!(before, after);
}

#[tokio::test]
async fn the_script_is_reloaded_after_script_flush() {
    let store = store().await;
    let client = store.client();
    let _: () = client.script_flush(false).await.unwrap();
    let key = fresh_key(22);
    let o = store
        .check_at(&key, &Limits::per_hour(3, 1.0, 10), 1_796_047_200_000)
        .await
        .unwrap();
    assert!(o.allowed);
    let exists: Vec<bool> = client.script_exists(store.script_sha()).await.unwrap();
    assert_eq!(exists, vec![true]);
}

/// A request sequence: gaps between requests (ms) and the limits in force.
fn scenario() -> impl Strategy<Value = (Limits, Vec<i64>)> {
    let limits = (
        1u32..50,
        prop_oneof![Just(0.0), 0.001f64..5.0, 5.0f64..500.0],
        0u32..60,
        prop_oneof![Just(3_600_000i64), 1_000i64..20_000],
    )
        .prop_map(|(capacity, refill, quota, window_ms)| Limits {
            window_ms,
            ..Limits::per_hour(capacity, refill, quota)
        });
    let gaps = proptest::collection::vec(
        prop_oneof![Just(0i64), 0i64..50, 0i64..5_000, 0i64..4_000_000],
        1..60,
    );
    (limits, gaps)
}

#[test]
fn lua_script_and_rust_core_agree_on_every_answer() {
    require(Service::Redis);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(store());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(150));
    runner
        .run(&scenario(), |(limits, gaps)| {
            let key = fresh_key(23);
            let mut state: Option<CounterState> = None;
            let mut now = 1_796_047_200_000i64 + 1_234;
            for (i, gap) in gaps.iter().enumerate() {
                now += gap;
                let (want, next) = decide(state, now, &limits);
                if next.is_some() {
                    state = next;
                }
                let got = rt
                    .block_on(store.check_at(&key, &limits, now))
                    .expect("EVALSHA");
                prop_assert_eq!(
                    got,
                    want,
                    "request {} at +{} ms under {:?}",
                    i,
                    now - 1_796_047_200_000i64,
                    limits
                );
            }
            Ok(())
        })
        .unwrap();
}
