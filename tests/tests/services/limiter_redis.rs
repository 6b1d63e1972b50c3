//! The Redis counter store against the real Redis: the conformance suite every store
//! passes, the Lua script computing exactly what the Rust core computes for the same
//! requests and charges, the key layout and TTL (and the sweep of a group's idle keys), and the reload
//! after a `SCRIPT FLUSH`.

use std::sync::Arc;

use fred::prelude::*;
use proptest::prelude::*;
use verdict_counters_redis::RedisStore;
use verdict_limiter::conformance::{self, fresh_key};
use verdict_limiter::{CounterState, Limits, charge, decide, decide_hits};
use verdict_tests::{Service, redis_store, require};

/// One request of `key` at `now`, decided by the script in Redis and by the Rust core from
/// `state` (which it advances): (Redis's answer, the core's).
fn both_decide(
    rt: &tokio::runtime::Runtime,
    store: &RedisStore,
    key: &verdict_limiter::LimitKey,
    limits: &Limits,
    hits: u32,
    state: &mut Option<CounterState>,
    now: i64,
) -> (verdict_limiter::CounterCheck, verdict_limiter::CounterCheck) {
    let (want, next) = decide_hits(*state, now, limits, hits);
    if next.is_some() {
        *state = next;
    }
    let got = rt
        .block_on(store.check_at(key, limits, hits, now))
        .expect("EVALSHA");
    (got, want)
}

