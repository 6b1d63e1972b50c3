//! The ingest worker against the real Kafka broker and S3 server: events spread over
//! several hours (some late) and bad records interleaved; a worker is aborted mid-run (its
//! run future dropped at whatever await point it had reached, possibly between the uploads
//! of one flush) and a second worker takes over. Afterwards every produced (partition,
//! offset) is in the raw table exactly once with the row that was produced, and every bad
//! record is in quarantine with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use verdict_ingest::IngestConfig;
use verdict_schemas::DecisionEvent;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_tests::ingest_check::{
    Running, all_flushed, assert_exactly_once, assert_exactly_once_from,
    assert_vacuum_takes_only_uncommitted, create_topic, create_topic_on, produce, produce_to,
    quarantined, raw_rows, recent_events, uncommitted, worker_config,
};
use verdict_tests::private::TcpProxy;
use verdict_tests::{
    Service, eventually, kafka_brokers, kafka2_brokers, require, s3_store, unique_name,
};

fn config(topic: &str, group: &str) -> IngestConfig {
    IngestConfig {
        stats_interval: Duration::from_millis(500),
        ..worker_config(topic, group, 1_500)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_lands_exactly_once_across_an_aborted_worker_and_bad_records_are_quarantined() {
    require(Service::Kafka);
    verdict_tests::capture_logs();
    let store = s3_store("verdict-ingest-test").await;
    let run = unique_name("ingest");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(store, &run));
    let topic = unique_name("decisions");
    create_topic(&topic, 4).await;
    let group = unique_name("ingest-group");

    // 12,000 events over three hours ending an hour ago (late ones reach two hours further
    // back), and bad records among them.
    let now = chrono::Utc::now().timestamp_millis();
    let cfg = SynthConfig {
        start_ms: now - 4 * 3_600_000,
        events_per_hour: 4_000,
        late_share: 0.02,
        ..SynthConfig::hour(4_000, 300)
    };
    let mut values: Vec<Vec<u8>> = SynthTraffic::new(cfg)
        .take(12_000)
        .map(|e| e.encode().to_vec())
        .collect();
    let mut future_version = values[0].clone();
    future_version[0] = 2;
    let mut far_future = DecisionEvent::decode(&values[1]).unwrap();
    far_future.event_time_ms = now + 30 * 24 * 3_600_000;
    for (i, bad) in [
        b"not an event".to_vec(),
        values[2][..40].to_vec(),
        future_version,
        far_future.encode().to_vec(),
    ]
    .into_iter()
    .enumerate()
    {
        values.insert(1_000 + i * 2_500, bad);
    }

    let produced = produce(&topic, values[..6_000].to_vec()).await;
    // The first worker writes through a slowed store (150 ms a put) and is aborted once a
    // flush has written some of its files and not committed them: the crash falls inside
    // that flush, between its files and its Delta commit.
    let slow: Arc<dyn ObjectStore> = Arc::new(ThrottledStore::new(
        Arc::clone(&store),
        ThrottleConfig {
            wait_put_per_call: Duration::from_millis(150),
            ..ThrottleConfig::default()
        },
    ));
    let first = Running::start(config(&topic, &group), slow);
    eventually(
        Duration::from_secs(60),
        "a flush with some of its files written and not committed",
        || async { !uncommitted(&store).await.is_empty() },
    )
    .await;
    first.abort().await;

    let mut produced_all = produced;
    produced_all.extend(produce(&topic, values[6_000..].to_vec()).await);
    // The replay cuts its flushes differently (smaller), so its files are not named like
    // the interrupted ones and cannot simply overwrite them.
    let replay = IngestConfig {
        flush_max_records: 250,
        ..config(&topic, &group)
    };
    let second = Running::start(replay, Arc::clone(&store));
    eventually(
        Duration::from_secs(120),
        "every partition flushed to its last offset",
        || all_flushed(&store, "main", &topic, &produced_all),
    )
    .await;
    let stats = second.stop().await;
    println!("second worker: {stats:?}");
    // The interrupted flush's files are in the store and in no commit: readers never see
    // them, and vacuum (past the retention, here none) removes them and nothing else.
    assert!(
        !uncommitted(&store).await.is_empty(),
        "the interrupted flush left no files"
    );
    assert_vacuum_takes_only_uncommitted(&store).await;

    let (seen, rows) = raw_rows(&store).await;
    let bad = quarantined(&store).await;
    let mut missing = Vec::new();
    for (k, v) in &produced_all {
        match DecisionEvent::decode(v) {
            Ok(e) if e.event_time_ms < now + 3_600_000 => {
                let n = seen.get(k).copied().unwrap_or(0);
                if n != 1 {
                    missing.push((*k, n));
                    continue;
                }
                let (time, key) = &rows[k];
                assert_eq!(
                    (*time, key.as_slice()),
                    (e.event_time_ms, e.key_id.as_bytes().as_slice()),
                    "row {k:?} differs from what was produced"
                );
            }
            _ => assert!(bad.contains_key(k), "bad record {k:?} not in quarantine"),
        }
    }
    assert!(
        missing.is_empty(),
        "rows not present exactly once (partition, offset, times): {:?}",
        &missing[..missing.len().min(20)]
    );
    let expected_good = produced_all.len() - 4;
    assert_eq!(seen.len(), expected_good, "rows in the raw table");
    assert_eq!(seen.values().sum::<usize>(), expected_good, "no row twice");
    let kinds: BTreeSet<&str> = bad.values().map(String::as_str).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["event_time_out_of_range", "unknown_version", "wrong_length"])
    );
    assert_eq!(bad.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_in_one_group_over_12_partitions_write_every_event_once() {
    require(Service::Kafka);
    verdict_tests::capture_logs();
    let store = s3_store("verdict-ingest-test").await;
    let run = unique_name("ingest-two");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(store, &run));
    let topic = unique_name("decisions12");
    create_topic(&topic, 12).await;
    let group = unique_name("ingest-group");

    let mut produced = produce(&topic, recent_events(6_000, 1)).await;
    let a = Running::start(config(&topic, &group), Arc::clone(&store));
    let metrics_a = a.metrics.clone();
    eventually(
        Duration::from_secs(60),
        "the first worker owns the partitions",
        || async { metrics_a.partitions_owned.get() == 12 },
    )
    .await;
    // The second joins while the first is working: the group rebalances under load, and
    // the first worker's unflushed buffers of the partitions it gives up are replayed.
    let b = Running::start(config(&topic, &group), Arc::clone(&store));
    let metrics_b = b.metrics.clone();
    eventually(
        Duration::from_secs(60),
        "both workers own partitions",
        || async {
            let (pa, pb) = (
                metrics_a.partitions_owned.get(),
                metrics_b.partitions_owned.get(),
            );
            pa > 0 && pb > 0 && pa + pb == 12
        },
    )
    .await;
    produced.extend(produce(&topic, recent_events(6_000, 2)).await);
    eventually(
        Duration::from_secs(120),
        "every partition flushed to its last offset",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    // The lag gauges come from the Kafka client's statistics: once everything is flushed
    // and committed, the two workers report all 12 partitions between them, each at 0.
    // What they reported is printed as it changes, so a failure shows it.
    let mut last_lags = String::new();
    eventually(
        Duration::from_secs(30),
        "lag gauges for all 12 partitions, all zero",
        || {
            let (a, b) = (metrics_a.lags(), metrics_b.lags());
            let report = format!("worker a: {a:?}, worker b: {b:?}");
            if report != last_lags {
                eprintln!("lag gauges: {report}");
                last_lags = report;
            }
            let lags: Vec<i64> = a.into_values().chain(b.into_values()).collect();
            async move { lags.len() == 12 && lags.iter().all(|&l| l == 0) }
        },
    )
    .await;
    let (sa, sb) = tokio::join!(a.stop(), b.stop());
    println!("worker a: {sa:?}\nworker b: {sb:?}");
    assert!(
        sa.events > 0 && sb.events > 0,
        "both workers took partitions: {sa:?} {sb:?}"
    );
    assert_exactly_once(&store, &produced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_outage_loses_and_doubles_nothing() {
    require(Service::Kafka);
    verdict_tests::capture_logs();
    let direct = s3_store("verdict-ingest-test").await;
    let run = unique_name("ingest-outage");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(direct, &run));
    // The worker reaches S3 only through a proxy that the test cuts and restores.
    let port = verdict_tests::s3_endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("S3 endpoint port");
    let proxy = TcpProxy::start(port).await.expect("a loopback proxy");
    let through = verdict_tests::s3_store_at(
        &format!("http://127.0.0.1:{}", proxy.port()),
        "verdict-ingest-test",
    );
    let via_proxy: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(through, &run));
    let topic = unique_name("decisions-outage");
    create_topic(&topic, 4).await;

    let mut produced = produce(&topic, recent_events(3_000, 21)).await;
    let worker = Running::start(config(&topic, &unique_name("outage-group")), via_proxy);
    let metrics = worker.metrics.clone();
    eventually(
        Duration::from_secs(60),
        "the first events written",
        || async { metrics.events_written.get() > 0 },
    )
    .await;

    proxy.cut();
    let written_at_cut = metrics.events_written.get();
    produced.extend(produce(&topic, recent_events(3_000, 22)).await);
    // The worker consumes the new events and meets the cut store when it flushes them.
    eventually(
        Duration::from_secs(60),
        "a store call retried while the store is cut off",
        || async { metrics.upload_retries.get() > 0 },
    )
    .await;
    // While the store is away nothing completes (a flush in flight at the cut may finish).
    let during = metrics.events_written.get();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        metrics.events_written.get(),
        during,
        "flushes completed with the store cut off"
    );
    assert!(
        during < produced.len() as u64,
        "everything was written before the cut ({written_at_cut}); the outage tested nothing"
    );

    proxy.restore();
    eventually(
        Duration::from_secs(120),
        "every partition flushed after the store came back",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    let stats = worker.stop().await;
    println!("outage: {stats:?}");
    assert!(stats.retries > 0, "the outage caused no retries: {stats:?}");
    assert_eq!(metrics.upload_retries.get(), stats.retries as u64);
    assert!(
        metrics.render().contains(&format!(
            "verdict_ingest_upload_retries_total {}",
            stats.retries
        )),
        "the retries are exported"
    );
    assert_exactly_once(&store, &produced).await;
}

/// The group's committed offsets, by partition, as Kafka holds them.
fn group_offsets(topic: &str, group: &str, partitions: i32) -> Vec<Option<i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    (0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(n)) => Some(n),
                _ => None,
            },
        )
        .collect()
}

