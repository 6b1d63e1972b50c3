//! The ingest worker across a restart of the real Kafka broker: the worker keeps running
//! while the broker stops and starts again (`scripts/services.sh restart kafka`), reconnects
//! by itself, and every event produced before and after the restart is in the raw table
//! exactly once. This file holds one test on purpose: it restarts the shared broker, and
//! cargo runs test binaries one after another, so no other test sees the restart.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use verdict_tests::ingest_check::{
    Running, all_flushed, assert_exactly_once, create_topic, produce, recent_events, worker_config,
};
use verdict_tests::{Service, eventually, require, s3_store, unique_name};

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
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(bucket, &run));
    let topic = unique_name("decisions-restart");
    create_topic(&topic, 4).await;

    let worker = Running::start(
        worker_config(&topic, &unique_name("restart-group"), 1_000),
        Arc::clone(&store),
    );
    let metrics = worker.metrics.clone();

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
        !worker.is_finished(),
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
    let stats = worker.stop().await;
    println!("broker restart: {stats:?}");
    assert_exactly_once(&store, &produced).await;
}
