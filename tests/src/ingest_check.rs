//! Checks of the raw table and Kafka helpers shared by the ingest tests (in `tests/` and
//! the `verdict` binary's own tests): create a topic, produce values and learn their
//! offsets, read back every row of the raw table, the quarantine, and each partition's
//! progress in the raw table's log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int32Type, Int64Type, TimestampMillisecondType};
use bytes::Bytes;
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use verdict_ingest::flush::StoreCalls;
use verdict_ingest::{IngestConfig, IngestMetrics, IngestStats, IngestWorker, KafkaSource};
use verdict_lake::tables::RAW;
use verdict_rollup::{Rollup, raw_object};
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_schemas::{DecisionEvent, RawBatchBuilder, raw_schema};

use crate::kafka_brokers;

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(topic: &str, partitions: i32) {
    create_topic_on(&kafka_brokers(), topic, partitions).await;
}

/// Creates `topic` with `partitions` partitions on the Kafka cluster at `brokers`.
///
/// # Panics
/// When the cluster refuses.
pub async fn create_topic_on(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    for r in results {
        r.unwrap();
    }
}

/// Produces `values` keyed by their first 16 bytes (or a fixed key for short garbage);
/// returns (partition, offset) → value.
pub async fn produce(topic: &str, values: Vec<Vec<u8>>) -> BTreeMap<(i32, i64), Vec<u8>> {
    produce_to(&kafka_brokers(), topic, values).await
}

/// [`produce`] to the Kafka cluster at `brokers`.
///
/// # Panics
/// When a value is not delivered within 30 s.
pub async fn produce_to(
    brokers: &str,
    topic: &str,
    values: Vec<Vec<u8>>,
) -> BTreeMap<(i32, i64), Vec<u8>> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut out = BTreeMap::new();
    let mut pending = Vec::new();
    for v in values {
        let key = if v.len() >= 32 {
            v[16..32].to_vec()
        } else {
            b"garbage-key".to_vec()
        };
        let producer = producer.clone();
        let topic = topic.to_owned();
        pending.push(tokio::spawn(async move {
            let d = producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&v),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("delivered");
            ((d.partition, d.offset), v)
        }));
    }
    for p in pending {
        let (k, v) = p.await.unwrap();
        out.insert(k, v);
    }
    out
}

/// Every row of the raw table: (partition, offset) → how many times it appears, and the
/// event time and key id of each.
pub type Rows = BTreeMap<(i32, i64), (i64, Vec<u8>)>;

/// The objects of the raw table's latest snapshot (none before its first commit).
pub async fn raw_objects(store: &Arc<dyn ObjectStore>) -> Vec<object_store::ObjectMeta> {
    match RAW.table(Arc::clone(store)).snapshot_if_any().await {
        Ok(snapshot) => snapshot
            .map(|s| s.files().map(raw_object).collect())
            .unwrap_or_default(),
        Err(e) => panic!("the raw table's log: {e}"),
    }
}

/// The raw data files in the store that the raw table's latest snapshot does not hold
/// (those of a flush that was interrupted, or refused), ordered by path.
pub async fn uncommitted(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    let committed: std::collections::BTreeSet<String> = raw_objects(store)
        .await
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    let listed: Vec<object_store::ObjectMeta> = store
        .list(Some(&Path::from("raw")))
        .try_collect()
        .await
        .unwrap();
    let mut out: Vec<String> = listed
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|p| !p.contains("/_delta_log/") && !committed.contains(p))
        .collect();
    out.sort();
    out
}

/// Asserts that vacuum, past the retention, would delete exactly the files no commit
/// names (and so never a committed one).
pub async fn assert_vacuum_takes_only_uncommitted(store: &Arc<dyn ObjectStore>) {
    let orphans = uncommitted(store).await;
    let table = RAW.table(Arc::clone(store));
    let snapshot = table.snapshot().await.expect("the raw table's log");
    let later = chrono::Utc::now().timestamp_millis() + 1_000;
    let plan = verdict_lake::vacuum::plan(&table, &snapshot, Some(Duration::ZERO), later)
        .await
        .expect("a vacuum plan");
    let doomed: Vec<String> = plan
        .files
        .iter()
        .map(|(m, _)| m.location.to_string())
        .collect();
    assert_eq!(
        doomed, orphans,
        "vacuum takes exactly the uncommitted files"
    );
}