async fn store() -> RedisStore {
    redis_store(Service::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_conforms() {
    conformance::run_all(Arc::new(store().await)).await;
}

#[tokio::test]
async fn counters_live_in_a_field_of_their_group_with_a_ttl_of_two_windows() {
    let store = store().await;
    let layout = *store.layout();
    let key = fresh_key(20);
    let limits = Limits::per_hour(10, 1.0, 100);
    use verdict_limiter::CounterStore;
    assert!(store.check(&key, &limits, 1).await.unwrap().allowed);
    let client = store.client();
    let hash = layout.hash(&key);
    assert_eq!(hash, format!("rl:{{g{}}}", layout.group(&key)));
    let state: Vec<u8> = client.hget(&hash, &layout.field(&key)[..]).await.unwrap();
    assert_eq!(state.len(), 24, "the bucket and the window, packed");
    // The script's own field: the window (an hour, by index) in which it last swept the hash.
    let swept: String = client.hget(&hash, "").await.unwrap();
    let now_ms = {
        use verdict_limiter::Clock;
        verdict_limiter::SystemClock.now_ms()
    };
    assert!(
        (now_ms / 3_600_000 - 1..=now_ms / 3_600_000).contains(&swept.parse::<i64>().unwrap()),
        "swept in window {swept}"
    );
    let ttl: i64 = client.pttl(&hash).await.unwrap();
    assert!(
        (2 * 3_600_000 - 5_000..=2 * 3_600_000).contains(&ttl),
        "ttl {ttl} ms"
    );
    // The layout is recorded, and a store set for another refuses to start, naming both.
    let recorded: String = client.get("rl:layout").await.unwrap();
    assert_eq!(recorded, layout.groups().to_string());
    let other = verdict_counters_redis::RedisStoreConfig {
        url: verdict_tests::redis_url(),
        layout: verdict_counters_redis::Layout::new(layout.groups() / 2).unwrap(),
        ..verdict_counters_redis::RedisStoreConfig::default()
    };
    let refused = RedisStore::connect(&other).await.unwrap_err();
    let refused = format!(
        "{refused}: {}",
        std::error::Error::source(&refused).map_or(String::new(), |e| e.to_string())
    );
    assert!(
        refused.contains(&format!("laid out in {} key groups", layout.groups()))
            && refused.contains(&format!("set for {}", layout.groups() / 2)),
        "{refused}"
    );
    // A denial writes nothing: the TTL is not refreshed by it.
    let exhausted = Limits::per_hour(1, 0.001, 100);
    let key2 = fresh_key(21);
    let (hash2, field2) = (layout.hash(&key2), layout.field(&key2));
    assert!(store.check(&key2, &exhausted, 1).await.unwrap().allowed);
    let before: Vec<u8> = client.hget(&hash2, &field2[..]).await.unwrap();
    assert!(!store.check(&key2, &exhausted, 1).await.unwrap().allowed);
    let after: Vec<u8> = client.hget(&hash2, &field2[..]).await.unwrap();
    assert_eq!(before, after);
}

/// Keys of one group, at the script's clock: a key idle for two windows is removed from the
/// hash at the first write of a window by another key of the group, and a key written
/// within the two windows stays, with its state.
#[tokio::test]
async fn a_group_sweeps_the_keys_idle_for_two_windows_and_keeps_the_others() {
    let store = store().await;
    let layout = *store.layout();
    let client = store.client();
    let w = 10_000i64;
    let limits = Limits {
        window_ms: w,
        ..Limits::per_hour(5, 0.0, 100)
    };
    // Three keys of one group: the first's id with other last four bytes, until two more
    // land in its group.
    let first = fresh_key(27);
    let mut keys = vec![first];
    for i in 0u32.. {
        let mut k = first;
        k.key_id.0[12..].copy_from_slice(&i.to_le_bytes());
        if k != first && layout.group(&k) == layout.group(&first) {
            keys.push(k);
            if keys.len() == 3 {
                break;
            }
        }
    }
    let hash = layout.hash(&first);
    let _: i64 = client.del(&hash).await.unwrap();
    let field = |k: &verdict_limiter::LimitKey| layout.field(k);
    let t0 = 1_796_047_200_000i64;
    // Key 0 is written at t0 and spends two of its five tokens; key 1 at t0 + 1.5 windows.
    for t in [t0, t0 + 1] {
        assert!(
            store
                .check_at(&keys[0], &limits, 1, t)
                .await
                .unwrap()
                .allowed
        );
    }
    assert!(
        store
            .check_at(&keys[1], &limits, 1, t0 + w + w / 2)
            .await
            .unwrap()
            .allowed
    );
    // Two windows after key 0's last write, key 2's first write sweeps: key 0 goes, key 1
    // (one window idle) stays.
    assert!(
        store
            .check_at(&keys[2], &limits, 1, t0 + 1 + 2 * w)
            .await
            .unwrap()
            .allowed
    );
    let gone: Option<Vec<u8>> = client.hget(&hash, &field(&keys[0])[..]).await.unwrap();
    assert_eq!(gone, None, "idle two windows: swept");
    let kept: Option<Vec<u8>> = client.hget(&hash, &field(&keys[1])[..]).await.unwrap();
    assert!(kept.is_some(), "idle one window: kept");
    // Key 1 still has what it spent (a bucket that never refills): its state was kept.
    let o = store
        .check_at(&keys[1], &limits, 1, t0 + 1 + 2 * w)
        .await
        .unwrap();
    assert_eq!((o.allowed, o.remaining_tokens), (true, 3));
    let _: i64 = client.del(&hash).await.unwrap();
}

#[tokio::test]
async fn the_script_is_reloaded_after_script_flush() {
    let store = store().await;
    let client = store.client();
    let _: () = client.script_flush(false).await.unwrap();
    let key = fresh_key(22);
    let o = store
        .check_at(&key, &Limits::per_hour(3, 1.0, 10), 1, 1_796_047_200_000)
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
    // What each request counts as: mostly one, some checks of none, some of several, a few
    // of more than any limit of the scenario holds.
    let hits = proptest::collection::vec(
        prop_oneof![6 => Just(1u32), 1 => Just(0u32), 2 => 2u32..8, 1 => 8u32..70],
        60,
    );
    runner
        .run(&(scenario(), hits), |((limits, gaps), hits)| {
            let key = fresh_key(23);
            let mut state: Option<CounterState> = None;
            let mut now = 1_796_047_200_000i64 + 1_234;
            for (i, (gap, hits)) in gaps.iter().zip(hits).enumerate() {
                now += gap;
                let (got, want) = both_decide(&rt, &store, &key, &limits, hits, &mut state, now);
                prop_assert_eq!(
                    got,
                    want,
                    "request {} of {} hits at +{} ms under {:?}",
                    i,
                    hits,
                    now - 1_796_047_200_000i64,
                    limits
                );
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn lua_script_and_rust_core_agree_on_charges_between_requests() {
    require(Service::Redis);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(store());
    let ops = proptest::collection::vec(
        (
            prop_oneof![Just(0i64), 0i64..50, 0i64..5_000, 0i64..4_000_000],
            prop_oneof![3 => Just(0u32), 1 => 1u32..40],
        ),
        1..60,
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(120));
    runner
        .run(&(scenario().prop_map(|(l, _)| l), ops), |(limits, ops)| {
            let key = fresh_key(27);
            let mut state: Option<CounterState> = None;
            let mut now = 1_796_047_200_000i64 + 4_321;
            for (i, (gap, count)) in ops.iter().enumerate() {
                now += gap;
                if *count > 0 {
                    // A charge writes what the core's `charge` computes; the next request
                    // (or charge) reads it back.
                    rt.block_on(store.charge_at(&key, &limits, *count, now))
                        .expect("EVALSHA");
                    state = Some(charge(state, now, &limits, *count));
                    continue;
                }
                let (got, want) = both_decide(&rt, &store, &key, &limits, 1, &mut state, now);
                prop_assert_eq!(
                    got,
                    want,
                    "op {} at +{} ms under {:?}",
                    i,
                    now - 1_796_047_200_000i64,
                    limits
                );
            }
            Ok(())
        })
        .unwrap();
}

/// Batches of requests to three limit keys (two in one hash), each batch at one instant.
fn batches() -> impl Strategy<Value = (Limits, Vec<(i64, Vec<usize>)>)> {
    let limits = (1u32..6, prop_oneof![Just(0.0), 0.5f64..20.0], 0u32..12).prop_map(
        |(capacity, refill, quota)| Limits {
            window_ms: 10_000,
            ..Limits::per_hour(capacity, refill, quota)
        },
    );
    let batch = (
        prop_oneof![Just(0i64), 0i64..300, 0i64..15_000],
        proptest::collection::vec(0usize..3, 1..12),
    );
    (limits, proptest::collection::vec(batch, 1..10))
}

#[test]
fn a_batch_decides_in_order_what_the_rust_core_decides_one_by_one() {
    require(Service::Redis);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(store());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(100));
    runner
        .run(&batches(), |(limits, batches)| {
            let a = fresh_key(24);
            let b = fresh_key(25);
            let a2 = verdict_limiter::LimitKey {
                route_class: verdict_schemas::RouteClassId(3),
                ..a
            };
            let keys = [a, a2, b];
            let layout = *store.layout();
            let hashes = keys.map(|k| layout.hash(&k));
            prop_assert_eq!(&hashes[0], &hashes[1]);
            // Each case starts from empty hashes: no sweep mark of an earlier case.
            let _: i64 = rt
                .block_on(store.client().del(hashes.to_vec()))
                .expect("DEL");
            let mut states: [Option<CounterState>; 3] = [None; 3];
            let mut swept: [Option<i64>; 3] = [None; 3];
            let mut now = 1_796_047_200_000i64 + 777;
            let w = limits.window_ms;
            for (gap, which) in &batches {
                now += gap;
                let requests: Vec<_> = which.iter().map(|&k| (keys[k], limits, 1)).collect();
                let got = rt
                    .block_on(store.check_many_at(&requests, now))
                    .expect("EVALSHA");
                prop_assert_eq!(got.len(), which.len());
                for (i, &k) in which.iter().enumerate() {
                    let (want, next) = decide(states[k], now, &limits);
                    if let Some(next) = next {
                        // The script's sweep: at a key's first write of a window, once a
                        // window per hash, the hash's keys idle for two windows are removed
                        // (what a hash of their own would lose to its TTL).
                        let first = states[k].is_none_or(|s| s.last_ms / w != now / w);
                        states[k] = Some(next);
                        let owner = hashes.iter().position(|h| *h == hashes[k]).unwrap_or(k);
                        if first && swept[owner] != Some(now / w) {
                            swept[owner] = Some(now / w);
                            for j in 0..keys.len() {
                                if hashes[j] == hashes[k]
                                    && states[j].is_some_and(|s| s.last_ms <= now - 2 * w)
                                {
                                    states[j] = None;
                                }
                            }
                        }
                    }
                    prop_assert_eq!(got[i], want, "request {} (key {}) of the batch", i, k);
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Many requests at once go through the lanes in batches; each is answered once, and the
/// answers are those of a bucket taken one request at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_calls_and_each_gets_its_own_answer() {
    use verdict_limiter::CounterStore;
    let store = Arc::new(store().await);
    let key = fresh_key(26);
    let limits = Limits::per_hour(100, 0.001, 1_000);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..400 {
        let store = Arc::clone(&store);
        tasks.spawn(async move { store.check(&key, &limits, 1).await.expect("decision") });
    }
    let answers = tasks.join_all().await;
    let allowed: Vec<u32> = answers
        .iter()
        .filter(|o| o.allowed)
        .map(|o| o.remaining_tokens)
        .collect();
    assert_eq!(allowed.len(), 100, "the bucket admits exactly its capacity");
    // Each allowed request took its own token: the remainders are 99, 98, … 0, once each.
    let mut sorted = allowed.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
    assert!(
        answers
            .iter()
            .filter(|o| !o.allowed)
            .all(|o| o.denied_by_bucket && o.retry_after_ms > 0)
    );
}
