//! The conformance suite every counter store must pass, on the store's own clock (so it
//! holds for Redis, whose `TIME` decides): bursts up to the capacity, the hourly quota,
//! denials that consume nothing, independent keys, and atomicity under concurrency.
//! Each check panics with what went wrong; [`run_all`] runs them all.

use std::sync::Arc;

use verdict_schemas::{KeyId, RouteClassId, TierId};

use crate::algo::Limits;
use crate::counter_store::CounterStore;
use crate::key::LimitKey;

/// A limit key no other run has used (the store may be shared and long-lived).
pub fn fresh_key(tag: u8) -> LimitKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut id = [tag; 16];
    id[..12].copy_from_slice(&nanos.to_le_bytes()[..12]);
    id[12..16].copy_from_slice(&std::process::id().to_le_bytes());
    LimitKey::new(KeyId(id), RouteClassId(1), TierId(2))
}

async fn ok<S: CounterStore>(
    store: &S,
    key: &LimitKey,
    limits: &Limits,
) -> crate::algo::CounterCheck {
    hits(store, key, limits, 1).await
}

async fn hits<S: CounterStore>(
    store: &S,
    key: &LimitKey,
    limits: &Limits,
    hits: u32,
) -> crate::algo::CounterCheck {
    store
        .check(key, limits, hits)
        .await
        .unwrap_or_else(|e| panic!("store failed: {e}"))
}

/// A full bucket admits exactly its capacity back to back, then the bucket refuses with a
/// Retry-After of about one refill interval.
pub async fn burst_up_to_capacity<S: CounterStore>(store: &S) {
    let key = fresh_key(1);
    let limits = Limits::per_hour(5, 1.0, 1_000);
    for i in 0..5u32 {
        let o = ok(store, &key, &limits).await;
        assert!(
            o.allowed,
            "request {i} of a full bucket of 5 was denied: {o:?}"
        );
        assert_eq!(
            o.remaining_tokens,
            4 - i,
            "remaining tokens after request {i}"
        );
        assert_eq!(
            o.remaining_window,
            999 - i,
            "remaining window after request {i}"
        );
    }
    let d = ok(store, &key, &limits).await;
    assert!(
        !d.allowed && d.denied_by_bucket && !d.denied_by_window,
        "{d:?}"
    );
    // One token per second; a few ms may have passed since the last allowed request.
    assert!(
        (900..=1000).contains(&d.retry_after_ms),
        "retry-after {} ms",
        d.retry_after_ms
    );
}

/// The window refuses the request after the quota, whatever the bucket holds.
pub async fn quota_per_window<S: CounterStore>(store: &S) {
    let key = fresh_key(2);
    let limits = Limits::per_hour(100, 100.0, 3);
    for _ in 0..3 {
        assert!(ok(store, &key, &limits).await.allowed);
    }
    let d = ok(store, &key, &limits).await;
    assert!(
        !d.allowed && d.denied_by_window && !d.denied_by_bucket,
        "{d:?}"
    );
    assert_eq!(d.remaining_window, 0);
    assert!(d.retry_after_ms > 0);
}

/// Denials consume nothing: refused by the window, the bucket keeps its tokens; refused by
/// the bucket, the window keeps its quota.
pub async fn denials_consume_nothing<S: CounterStore>(store: &S) {
    let key = fresh_key(3);
    let window_bound = Limits::per_hour(100, 0.001, 2);
    for _ in 0..2 {
        assert!(ok(store, &key, &window_bound).await.allowed);
    }
    for _ in 0..10 {
        let d = ok(store, &key, &window_bound).await;
        assert!(!d.allowed && d.denied_by_window);
        assert_eq!(d.remaining_tokens, 98, "a window denial took a token");
    }

    let key = fresh_key(4);
    let bucket_bound = Limits::per_hour(1, 0.001, 10);
    assert!(ok(store, &key, &bucket_bound).await.allowed);
    for _ in 0..10 {
        let d = ok(store, &key, &bucket_bound).await;
        assert!(!d.allowed && d.denied_by_bucket && !d.denied_by_window);
        assert_eq!(
            d.remaining_window, 9,
            "a bucket denial counted against the quota"
        );
    }
}

