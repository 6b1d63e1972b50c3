//! Encode, decode and Arrow conversion of decision events: the per-event costs that the
//! decision path (encode) and the ingest write path (decode + batch) pay.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RawBatchBuilder, RegionId, RouteClassId,
    TierId, Verdict,
};

fn event(i: u64) -> DecisionEvent {
    let denied = i.is_multiple_of(50);
    DecisionEvent {
        event_time_ms: 1_796_047_200_000 + i as i64,
        key_id: KeyId((i % 10_000).to_le_bytes().repeat(2).try_into().unwrap()),
        route_class: RouteClassId((i % 5) as u8),
        tier: TierId((i % 4) as u8),
        region: RegionId(1),
        gateway_instance: (i % 18) as u32,
        verdict: if denied {
            Verdict::Denied
        } else {
            Verdict::Allowed
        },
        denied_by: DeniedBy {
            bucket: denied,
            window: false,
        },
        source: DecisionSource::CounterStore,
        remaining_tokens: (i % 100) as u32,
        remaining_window: 5000 - (i % 5000) as u32,
        retry_after_ms: if denied { 100 } else { 0 },
        window_quota: 5000,
        policy_version: 42,
        sub_key: 0,
        sub_keys: 1,
    }
}

fn codec(c: &mut Criterion) {
    let e = event(7);
    let bytes = e.encode();
    let mut g = c.benchmark_group("event_v1");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode", |b| b.iter(|| black_box(black_box(&e).encode())));
    g.bench_function("decode", |b| {
        b.iter(|| DecisionEvent::decode(black_box(&bytes)))
    });
    g.finish();

    let n = 65_536;
    let wire: Vec<[u8; 64]> = (0..n).map(|i| event(i).encode()).collect();
    let mut g = c.benchmark_group("raw_batch");
    g.throughput(Throughput::Elements(n));
    g.bench_function("decode_and_build_64k", |b| {
        b.iter_batched(
            || RawBatchBuilder::with_capacity(n as usize),
            |mut builder| {
                for (offset, w) in wire.iter().enumerate() {
                    if let Ok(e) = DecisionEvent::decode(w) {
                        builder.push(&e, "main", 0, offset as i64);
                    }
                }
                builder.finish().unwrap()
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
