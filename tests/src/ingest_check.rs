//! Checks of the raw table and Kafka helpers shared by the ingest tests (in `tests/` and
//! the `verdict` binary's own tests): create a topic, produce values and learn their
//! offsets, read back every row of every raw file, the quarantine, and the markers.

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
use verdict_ingest::progress::{ProgressObject, partition_prefix};
use verdict_jobs::partitions::hour_partitions;
use verdict_rollup::{Rollup, hour_files};
use verdict_schemas::layout::RAW_PREFIX;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_schemas::{DecisionEvent, RawBatchBuilder, raw_schema};

use crate::kafka_brokers;

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
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
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
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

/// Every row of every raw file: (partition, offset) → how many times it appears, and the
/// event time and key id of each.
pub type Rows = BTreeMap<(i32, i64), (i64, Vec<u8>)>;

pub async fn raw_rows(store: &Arc<dyn ObjectStore>) -> (BTreeMap<(i32, i64), usize>, Rows) {
    let files: Vec<_> = store
        .list(Some(&Path::from("raw")))
        .try_collect()
        .await
        .unwrap();
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

/// True once every partition has a completed flush ending at its last produced offset.
pub async fn all_flushed(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    produced: &BTreeMap<(i32, i64), Vec<u8>>,
) -> bool {
    let mut last: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, o) in produced.keys() {
        last.insert(*p, (*o).max(last.get(p).copied().unwrap_or(-1)));
    }
    for (p, want) in last {
        let prefix = Path::from(partition_prefix(topic, p));
        let names: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
        let done = names
            .iter()
            .filter_map(|m| m.location.as_ref().parse::<ProgressObject>().ok())
            .any(|o| matches!(o, ProgressObject::Done(r) if r.last >= want));
        if !done {
            return false;
        }
    }
    true
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

/// A DataFusion session in which `raw` is the whole raw table as a reader sees it: every
/// hour's files, covered ones left out.
pub async fn raw_table(store: &Arc<dyn ObjectStore>) -> SessionContext {
    let mut paths = Vec::new();
    for hour in hour_partitions(store.as_ref(), RAW_PREFIX).await.unwrap() {
        let files = hour_files(store.as_ref(), &hour).await.unwrap();
        paths.extend(files.files.into_iter().map(|f| f.meta.location));
    }
    assert!(!paths.is_empty(), "the raw table has no files");
    let refs: Vec<&Path> = paths.iter().collect();
    Rollup::new(Arc::clone(store), 2)
        .session_over("raw", &refs, &raw_schema())
        .await
        .expect("a session over the raw table")
}

/// Checks, with DataFusion queries over the raw table, that every produced (partition,
/// offset) is in it exactly once and that its row equals the event produced there
/// (every column).
pub async fn assert_exactly_once(
    store: &Arc<dyn ObjectStore>,
    produced: &BTreeMap<(i32, i64), Vec<u8>>,
) {
    let ctx = raw_table(store).await;
    let twice = ctx
        .sql(
            "SELECT kafka_partition, kafka_offset, COUNT(*) AS n FROM raw \
             GROUP BY kafka_partition, kafka_offset HAVING COUNT(*) > 1 \
             ORDER BY kafka_partition, kafka_offset LIMIT 20",
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

    let mut expected = RawBatchBuilder::with_capacity(produced.len());
    for ((partition, offset), value) in produced {
        let event = DecisionEvent::decode(value).expect("a good event was produced");
        expected.push(&event, *partition, *offset);
    }
    let expected = expected.finish().unwrap();
    let actual = ctx
        .sql("SELECT * FROM raw ORDER BY kafka_partition, kafka_offset")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        !actual.is_empty(),
        "the raw table reads back empty through DataFusion ({} rows produced)",
        produced.len()
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
                produced.keys().nth(first)
            );
        }
    }
}
