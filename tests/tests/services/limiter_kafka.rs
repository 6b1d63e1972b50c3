//! Decision events through the real Kafka: the limiter's queue drains into the Kafka sink,
//! every decision becomes one record keyed by its key id whose value decodes to exactly the
//! decision's event, and shutdown flushes what is in flight. Then the broker stopped under a
//! gateway's load: no decision changes, and every event is counted once, sent only if it is
//! in the topic (this test stops and starts the shared broker).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use rdkafka::message::Message;
use verdict_demo::{LocalGateway, spawn_upstream};
use verdict_gateway::{BuiltGateway, GatewayBuilder, KeyDirectory, KeyEntry};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot, Request,
    event_queue,
};
use verdict_load::{LoadReport, LoadSpec, MakeRequest};
use verdict_schemas::{DecisionEvent, KeyId, RouteClassId, TierId, Verdict};
use verdict_tests::{
    Service, drain_to_kafka, kafka_consumer, require, services_script, unique_name,
};

/// One route class for every path, a burst of 5 and next to no refill: each key's first
/// five requests pass and the rest are refused, however the requests are timed.
const POLICY: &str = include_str!("../../fixtures/policies/limiter_kafka.toml");

fn policy() -> PolicyHandle {
    PolicyHandle::new(
        PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap(),
        0,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_becomes_one_kafka_record_keyed_by_key_id() {
    require(Service::Kafka);
    let topic = unique_name("decisions");
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, rx) = event_queue(1_000, Arc::clone(&metrics));
    let drain = drain_to_kafka(rx, &topic, &metrics);
    let limiter = Limiter::new(
        MemoryStore::new(1_000),
        policy(),
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

/// Keys per phase, and requests per key in a phase.
const OUTAGE_KEYS: u64 = 50;
const PER_KEY: u64 = 20;

/// `services.sh <verb> kafka`.
fn kafka(verb: &str) {
    let status = std::process::Command::new(services_script())
        .args([verb, "kafka"])
        .status()
        .unwrap_or_else(|e| panic!("run scripts/services.sh {verb} kafka: {e}"));
    assert!(
        status.success(),
        "scripts/services.sh {verb} kafka: {status}"
    );
}

/// Starts the shared broker again however the test ends, for the tests after it.
struct BrokerBack;

impl Drop for BrokerBack {
    fn drop(&mut self) {
        kafka("up");
    }
}

/// One phase of load: every key of `phase` sends `PER_KEY` requests, paced at 500/s from 16
/// workers.
async fn phase(gateway: SocketAddr, phase: u8) -> LoadReport {
    let spec = LoadSpec {
        concurrency: 16,
        rate_per_s: Some(500.0),
        requests: Some(OUTAGE_KEYS * PER_KEY),
        duration: None,
        timeout: Duration::from_secs(10),
    };
    let make: MakeRequest = Arc::new(move |i| {
        HttpRequest::get(format!("http://{gateway}/v1/items/{i}"))
            .header("x-api-key", format!("k{phase}-{}", i % OUTAGE_KEYS))
            .body(Body::empty())
            .unwrap_or_default()
    });
    verdict_load::run(&spec, make, Arc::default()).await
}

/// Every request of a phase was answered by the limiter as the policy says: five 200s a
/// key, the rest 429, none failed.
fn assert_decided(report: &LoadReport, when: &str) {
    assert_eq!(
        (
            report.failed,
            report.count(StatusCode::OK),
            report.count(StatusCode::TOO_MANY_REQUESTS),
            report.without_ratelimit_fields,
        ),
        (0, 5 * OUTAGE_KEYS, (PER_KEY - 5) * OUTAGE_KEYS, 0),
        "{when}: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_stopped_under_gateway_load_changes_no_decision_and_counts_every_event_once() {
    require(Service::Kafka);
    let topic = unique_name("decisions-outage");
    let tier: Arc<str> = Arc::from("free");
    let keys: HashMap<String, KeyEntry> = (0..2u8)
        .flat_map(|p| (0..OUTAGE_KEYS).map(move |i| (p, i)))
        .map(|(p, i)| {
            let mut id = [0u8; 16];
            id[0] = 0xca;
            id[1] = p;
            id[8..].copy_from_slice(&i.to_be_bytes());
            let entry = KeyEntry {
                key_id: KeyId(id),
                tier: Arc::clone(&tier),
            };
            (format!("k{p}-{i}"), entry)
        })
        .collect();
    let upstream = spawn_upstream().await.unwrap();
    let metrics = Arc::new(LimiterMetrics::new());
    let BuiltGateway { gateway, events } =
        GatewayBuilder::new(format!("http://{upstream}").parse().unwrap())
            .event_queue(10_000)
            .build(
                MemoryStore::new(10_000),
                policy(),
                Arc::clone(&metrics),
                KeyDirectory::new(keys),
            );
    let drain = drain_to_kafka(events, &topic, &metrics);
    let gateway = LocalGateway::start(gateway).await.unwrap();
    let per_phase = OUTAGE_KEYS * PER_KEY;

    // With the broker up, every event is acknowledged.
    assert_decided(&phase(gateway.addr, 0).await, "with Kafka up");
    let acknowledged = tokio::time::timeout(Duration::from_secs(30), async {
        while metrics.events_sent.get() < per_phase {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        acknowledged.is_ok(),
        "{} of {per_phase} events acknowledged within 30 s",
        metrics.events_sent.get()
    );

    // The broker stops; the same load is decided the same way.
    let back = BrokerBack;
    tokio::task::spawn_blocking(|| kafka("down")).await.unwrap();
    assert_decided(&phase(gateway.addr, 1).await, "with Kafka stopped");

    // Shutdown: the gateway drops the limiter and its queue; the drain flushes for 10 s and
    // counts what is still unacknowledged as failed.
    gateway.stop().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), drain)
        .await
        .expect("drained within 60 s")
        .unwrap();
    let (sent, failed, dropped) = (
        metrics.events_sent.get(),
        metrics.events_failed.get(),
        metrics.events_dropped.get(),
    );
    println!(
        "events: {sent} sent, {failed} failed, {dropped} dropped of {} decisions",
        2 * per_phase
    );
    assert_eq!(
        sent, per_phase,
        "only the events Kafka acknowledged count as sent"
    );
    assert_eq!(
        failed + dropped,
        per_phase,
        "every event of the outage counted as lost"
    );

    // What counted as sent is what the topic holds: no more, no less.
    tokio::task::spawn_blocking(move || drop(back))
        .await
        .unwrap();
    let consumer = kafka_consumer(&topic);
    let mut records = 0u64;
    // A minute for the first records (the broker has just started), then 5 s of quiet
    // once as many as were counted sent have come.
    let mut wait = Duration::from_secs(60);
    while let Ok(m) = tokio::time::timeout(wait, consumer.recv()).await {
        let m = m.expect("a record");
        let e = DecisionEvent::decode(m.payload().unwrap()).expect("a v1 event");
        assert_eq!(
            e.key_id.0[1], 0,
            "an event of the outage reached the topic: {e:?}"
        );
        records += 1;
        if records >= sent {
            wait = Duration::from_secs(5);
        }
    }
    assert_eq!(records, sent);
}
