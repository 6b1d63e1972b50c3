//! `verdict-bench ingest`: the raw table's write path. Prints one JSON object per mode:
//!
//! - `write_path`: N realistic events (Zipf keys, a few percent denied) in their 64-byte wire
//!   form from an in-process source are decoded, split by partition and hour, sorted,
//!   encoded as Parquet and written to a local folder, on one thread. Beside it, the
//!   Parquet-encode-only rate of the same batches: the ceiling.
//! - `kafka_s3` (with `--kafka`): the same events produced to a fresh topic of the real
//!   broker, then consumed and written to the S3 server by the ingest worker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use verdict_ingest::flush::{PartitionBuffer, StoreCalls, flush_partition};
use verdict_ingest::raw_file::sorted_raw_batch;
use verdict_ingest::{
    ConsumedEvent, IngestConfig, IngestWorker, KafkaSource, RawTable, split_by_hour,
};
use verdict_lake::files::encode_raw_parquet;
use verdict_lake::{S3Options, open_store};
use verdict_schemas::DecisionEvent;

use verdict_demo::partition_of;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};

/// Options of `verdict-bench ingest`.
#[derive(Debug, Clone, Args)]
pub struct IngestBenchArgs {
    /// Events to write.
    #[arg(long, default_value_t = 5_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Kafka partitions the events are spread over.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// Folder for the write-path files [default: a temporary folder, removed afterwards].
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Also run the kafka_s3 mode against the real broker and S3 server.
    #[arg(long)]
    pub kafka: bool,
    /// Kafka bootstrap servers (kafka_s3 mode).
    #[arg(long, env = "VERDICT_KAFKA_BROKERS", default_value = "127.0.0.1:19092")]
    pub brokers: String,
    /// Bucket of the S3 server (kafka_s3 mode; it must exist).
    #[arg(long, default_value = "s3://verdict-bench")]
    pub store: String,
    /// Endpoint of the S3 server (kafka_s3 mode).
    #[arg(
        long,
        env = "VERDICT_S3_ENDPOINT",
        default_value = "http://127.0.0.1:19000"
    )]
    pub s3_endpoint: String,
}

#[derive(Debug, Serialize)]
struct IngestBenchReport {
    bench: &'static str,
    mode: &'static str,
    events: u64,
    seconds: f64,
    events_per_s: f64,
    cpu_cores_used: f64,
    bytes_per_event: f64,
    files: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    parquet_encode_only_events_per_s: Option<f64>,
}