/// Different key ids, route classes, tiers and sub-keys count separately.
pub async fn keys_are_independent<S: CounterStore>(store: &S) {
    let limits = Limits::per_hour(1, 0.001, 100);
    let base = fresh_key(5);
    let others = [
        LimitKey {
            route_class: RouteClassId(9),
            ..base
        },
        LimitKey {
            tier: TierId(9),
            ..base
        },
        LimitKey {
            sub_key: 1,
            sub_keys: 2,
            ..base
        },
        LimitKey {
            key_id: fresh_key(6).key_id,
            ..base
        },
    ];
    assert!(ok(store, &base, &limits).await.allowed);
    assert!(!ok(store, &base, &limits).await.allowed);
    for k in others {
        assert!(
            ok(store, &k, &limits).await.allowed,
            "{k:?} shared a counter with {base:?}"
        );
    }
}

/// A request of n hits takes n tokens and counts n in the window, or is refused whole; one
/// of no hits checks and counts nothing; one of more hits than a limit holds is refused
/// with a retry after a window.
pub async fn hits_count_whole_and_zero_only_checks<S: CounterStore>(store: &S) {
    let answer = |o: crate::algo::CounterCheck| {
        (
            o.allowed,
            o.denied_by_bucket,
            o.denied_by_window,
            o.remaining_tokens,
            o.remaining_window,
        )
    };
    let key = fresh_key(8);
    let bucket_bound = Limits::per_hour(5, 0.001, 1_000);
    let h = |n| hits(store, &key, &bucket_bound, n);
    assert_eq!(answer(h(0).await), (true, false, false, 5, 1_000));
    assert_eq!(answer(h(3).await), (true, false, false, 2, 997));
    let refused = h(3).await;
    assert_eq!(answer(refused), (false, true, false, 2, 997));
    // One token at 0.001 a second: 1,000 s for the third.
    assert!(
        (999_000..=1_000_000).contains(&refused.retry_after_ms),
        "retry-after {} ms",
        refused.retry_after_ms
    );
    assert_eq!(answer(h(0).await), (true, false, false, 2, 997));
    assert_eq!(answer(h(2).await), (true, false, false, 0, 995));
    assert_eq!(answer(h(0).await), (true, false, false, 0, 995));
    let never = h(6).await;
    assert_eq!(answer(never), (false, true, false, 0, 995));
    assert_eq!(
        never.retry_after_ms, 3_600_000,
        "more hits than the capacity"
    );

    let key = fresh_key(9);
    let window_bound = Limits::per_hour(100, 0.001, 8);
    let h = |n| hits(store, &key, &window_bound, n);
    assert_eq!(answer(h(5).await), (true, false, false, 95, 3));
    assert_eq!(answer(h(4).await), (false, false, true, 95, 3));
    assert_eq!(answer(h(3).await), (true, false, false, 92, 0));
    assert_eq!(answer(h(0).await), (true, false, false, 92, 0));
    assert_eq!(answer(h(1).await), (false, false, true, 92, 0));
    assert_eq!(
        h(9).await.retry_after_ms,
        3_600_000,
        "more hits than the quota"
    );
}

/// Many concurrent callers on one key: exactly the capacity is admitted (read, decide and
/// write are one atomic step).
pub async fn atomic_under_concurrency<S: CounterStore>(store: Arc<S>) {
    let key = fresh_key(7);
    let limits = Limits::per_hour(100, 0.001, 10_000);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let mut allowed = 0u32;
            for _ in 0..10 {
                if ok(store.as_ref(), &key, &limits).await.allowed {
                    allowed += 1;
                }
            }
            allowed
        });
    }
    let mut allowed = 0;
    while let Some(n) = tasks.join_next().await {
        allowed += n.expect("task");
    }
    assert_eq!(
        allowed, 100,
        "500 concurrent requests against a bucket of 100"
    );
}

/// Every check above.
pub async fn run_all<S: CounterStore>(store: Arc<S>) {
    burst_up_to_capacity(store.as_ref()).await;
    quota_per_window(store.as_ref()).await;
    denials_consume_nothing(store.as_ref()).await;
    keys_are_independent(store.as_ref()).await;
    hits_count_whole_and_zero_only_checks(store.as_ref()).await;
    atomic_under_concurrency(store).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_store_conforms() {
        run_all(Arc::new(MemoryStore::new(100_000))).await;
    }
}