/// Commits `offset` for every partition of `topic` in `group` (which has no members).
fn rewind_group(topic: &str, group: &str, partitions: i32, offset: i64) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Offset(offset))
            .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_offset_behind_the_log_is_committed_up_to_it() {
    require(Service::Kafka);
    verdict_tests::capture_logs();
    let store = s3_store("verdict-ingest-test").await;
    let run = unique_name("ingest-owed");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(store, &run));
    let topic = unique_name("decisions-owed");
    create_topic(&topic, 2).await;
    let group = unique_name("ingest-group");
    let produced = produce(&topic, recent_events(2_000, 31)).await;
    let ends: Vec<Option<i64>> = (0..2)
        .map(|p| {
            produced
                .keys()
                .filter(|(q, _)| *q == p)
                .map(|(_, o)| o + 1)
                .max()
        })
        .collect();

    let first = Running::start(config(&topic, &group), Arc::clone(&store));
    eventually(
        Duration::from_secs(60),
        "every partition flushed to its last offset",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    first.stop().await;
    assert_eq!(group_offsets(&topic, &group, 2), ends, "committed on flush");

    // The commits are lost (as when a commit fails in a rebalance): Kafka's offsets are
    // back at 0 while the raw table's log says everything is written. The next worker
    // resumes from the log, consumes nothing new, and still commits the log's offsets.
    rewind_group(&topic, &group, 2, 0);
    assert_eq!(group_offsets(&topic, &group, 2), vec![Some(0), Some(0)]);
    let second = Running::start(config(&topic, &group), Arc::clone(&store));
    let metrics = second.metrics.clone();
    let topic_ = topic.clone();
    let group_ = group.clone();
    eventually(
        Duration::from_secs(60),
        "the group's offsets committed up to the log",
        move || {
            let now = group_offsets(&topic_, &group_, 2);
            let want = ends.clone();
            async move { now == want }
        },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "lag gauges for both partitions, at zero",
        || {
            let lags = metrics.lags();
            async move { lags.len() == 2 && lags.values().all(|&l| l == 0) }
        },
    )
    .await;
    let stats = second.stop().await;
    assert_eq!(stats.events, 0, "nothing was consumed twice: {stats:?}");
    assert_exactly_once(&store, &produced).await;
}

