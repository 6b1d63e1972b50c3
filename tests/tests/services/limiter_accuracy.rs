//! Accuracy through the real Redis, a single server and the 3-master cluster: 8 gateway
//! instances (each its own limiter and connections) hammer the same keys; no key gets more
//! than 10 % over what its limits admit over the run, and a hot key split into sub-keys
//! (on slots of their own, so on several masters of the cluster) stays within its limit in
//! total.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{Limiter, LimiterConfig, PolicyHandle, PolicySnapshot, Request};
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId};
use verdict_tests::discarded_events;
use verdict_tests::{Service, redis_cluster_url, redis_url, require, unique_name};

const INSTANCES: u32 = 8;
const TASKS_PER_INSTANCE: u32 = 4;
const RUN: Duration = Duration::from_secs(2);

/// One tier and route class (a bucket of 50 refilling 20 a second), and a hot key with
/// more, split 8 ways.
fn policy(hot: KeyId) -> PolicySnapshot {
    let hot_key = format!(
        r#"
[[overrides]]
key_id = "{hot}"
capacity = 80
refill_per_s = 40.0
hourly_quota = 100000
[[hot_keys]]
key_id = "{hot}"
sub_keys = 8
"#
    );
    let text = include_str!("../../fixtures/policies/one_limit.toml").to_owned() + &hot_key;
    PolicySnapshot::build(parse_toml(&text).unwrap()).unwrap()
}

fn key(salt: &[u8], i: u8) -> KeyId {
    let mut id = [0u8; 16];
    let n = salt.len().min(15);
    id[..n].copy_from_slice(&salt[salt.len() - n..]);
    id[15] = i;
    KeyId(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_on_the_same_keys_stay_within_ten_percent_and_hot_keys_within_the_limit() {
    require(Service::Redis);
    eight_instances(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_eight_instances_stay_within_ten_percent_and_hot_keys_within_the_limit() {
    require(Service::RedisCluster);
    eight_instances(&redis_cluster_url()).await;
}

async fn eight_instances(url: &str) {
    let salt = unique_name("acc");
    let salt = salt.as_bytes();
    const KEYS: u8 = 10;
    let hot = key(salt, 255);
    let snapshot = policy(hot);

    let mut limiters = Vec::new();
    for i in 0..INSTANCES {
        // A generous deadline: this test is about counting, not about a loaded CI machine.
        let store = RedisStore::connect(&RedisStoreConfig {
            url: url.to_owned(),
            timeout: Duration::from_secs(2),
            connections: 1,
            ..RedisStoreConfig::default()
        })
        .await
        .expect("connect");
        let (queue, metrics) = discarded_events(1 << 16);
        let cfg = LimiterConfig {
            instance: i,
            instance_count: INSTANCES,
            ..LimiterConfig::default()
        };
        limiters.push(Arc::new(Limiter::new(
            store,
            PolicyHandle::new(snapshot.clone(), 0),
            queue,
            metrics,
            cfg,
        )));
    }

    let allowed: Arc<Vec<AtomicU32>> = Arc::new((0..=KEYS).map(|_| AtomicU32::new(0)).collect());
    let fallback = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for l in &limiters {
        for t in 0..TASKS_PER_INSTANCE {
            let (l, allowed, fallback) =
                (Arc::clone(l), Arc::clone(&allowed), Arc::clone(&fallback));
            let salt = salt.to_vec();
            tasks.push(tokio::spawn(async move {
                let mut n = t as usize;
                while started.elapsed() < RUN {
                    n += 1;
                    // Every key in turn, and the hot key as often as all of them together.
                    let (slot, id) = if n.is_multiple_of(2) {
                        (KEYS as usize, hot)
                    } else {
                        let k = (n / 2) % KEYS as usize;
                        (k, key(&salt, k as u8))
                    };
                    let caller = (n as u64).to_le_bytes();
                    let d = l
                        .check(&Request {
                            key_id: id,
                            route_class: RouteClassId(0),
                            tier: TierId(0),
                            caller: &caller,
                        })
                        .await;
                    if d.is_allowed() {
                        allowed[slot].fetch_add(1, Ordering::Relaxed);
                    }
                    if d.source == DecisionSource::LocalFallback {
                        fallback.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        fallback.load(Ordering::Relaxed),
        0,
        "every decision came from Redis"
    );

    // What the limits admit over the run: the burst plus the refill (the hourly quota is
    // far away).
    let limit = 50.0 + 20.0 * secs;
    for k in 0..KEYS as usize {
        let a = f64::from(allowed[k].load(Ordering::Relaxed));
        println!("key {k}: allowed {a} of {limit:.0} ({:.3})", a / limit);
        assert!(
            a <= limit * 1.10,
            "key {k}: {a} allowed, limit {limit:.0} over {secs:.2} s"
        );
        assert!(
            a >= limit * 0.5,
            "key {k}: only {a} allowed of {limit:.0}: the limiter starves it"
        );
    }
    let hot_limit = 80.0 + 40.0 * secs;
    let a = f64::from(allowed[KEYS as usize].load(Ordering::Relaxed));
    println!(
        "hot key (8 sub-keys): allowed {a} of {hot_limit:.0} ({:.3})",
        a / hot_limit
    );
    assert!(a <= hot_limit, "hot key: {a} allowed, limit {hot_limit:.0}");
    assert!(a >= hot_limit * 0.5, "hot key: only {a} of {hot_limit:.0}");
}
