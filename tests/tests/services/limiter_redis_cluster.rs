//! The Redis counter store on the 3-master, 3-replica cluster `scripts/services.sh up
//! redis-cluster` starts: the conformance suite every store passes, concurrent requests over
//! keys of many slots (the lanes split a batch into one call per slot), and a hot key's
//! sub-keys on slots of their own, spread over the masters, each hash on the master that
//! owns its slot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fred::prelude::*;
use verdict_counters_redis::RedisStore;
use verdict_limiter::conformance::{self, fresh_key};
use verdict_limiter::{CounterStore, LimitKey, Limits};
use verdict_tests::{Service, redis_store};

async fn store() -> RedisStore {
    redis_store(Service::RedisCluster).await
}

/// The master that owns `hash`'s slot, as `host:port`, from the store's routing table.
fn owner(store: &RedisStore, hash: &str) -> String {
    let routing = store
        .client()
        .cached_cluster_state()
        .expect("a clustered client knows the cluster's slots");
    let server = routing
        .get_server(fred::util::redis_keyslot(hash.as_bytes()))
        .expect("every slot has a master");
    format!("{}:{}", server.host, server.port)
}

/// A plain client of one node (not cluster-aware: a key of another node's slot is refused).
async fn node(address: &str) -> Client {
    let client = Builder::from_config(
        Config::from_url(&format!("redis://{address}")).expect("node address"),
    )
    .build()
    .expect("client");
    client.init().await.expect("connect to the node");
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_conforms() {
    conformance::run_all(Arc::new(store().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_has_three_masters_with_a_replica_each() {
    let store = store().await;
    let routing = store.client().cached_cluster_state().expect("routing");
    let masters: BTreeSet<String> = routing
        .unique_primary_nodes()
        .iter()
        .map(|s| format!("{}:{}", s.host, s.port))
        .collect();
    assert_eq!(masters.len(), 3, "{masters:?}");
    for m in &masters {
        let info: String = node(m)
            .await
            .info(Some(fred::types::InfoKind::Replication))
            .await
            .unwrap();
        assert!(info.contains("role:master"), "{m}: {info}");
        assert!(info.contains("connected_slaves:1"), "{m}: {info}");
    }
}

/// Ten concurrent requests on each of 40 keys (40 slots, on every master): each key admits
/// exactly its capacity, each allowed request with its own token, so no request was lost,
/// answered twice or sent to a node that does not own its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_over_many_slots_each_get_their_own_answer() {
    let store = Arc::new(store().await);
    let limits = Limits::per_hour(3, 0.001, 1_000);
    let keys: Vec<LimitKey> = (0..40u8)
        .map(|i| {
            let mut k = fresh_key(30);
            k.key_id.0[0] = i;
            k
        })
        .collect();
    let hash = |k: &LimitKey| store.layout().hash(k);
    let masters: BTreeSet<String> = keys.iter().map(|k| owner(&store, &hash(k))).collect();
    assert_eq!(masters.len(), 3, "40 keys land on every master");
    // The store's shards are the masters: keys of one master share a shard (and so a
    // breaker in the limiter), keys of different masters do not.
    assert_eq!(store.shards(), 3);
    let pairs: BTreeSet<(usize, String)> = keys
        .iter()
        .map(|k| (store.locate(k).shard, owner(&store, &hash(k))))
        .collect();
    assert_eq!(pairs.len(), 3, "one shard per master: {pairs:?}");
    let mut tasks = tokio::task::JoinSet::new();
    for (i, key) in keys.iter().enumerate() {
        for _ in 0..10 {
            let (store, key) = (Arc::clone(&store), *key);
            tasks.spawn(async move { (i, store.check(&key, &limits, 1).await.expect("decision")) });
        }
    }
    let mut remaining: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for (i, o) in tasks.join_all().await {
        if o.allowed {
            remaining.entry(i).or_default().push(o.remaining_tokens);
        } else {
            assert!(o.denied_by_bucket && o.retry_after_ms > 0, "key {i}: {o:?}");
        }
    }
    assert_eq!(remaining.len(), keys.len(), "every key admitted some");
    for (i, mut r) in remaining {
        r.sort_unstable();
        assert_eq!(r, vec![0, 1, 2], "key {i}: the remainders of its 3 tokens");
    }
}

/// A hot key split into 16 sub-keys: 16 hashes on 16 slots, on all three masters, each
/// written to the master that owns its slot when a caller of that sub-key is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_sub_keys_spread_over_slots_and_masters() {
    let store = store().await;
    let hot = fresh_key(31);
    let mut by_sub_key: BTreeMap<u8, LimitKey> = BTreeMap::new();
    for caller in 0..2_000u32 {
        let k = hot.split(16, &caller.to_le_bytes());
        by_sub_key.entry(k.sub_key).or_insert(k);
    }
    assert_eq!(by_sub_key.len(), 16, "2,000 callers reach every sub-key");
    let slots: BTreeSet<u16> = by_sub_key
        .values()
        .map(|k| fred::util::redis_keyslot(store.layout().hash(k).as_bytes()))
        .collect();
    assert_eq!(slots.len(), 16, "each sub-key on a slot of its own");

    let limits = Limits::per_hour(10, 1.0, 100);
    let mut per_master: BTreeMap<String, usize> = BTreeMap::new();
    for k in by_sub_key.values() {
        assert!(store.check(k, &limits, 1).await.unwrap().allowed);
        let hash = store.layout().hash(k);
        let master = owner(&store, &hash);
        let exists: i64 = node(&master).await.exists(&hash).await.unwrap();
        assert_eq!(exists, 1, "{hash} is on {master}, the owner of its slot");
        *per_master.entry(master).or_default() += 1;
    }
    println!("sub-keys per master: {per_master:?}");
    assert_eq!(per_master.len(), 3, "{per_master:?}");
}