/// Two regions' Kafka clusters, each with the same topic and the same partition numbers,
/// feed one raw table through a worker each (`cluster` "main" and "east"): their progress is
/// two applications in the log, and every (cluster, partition, offset) is in the table once,
/// with its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_kafka_clusters_with_the_same_topic_and_partitions_feed_one_table_exactly_once() {
    require(Service::Kafka);
    require(Service::Kafka2);
    verdict_tests::capture_logs();
    let store = s3_store("verdict-ingest-test").await;
    let run = unique_name("two-clusters");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(store, &run));
    let topic = unique_name("decisions");
    let group = unique_name("ingest-group");
    for brokers in [kafka_brokers(), kafka2_brokers()] {
        create_topic_on(&brokers, &topic, 3).await;
    }
    let main = produce_to(&kafka_brokers(), &topic, recent_events(3_000, 51)).await;
    let east = produce_to(&kafka2_brokers(), &topic, recent_events(3_000, 52)).await;
    let shared = main.keys().filter(|k| east.contains_key(k)).count();
    assert!(
        shared >= 2_500,
        "the clusters share only {shared} (partition, offset) pairs"
    );

    let a = Running::start(config(&topic, &group), Arc::clone(&store));
    let b = Running::start(
        IngestConfig {
            brokers: kafka2_brokers(),
            cluster: "east".to_owned(),
            ..config(&topic, &group)
        },
        Arc::clone(&store),
    );
    eventually(
        Duration::from_secs(120),
        "both clusters' partitions flushed to their last offsets",
        || async {
            all_flushed(&store, "main", &topic, &main).await
                && all_flushed(&store, "east", &topic, &east).await
        },
    )
    .await;
    let (sa, sb) = tokio::join!(a.stop(), b.stop());
    println!("main: {sa:?}\neast: {sb:?}");
    assert_exactly_once_from(&store, &BTreeMap::from([("east", &east), ("main", &main)])).await;
}

