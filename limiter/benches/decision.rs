//! The decision path without I/O: policy lookup + token bucket and sliding window + event
//! encode (budget ≤ 500 ns), and the same through the memory store (the fallback's path,
//! which adds a shard lock and a hash map).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use verdict_limiter::algo::decide;
use verdict_limiter::policy::{LimitLookup, parse_toml};
use verdict_limiter::{FakeClock, LimitKey, MemoryStore, PolicySnapshot};
use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};

const POLICY: &str = include_str!("../fixtures/policies/decision.toml");

fn pure_path(c: &mut Criterion) {
    let policy = PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap();
    let key_id = KeyId([7; 16]);
    let (route, tier) = (RouteClassId(1), TierId(0));
    let mut state = None;
    let mut now = 1_796_047_200_000i64;

    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    g.bench_function("policy_lookup+decide+event_encode", |b| {
        b.iter(|| {
            now += 1;
            let LimitLookup::Check { limits, .. } = policy.resolve(black_box(&key_id), route, tier)
            else {
                unreachable!("the bench policy checks this key")
            };
            let (o, next) = decide(state, now, &limits);
            if next.is_some() {
                state = next;
            }
            let e = DecisionEvent {
                event_time_ms: o.now_ms,
                key_id,
                route_class: route,
                tier,
                region: RegionId(1),
                gateway_instance: 3,
                verdict: if o.allowed {
                    Verdict::Allowed
                } else {
                    Verdict::Denied
                },
                denied_by: DeniedBy {
                    bucket: o.denied_by_bucket,
                    window: o.denied_by_window,
                },
                source: DecisionSource::CounterStore,
                remaining_tokens: o.remaining_tokens,
                remaining_window: o.remaining_window,
                retry_after_ms: o.retry_after_ms,
                window_quota: limits.quota,
                policy_version: policy.version(),
                sub_key: 0,
                sub_keys: 1,
            };
            black_box(e.encode())
        })
    });

    let clock = FakeClock::at(now);
    let store = MemoryStore::with_clock(1_000_000, Arc::new(clock.clone()));
    let keys: Vec<LimitKey> = (0..10_000u32)
        .map(|i| {
            let mut id = [0u8; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            LimitKey::new(KeyId(id), route, tier)
        })
        .collect();
    let limits = verdict_limiter::Limits::per_hour(100, 10.0, 5000);
    let mut i = 0usize;
    g.bench_function("memory_store_decide_10k_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            clock.advance(1);
            black_box(store.decide(&keys[i], &limits, 1))
        })
    });
    g.finish();
}

criterion_group!(benches, pure_path);
criterion_main!(benches);
