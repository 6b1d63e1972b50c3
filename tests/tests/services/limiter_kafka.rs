//! Decision events through the real Kafka: the limiter's queue drains into the Kafka sink,
//! every decision becomes one record keyed by its key id whose value decodes to exactly the
//! decision's event, and shutdown flushes what is in flight.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::Message;
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot, Request,
    event_queue,
};
use verdict_schemas::{DecisionEvent, KeyId, RouteClassId, TierId, Verdict};
use verdict_tests::{Service, drain_to_kafka, kafka_consumer, require, unique_name};

const POLICY: &str = r#"
[[tiers]]
id = 0
name = "free"
[[route_classes]]
id = 0
name = "read"
[[limits]]
tier = "free"
route_class = "*"
capacity = 5
refill_per_s = 0.001
hourly_quota = 1000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_becomes_one_kafka_record_keyed_by_key_id() {
    require(Service::Kafka);
    let topic = unique_name("decisions");
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, rx) = event_queue(1_000, Arc::clone(&metrics));
    let drain = drain_to_kafka(rx, &topic, &metrics);
    let policy = PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap();
    let limiter = Limiter::new(
        MemoryStore::new(1_000),
        PolicyHandle::new(policy, 0),
        queue,
        Arc::clone(&metrics),
        LimiterConfig::default(),
    );

    let key = KeyId(*b"kafka-sink-key-1");
    let mut events = Vec::new();
    for _ in 0..20 {
        let d = limiter
            .check(&Request {
                key_id: key,
                route_class: RouteClassId(0),
                tier: TierId(0),
                caller: b"",
            })
            .await;
        events.push(d.event);
    }
    assert_eq!(
        events
            .iter()
            .filter(|e| e.verdict == Verdict::Denied)
            .count(),
        15
    );
    // Dropping the limiter closes the queue; the drain task flushes the producer and ends.
    drop(limiter);
    tokio::time::timeout(Duration::from_secs(60), drain)
        .await
        .expect("drained within 60 s")
        .unwrap();

    let consumer = kafka_consumer(&topic);
    let mut got = Vec::new();
    while got.len() < events.len() {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("records within 60 s")
            .unwrap();
        assert_eq!(m.key(), Some(key.as_bytes().as_slice()));
        got.push(DecisionEvent::decode(m.payload().unwrap()).expect("a v1 event"));
    }
    // One key, one partition: the order of decisions is kept.
    assert_eq!(got, events);
    let m = metrics.render();
    assert!(m.contains("verdict_events_sent_total 20"), "{m}");
    assert!(m.contains("verdict_events_failed_total 0"), "{m}");
}