/// A partition is quiet with offsets past its next one in two ways that are not a client
/// that lost its place: a transaction left open (the worker reads the last stable offset,
/// as a consumer of committed records must, so that is no stall) and a committed
/// transaction's marker after its last record (an offset no record fills: read again once,
/// then never while the next offset stays). Nothing of the transaction is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_partition_behind_a_transaction_is_read_again_at_most_once_and_loses_nothing() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

    require(Service::Kafka);
    verdict_tests::capture_logs();
    let store = s3_store("verdict-ingest-test").await;
    let run = unique_name("ingest-quiet");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(store, &run));
    let topic = unique_name("decisions-quiet");
    create_topic(&topic, 1).await;
    let group = unique_name("ingest-group");

    // 200 events, then 100 more in a transaction left open.
    let mut produced = produce(&topic, recent_events(200, 7)).await;
    let tx: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("transactional.id", unique_name("quiet-tx"))
        .create()
        .unwrap();
    tx.init_transactions(Duration::from_secs(30)).unwrap();
    tx.begin_transaction().unwrap();
    for v in recent_events(100, 8) {
        let d = tx
            .send(
                FutureRecord::to(&topic).key(&v[16..32]).payload(&v),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("delivered");
        produced.insert((d.partition, d.offset), v);
    }

    let stall_after = Duration::from_secs(1);
    let worker = Running::start(
        IngestConfig {
            stall_after,
            ..config(&topic, &group)
        },
        Arc::clone(&store),
    );
    let stalls = worker.metrics.stalls.clone();
    let first: BTreeMap<_, _> = produced
        .range(..(0, 200))
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    eventually(
        Duration::from_secs(60),
        "the 200 events before the transaction flushed",
        || all_flushed(&store, "main", &topic, &first),
    )
    .await;
    // Quiet behind the open transaction for four stall intervals: not a stall.
    tokio::time::sleep(4 * stall_after).await;
    assert_eq!(stalls.get(), 0, "an open transaction is not a stall");

    tx.commit_transaction(Duration::from_secs(30)).unwrap();
    eventually(
        Duration::from_secs(60),
        "the transaction's events flushed once it committed",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    // Its marker is the one offset past the last event: read again once, then no more.
    eventually(
        Duration::from_secs(30),
        "the partition quiet before the marker read again",
        || async { stalls.get() >= 1 },
    )
    .await;
    tokio::time::sleep(4 * stall_after).await;
    assert_eq!(
        stalls.get(),
        1,
        "read again once for its next offset, not once a check"
    );
    worker.stop().await;
    assert_exactly_once(&store, &produced).await;
}
