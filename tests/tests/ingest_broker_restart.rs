//! The ingest worker across a restart of the real Kafka broker: the worker keeps running
//! while the broker stops and starts again (`scripts/services.sh restart kafka`), reconnects
//! by itself, and every event produced before and after the restart is in the raw table
//! exactly once. This file holds one test on purpose: it restarts the shared broker, and
//! cargo runs test binaries one after another, so no other test sees the restart.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use verdict_ingest::flush::StoreCalls;
use verdict_ingest::{IngestConfig, IngestWorker};
use verdict_tests::ingest_check::{
    all_flushed, assert_exactly_once, create_topic, produce, recent_events,
};
use verdict_tests::{Service, eventually, kafka_brokers, require, s3_store, unique_name};

/// Restarts the shared broker with the project's own script (its data stays).
fn restart_kafka() {
    let status = Command::new(verdict_tests::services_script())
        .args(["restart", "kafka"])
        .status()
        .expect("run scripts/services.sh restart kafka");
    assert!(status.success(), "restarting kafka failed: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reconnects_after_a_broker_restart_and_writes_every_event_once() {
    require(Service::Kafka);
    let bucket = s3_store("verdict-ingest-test").await;
    let run = unique_name("broker-restart");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_ingest::Prefixed::new(bucket, &run));
    let topic = unique_name("decisions-restart");
    create_topic(&topic, 4).await;

    let worker = IngestWorker::new(
        IngestConfig {
            brokers: kafka_brokers(),
            topic: topic.clone(),
            group_id: unique_name("restart-group"),
            flush_max_records: 1_000,
            flush_max_age: Duration::from_millis(500),
            retry: StoreCalls {
                give_up_after: Duration::from_secs(60),
                ..StoreCalls::default()
            },
            ..IngestConfig::default()
        },
        Arc::clone(&store),
    )
    .unwrap();
    let metrics = worker.metrics();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let mut produced = produce(&topic, recent_events(4_000, 31)).await;
    eventually(
        Duration::from_secs(60),
        "the events produced before the restart written",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    let before = metrics.events_written.get();

    tokio::task::spawn_blocking(restart_kafka).await.unwrap();
    assert!(
        !task.is_finished(),
        "the worker stopped when the broker went away"
    );

    produced.extend(produce(&topic, recent_events(4_000, 32)).await);
    eventually(
        Duration::from_secs(120),
        "the events produced after the restart written",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    assert!(
        metrics.events_written.get() > before,
        "nothing was written after the restart"
    );
    stop.send(()).unwrap();
    let stats = task
        .await
        .unwrap()
        .expect("the worker survives the restart");
    println!("broker restart: {stats:?}");
    assert_exactly_once(&store, &produced).await;
}