/// Every row of every file of the raw table's latest snapshot.
pub async fn raw_rows(store: &Arc<dyn ObjectStore>) -> (BTreeMap<(i32, i64), usize>, Rows) {
    let files = raw_objects(store).await;
    let mut seen = BTreeMap::new();
    let mut rows = BTreeMap::new();
    for f in files {
        let bytes: Bytes = store.get(&f.location).await.unwrap().bytes().await.unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
        {
            let batch = batch.unwrap();
            let parts = batch
                .column_by_name("kafka_partition")
                .unwrap()
                .as_primitive::<Int32Type>()
                .clone();
            let offsets = batch
                .column_by_name("kafka_offset")
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone();
            let times = batch
                .column_by_name("event_time")
                .unwrap()
                .as_primitive::<TimestampMillisecondType>()
                .clone();
            let keys = batch
                .column_by_name("key_id")
                .unwrap()
                .as_fixed_size_binary()
                .clone();
            for i in 0..batch.num_rows() {
                let k = (parts.value(i), offsets.value(i));
                *seen.entry(k).or_insert(0) += 1;
                assert!(!keys.is_null(i));
                rows.insert(k, (times.value(i), keys.value(i).to_vec()));
            }
        }
    }
    (seen, rows)
}

/// Every quarantined record: (partition, offset) → its kind.
pub async fn quarantined(store: &Arc<dyn ObjectStore>) -> BTreeMap<(i32, i64), String> {
    let files: Vec<_> = store
        .list(Some(&Path::from("quarantine")))
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for f in files {
        let body = store.get(&f.location).await.unwrap().bytes().await.unwrap();
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            let k = (
                v["partition"].as_i64().unwrap() as i32,
                v["offset"].as_i64().unwrap(),
            );
            assert!(
                out.insert(k, v["kind"].as_str().unwrap().to_owned())
                    .is_none(),
                "{k:?} quarantined twice"
            );
        }
    }
    out
}

/// True once the raw table's log holds, for every partition of `topic` read from Kafka
/// cluster `cluster`, progress up to its last produced offset.
pub async fn all_flushed(
    store: &Arc<dyn ObjectStore>,
    cluster: &str,
    topic: &str,
    produced: &BTreeMap<(i32, i64), Vec<u8>>,
) -> bool {
    let mut last: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, o) in produced.keys() {
        last.insert(*p, (*o).max(last.get(p).copied().unwrap_or(-1)));
    }
    let Ok(snapshot) = RAW.table(Arc::clone(store)).snapshot().await else {
        return false;
    };
    last.into_iter().all(|(p, want)| {
        snapshot
            .txn_version(&KafkaSource::new(cluster, topic, p).app_id())
            .is_some_and(|v| v >= want)
    })
}

/// Each partition's progress in the raw table's log for `topic` (of cluster `main`), for
/// partitions `0..partitions`: the last offset committed, if any.
pub async fn progress(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let snapshot = RAW
        .table(Arc::clone(store))
        .snapshot_if_any()
        .await
        .unwrap();
    (0..partitions)
        .map(|p| {
            let app = KafkaSource::new("main", topic, p).app_id();
            (p, snapshot.as_ref().and_then(|s| s.txn_version(&app)))
        })
        .collect()
}

/// The offset consumer group `group` has committed to Kafka for `topic`'s `partition`
/// (the next one it would read), if any.
pub fn kafka_committed(group: &str, topic: &str, partition: i32) -> Option<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    match committed
        .find_partition(topic, partition)
        .map(|e| e.offset())
    {
        Some(rdkafka::Offset::Offset(o)) => Some(o),
        _ => None,
    }
}

/// `n` good events spread over the last few hours.
pub fn recent_events(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let now = chrono::Utc::now().timestamp_millis();
    let cfg = SynthConfig {
        seed,
        start_ms: now - 3 * 3_600_000,
        events_per_hour: n as u64 / 2,
        late_share: 0.02,
        ..SynthConfig::hour(n as u64, 500)
    };
    SynthTraffic::new(cfg)
        .take(n)
        .map(|e| e.encode().to_vec())
        .collect()
}

/// A DataFusion session in which `raw` is the whole raw table as a reader sees it: the
/// files of its latest snapshot.
pub async fn raw_table(store: &Arc<dyn ObjectStore>) -> SessionContext {
    let paths: Vec<Path> = raw_objects(store)
        .await
        .into_iter()
        .map(|m| m.location)
        .collect();
    assert!(!paths.is_empty(), "the raw table has no files");
    let refs: Vec<&Path> = paths.iter().collect();
    Rollup::new(Arc::clone(store), 2)
        .session_over("raw", &refs, &raw_schema())
        .await
        .expect("a session over the raw table")
}