/// CPU seconds this process has used (user + system), from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs the bench and prints its JSON lines.
pub async fn run(args: IngestBenchArgs) -> anyhow::Result<()> {
    let cfg = SynthConfig {
        start_ms: chrono::Utc::now().timestamp_millis() - 2 * 3_600_000,
        ..SynthConfig::hour(args.events, args.keys)
    };
    tracing::info!(events = args.events, "generating events");
    // The in-process source: each partition's records in wire form, in offset order.
    let mut wire: Vec<Vec<[u8; 64]>> = vec![Vec::new(); args.partitions as usize];
    for e in SynthTraffic::new(cfg).take(args.events as usize) {
        wire[partition_of(&e, args.partitions)].push(e.encode());
    }
    let tmp = tempfile::tempdir()?;
    let out = args.out.clone().unwrap_or_else(|| tmp.path().to_owned());
    let store = open_store(
        out.to_str().context("output folder is not UTF-8")?,
        &S3Options::default(),
    )?;

    tracing::info!("write path: decode, split, sort, encode, write");
    let (cpu0, started) = (cpu_seconds(), Instant::now());
    let mut files = 0;
    let mut bytes = 0;
    let mut raw = RawTable::open(Arc::clone(&store)).await?;
    for (p, records) in wire.iter().enumerate() {
        let mut buf = PartitionBuffer::default();
        for (offset, r) in records.iter().enumerate() {
            let offset = offset as i64;
            buf.consumed(offset);
            match DecisionEvent::decode(r) {
                Ok(event) => buf.events.push(ConsumedEvent {
                    event,
                    partition: p as i32,
                    offset,
                }),
                Err(e) => anyhow::bail!("generated record did not decode: {e}"),
            }
        }
        let source = KafkaSource::new("bench", "verdict.decisions.v1", p as i32);
        let report = flush_partition(&mut raw, &source, None, buf, &StoreCalls::default()).await?;
        files += report.files;
        bytes += report.bytes;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;

    // The ceiling: only the Parquet encoding of the same sorted batches.
    let mut batches = Vec::new();
    for (p, records) in wire.iter().enumerate() {
        let events = records.iter().enumerate().filter_map(|(o, r)| {
            DecisionEvent::decode(r).ok().map(|event| ConsumedEvent {
                event,
                partition: p as i32,
                offset: o as i64,
            })
        });
        for (_, mut events) in split_by_hour(events).hours {
            batches.push(sorted_raw_batch(&mut events, "bench")?);
        }
    }
    let encode_started = Instant::now();
    for b in &batches {
        std::hint::black_box(encode_raw_parquet(std::slice::from_ref(b))?);
    }
    let encode_only = args.events as f64 / encode_started.elapsed().as_secs_f64();

    let report = IngestBenchReport {
        bench: "ingest",
        mode: "write_path",
        events: args.events,
        seconds,
        events_per_s: args.events as f64 / seconds,
        cpu_cores_used: cpu / seconds,
        bytes_per_event: bytes as f64 / args.events as f64,
        files,
        parquet_encode_only_events_per_s: Some(encode_only),
    };
    println!("{}", serde_json::to_string(&report)?);

    if args.kafka {
        println!("{}", serde_json::to_string(&kafka_s3(&args, &wire).await?)?);
    }
    Ok(())
}

async fn kafka_s3(
    args: &IngestBenchArgs,
    wire: &[Vec<[u8; 64]>],
) -> anyhow::Result<IngestBenchReport> {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

    let topic = format!("verdict-bench-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .create()?;
    admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                args.partitions as i32,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await?;
    tracing::info!(topic, "producing the events to Kafka");
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("enable.idempotence", "true")
        .set("compression.type", "lz4")
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "2000000")
        .create()?;
    for (p, records) in wire.iter().enumerate() {
        for r in records {
            let mut record = BaseRecord::to(&topic)
                .partition(p as i32)
                .key(&r[16..32])
                .payload(r.as_slice());
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        record = back;
                        producer.poll(Duration::from_millis(5));
                    }
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;

    let bucket = args
        .store
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    reqwest_create_bucket(&args.s3_endpoint, &bucket).await;
    let url = format!("{}/{topic}", args.store.trim_end_matches('/'));
    // The test server's credentials: explicit, so nothing looks for cloud credentials.
    let s3 = S3Options {
        endpoint: Some(args.s3_endpoint.clone()),
        access_key_id: Some("verdict".into()),
        secret_access_key: Some("verdict".into()),
        region: Some("us-east-1".into()),
    };
    let store = open_store(&url, &s3)?;
    let cfg = IngestConfig {
        brokers: args.brokers.clone(),
        topic: topic.clone(),
        group_id: format!("{topic}-group"),
        // The production defaults: flushes of up to 1,000,000 records or 60 s.
        ..IngestConfig::default()
    };
    let worker = IngestWorker::new(cfg, Arc::clone(&store))?;
    let metrics = worker.metrics();
    let total = args.events;
    let (cpu0, started) = (cpu_seconds(), Instant::now());
    let stats = worker
        .run(async move {
            // Everything consumed: stopping flushes every buffer, as SIGTERM would.
            while metrics.records_consumed.get() < total {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(IngestBenchReport {
        bench: "ingest",
        mode: "kafka_s3",
        events: stats.events as u64,
        seconds,
        events_per_s: stats.events as f64 / seconds,
        cpu_cores_used: (cpu_seconds() - cpu0) / seconds,
        bytes_per_event: stats.bytes as f64 / stats.events.max(1) as f64,
        files: stats.files,
        parquet_encode_only_events_per_s: None,
    })
}

/// Creates a bucket on an S3-compatible server that accepts unsigned bucket creation
/// (moto); an existing bucket is fine.
async fn reqwest_create_bucket(endpoint: &str, bucket: &str) {
    let url = format!("{}/{bucket}", endpoint.trim_end_matches('/'));
    if let Err(e) = reqwest::Client::new().put(&url).send().await {
        tracing::warn!(error = %e, url, "creating the bench bucket");
    }
}
