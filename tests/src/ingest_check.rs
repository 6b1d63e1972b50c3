//! Checks of the raw table and Kafka helpers shared by the ingest tests (in `tests/` and
//! the `verdict` binary's own tests): create a topic, produce values and learn their
//! offsets, read back every row of every raw file, the quarantine, and the markers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int32Type, Int64Type, TimestampMillisecondType};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use verdict_ingest::progress::{ProgressObject, partition_prefix};
use verdict_schemas::synth::{SynthConfig, SynthTraffic};

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

/// Checks that exactly the produced events are in the raw table, once each.
pub async fn assert_exactly_once(
    store: &Arc<dyn ObjectStore>,
    produced: &BTreeMap<(i32, i64), Vec<u8>>,
) {
    let (seen, _) = raw_rows(store).await;
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "rows more than once: {:?}",
        &twice[..twice.len().min(20)]
    );
    let missing: Vec<_> = produced.keys().filter(|k| !seen.contains_key(k)).collect();
    assert!(
        missing.is_empty(),
        "rows missing: {:?}",
        &missing[..missing.len().min(20)]
    );
    assert_eq!(seen.len(), produced.len());
}