/// Checks, with DataFusion queries over the raw table, that every produced (partition,
/// offset) of the `main` Kafka cluster is in it exactly once and that its row equals the
/// event produced there (every column).
pub async fn assert_exactly_once(
    store: &Arc<dyn ObjectStore>,
    produced: &BTreeMap<(i32, i64), Vec<u8>>,
) {
    assert_exactly_once_from(store, &BTreeMap::from([("main", produced)])).await;
}

/// [`assert_exactly_once`] for events produced to several Kafka clusters (by cluster name):
/// every row is identified by (cluster, partition, offset).
pub async fn assert_exactly_once_from(
    store: &Arc<dyn ObjectStore>,
    produced: &BTreeMap<&str, &BTreeMap<(i32, i64), Vec<u8>>>,
) {
    let ctx = raw_table(store).await;
    let twice = ctx
        .sql(
            "SELECT kafka_cluster, kafka_partition, kafka_offset, COUNT(*) AS n FROM raw \
             GROUP BY kafka_cluster, kafka_partition, kafka_offset HAVING COUNT(*) > 1 \
             ORDER BY kafka_cluster, kafka_partition, kafka_offset LIMIT 20",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let doubled: usize = twice.iter().map(|b| b.num_rows()).sum();
    assert_eq!(
        doubled,
        0,
        "rows more than once:\n{}",
        arrow::util::pretty::pretty_format_batches(&twice).unwrap()
    );

    let rows = produced.values().map(|p| p.len()).sum();
    let mut expected = RawBatchBuilder::with_capacity(rows);
    let mut keys = Vec::with_capacity(rows);
    for (cluster, events) in produced {
        for ((partition, offset), value) in *events {
            let event = DecisionEvent::decode(value).expect("a good event was produced");
            expected.push(&event, cluster, *partition, *offset);
            keys.push((*cluster, *partition, *offset));
        }
    }
    let expected = expected.finish().unwrap();
    let actual = ctx
        .sql("SELECT * FROM raw ORDER BY kafka_cluster, kafka_partition, kafka_offset")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        !actual.is_empty(),
        "the raw table reads back empty through DataFusion ({rows} rows produced)"
    );
    let actual = arrow::compute::concat_batches(&actual[0].schema(), &actual).unwrap();
    assert_eq!(
        actual.num_rows(),
        expected.num_rows(),
        "rows in the raw table vs produced"
    );
    for (field, want) in expected.schema().fields().iter().zip(expected.columns()) {
        let got = actual
            .column_by_name(field.name())
            .unwrap_or_else(|| panic!("no column {}", field.name()));
        if got.as_ref() != want.as_ref() {
            let first = (0..want.len())
                .find(|&i| got.slice(i, 1).as_ref() != want.slice(i, 1).as_ref())
                .unwrap_or(0);
            panic!(
                "column {} differs from what was produced, first at row {first} ({:?})",
                field.name(),
                keys.get(first)
            );
        }
    }
}

/// A worker of group `group` on `topic` of the test broker that flushes every
/// `flush_max_records` records or 500 ms, and retries store calls for a minute.
pub fn worker_config(topic: &str, group: &str, flush_max_records: usize) -> IngestConfig {
    IngestConfig {
        brokers: kafka_brokers(),
        topic: topic.to_owned(),
        group_id: group.to_owned(),
        flush_max_records,
        flush_max_age: Duration::from_millis(500),
        retry: StoreCalls {
            give_up_after: Duration::from_secs(60),
            ..StoreCalls::default()
        },
        ..IngestConfig::default()
    }
}

/// A worker running on a task of its own until [`Running::stop`].
pub struct Running {
    /// The worker's metrics, read while it runs.
    pub metrics: IngestMetrics,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<IngestStats, verdict_ingest::IngestError>>,
}

impl Running {
    /// Starts `cfg`'s worker writing to `store`.
    ///
    /// # Panics
    /// When the worker cannot be built.
    pub fn start(cfg: IngestConfig, store: Arc<dyn ObjectStore>) -> Self {
        let worker = IngestWorker::new(cfg, store).expect("the ingest worker");
        let metrics = worker.metrics();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(worker.run(async {
            let _ = stopped.await;
        }));
        Self {
            metrics,
            stop,
            task,
        }
    }

    /// Whether the worker's run has ended (it stopped or failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Asks the worker to stop and returns what it did.
    ///
    /// # Panics
    /// When the worker failed.
    pub async fn stop(self) -> IngestStats {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the worker's task")
            .expect("the worker stopped cleanly")
    }

    /// Drops the worker's run wherever it is (an await point inside a flush, say): a crash
    /// that leaves the process alive.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
