//! Properties of the codec and the Arrow conversion over generated inputs.

use arrow::array::{Array, AsArray, BooleanArray, FixedSizeBinaryArray, TimestampMillisecondArray};
use arrow::datatypes::{Int64Type, UInt8Type, UInt32Type};
use proptest::prelude::*;
use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RawBatchBuilder, RegionId, RouteClassId,
    TierId, Verdict, raw_schema,
};

fn verdict_and_denied_by() -> impl Strategy<Value = (Verdict, DeniedBy)> {
    prop_oneof![
        Just((Verdict::Allowed, DeniedBy::NONE)),
        (
            prop_oneof![Just(Verdict::Denied), Just(Verdict::WouldDeny)],
            1u8..=3
        )
            .prop_map(|(v, bits)| (
                v,
                DeniedBy::from_bits(bits).expect("bits 1..=3 are defined")
            )),
    ]
}

fn source() -> impl Strategy<Value = DecisionSource> {
    (0u8..4).prop_map(|c| DecisionSource::from_code(c).expect("codes 0..4 are defined"))
}

prop_compose! {
    fn event()(
        event_time_ms in any::<i64>(),
        key in any::<[u8; 16]>(),
        route_class in any::<u8>(),
        tier in any::<u8>(),
        region in any::<u16>(),
        gateway_instance in any::<u32>(),
        (verdict, denied_by) in verdict_and_denied_by(),
        source in source(),
        remaining_tokens in any::<u32>(),
        remaining_window in any::<u32>(),
        retry_after_ms in any::<u32>(),
        window_quota in any::<u32>(),
        policy_version in 0..=i64::MAX as u64,
        (sub_key, sub_keys) in (1u8..=255).prop_flat_map(|n| (0..n, Just(n))),
    ) -> DecisionEvent {
        // Who and where, then what was decided, then the counters it reports.
        DecisionEvent {
            event_time_ms,
            key_id: KeyId(key),
            sub_key,
            sub_keys,
            route_class: RouteClassId(route_class),
            tier: TierId(tier),
            region: RegionId(region),
            gateway_instance,
            policy_version,
            verdict,
            denied_by,
            source,
            retry_after_ms,
            remaining_tokens,
            remaining_window,
            window_quota,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn every_valid_event_round_trips(e in event()) {
        let bytes = e.encode();
        prop_assert_eq!(bytes[0], 1);
        prop_assert_eq!(DecisionEvent::decode(&bytes), Ok(e));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        // Ok or a typed error; either way no panic. A success must re-encode to the input.
        if let Ok(e) = DecisionEvent::decode(&bytes) {
            let again = e.encode();
            prop_assert_eq!(again.as_slice(), bytes.as_slice());
        }
    }

    #[test]
    fn v1_sized_noise_never_panics(mut bytes in any::<[u8; 64]>(), keep_version in any::<bool>()) {
        // Mostly-v1 input reaches the field checks instead of stopping at the version byte.
        if keep_version { bytes[0] = 1; }
        if let Ok(e) = DecisionEvent::decode(&bytes) {
            prop_assert_eq!(e.encode(), bytes);
        }
    }

    #[test]
    fn single_bit_flips_decode_to_a_different_event_or_an_error(e in event(), bit in 0usize..512) {
        let mut bytes = e.encode();
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert_ne!(DecisionEvent::decode(&bytes), Ok(e));
    }

    #[test]
    fn raw_batch_holds_every_field_of_every_event(
        events in proptest::collection::vec(event(), 0..64),
        partition in 0i32..64,
        first_offset in 0i64..1_000_000,
    ) {
        let mut b = RawBatchBuilder::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            b.push(e, "main", partition, first_offset + i as i64);
        }
        let batch = b.finish().unwrap();
        prop_assert_eq!(batch.schema(), raw_schema());
        prop_assert_eq!(batch.num_rows(), events.len());

        let col = |name: &str| batch.column_by_name(name).unwrap();
        let time = col("event_time").as_any().downcast_ref::<TimestampMillisecondArray>().unwrap();
        let key = col("key_id").as_any().downcast_ref::<FixedSizeBinaryArray>().unwrap();
        let bucket = col("denied_by_bucket").as_any().downcast_ref::<BooleanArray>().unwrap();
        let window = col("denied_by_window").as_any().downcast_ref::<BooleanArray>().unwrap();
        for (i, e) in events.iter().enumerate() {
            prop_assert_eq!(time.value(i), e.event_time_ms);
            prop_assert_eq!(key.value(i), e.key_id.0.as_slice());
            prop_assert_eq!(col("tier").as_primitive::<UInt8Type>().value(i), e.tier.0);
            prop_assert_eq!(col("route_class").as_primitive::<UInt8Type>().value(i), e.route_class.0);
            prop_assert_eq!(col("verdict").as_primitive::<UInt8Type>().value(i), e.verdict.code());
            prop_assert_eq!(col("source").as_primitive::<UInt8Type>().value(i), e.source.code());
            prop_assert_eq!(bucket.value(i), e.denied_by.bucket);
            prop_assert_eq!(window.value(i), e.denied_by.window);
            prop_assert_eq!(col("remaining_window").as_primitive::<UInt32Type>().value(i), e.remaining_window);
            prop_assert_eq!(col("policy_version").as_primitive::<Int64Type>().value(i) as u64, e.policy_version);
            prop_assert_eq!(col("kafka_offset").as_primitive::<Int64Type>().value(i), first_offset + i as i64);
        }
        for c in batch.columns() {
            prop_assert_eq!(c.null_count(), 0);
        }
    }
}
