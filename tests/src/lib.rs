//! What the cross-crate tests share: where the real services listen (the same variables and
//! defaults as `scripts/env.sh`), a check that fails a test with instructions when a service
//! is not running, and ready-made clients.

pub mod engines;
pub mod ingest_check;
pub mod layout;
pub mod private;
pub mod query_fixture;
pub mod regions;
pub mod review_world;
pub mod rollup_check;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;

/// A service the tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Redis (counters).
    Redis,
    /// PostgreSQL (policy store).
    Postgres,
    /// Apache Kafka (decision events).
    Kafka,
    /// A second Kafka cluster, another region's (the tests of several clusters feeding one
    /// table).
    Kafka2,
    /// The S3-API server (raw and rollup tables).
    S3,
    /// The Redis servers of the regional tests, one per region.
    Regions,
    /// The Redis Cluster of 3 masters with a replica each.
    RedisCluster,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Kafka => "kafka",
            Self::Kafka2 => "kafka2",
            Self::S3 => "s3",
            Self::Regions => "regions",
            Self::RedisCluster => "redis-cluster",
        }
    }

    /// The `host:port` the service listens on.
    pub fn address(self) -> String {
        match self {
            Self::Redis => host_port(&redis_url()),
            Self::Postgres => host_port(&postgres_url()),
            Self::Kafka => first_broker(&kafka_brokers()),
            Self::Kafka2 => first_broker(&kafka2_brokers()),
            Self::S3 => host_port(&s3_endpoint()),
            Self::Regions => host_port(&region_redis_urls()[0]),
            Self::RedisCluster => host_port(&redis_cluster_url()),
        }
    }
}

fn first_broker(brokers: &str) -> String {
    brokers.split(',').next().unwrap_or_default().to_owned()
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The project's `scripts/services.sh`, found from the test's crate at run time (not
/// where it was compiled, which a target folder shared by several clones may not have).
pub fn services_script() -> std::path::PathBuf {
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    std::path::Path::new(&dir).join("../scripts/services.sh")
}

/// `VERDICT_REDIS_URL`, default `redis://127.0.0.1:16379`.
pub fn redis_url() -> String {
    env_or("VERDICT_REDIS_URL", "redis://127.0.0.1:16379")
}

/// `VERDICT_REDIS_CLUSTER_URL`, default `redis-cluster://127.0.0.1:17001` (the store finds
/// the other nodes from the first).
pub fn redis_cluster_url() -> String {
    env_or(
        "VERDICT_REDIS_CLUSTER_URL",
        "redis-cluster://127.0.0.1:17001",
    )
}

/// The cluster's nodes as `127.0.0.1:<port>`, for each of `VERDICT_REDIS_CLUSTER_PORTS`
/// (default `17001` to `17006`).
pub fn redis_cluster_nodes() -> Vec<String> {
    env_or(
        "VERDICT_REDIS_CLUSTER_PORTS",
        "17001 17002 17003 17004 17005 17006",
    )
    .split_whitespace()
    .map(|p| format!("127.0.0.1:{p}"))
    .collect()
}

/// `VERDICT_PG_URL`, default `postgres://verdict@127.0.0.1:15432/verdict`.
pub fn postgres_url() -> String {
    env_or(
        "VERDICT_PG_URL",
        "postgres://verdict@127.0.0.1:15432/verdict",
    )
}

/// `VERDICT_KAFKA_BROKERS`, default `127.0.0.1:19092`.
pub fn kafka_brokers() -> String {
    env_or("VERDICT_KAFKA_BROKERS", "127.0.0.1:19092")
}

/// `VERDICT_KAFKA2_BROKERS`, default `127.0.0.1:19094`: the second Kafka cluster.
pub fn kafka2_brokers() -> String {
    env_or("VERDICT_KAFKA2_BROKERS", "127.0.0.1:19094")
}

/// `VERDICT_S3_ENDPOINT`, default `http://127.0.0.1:19000`.
pub fn s3_endpoint() -> String {
    env_or("VERDICT_S3_ENDPOINT", "http://127.0.0.1:19000")
}

/// The Redis of each region of the regional tests: `redis://127.0.0.1:<port>` for each of
/// `VERDICT_REGION_REDIS_PORTS` (default `16381 16382 16383`).
pub fn region_redis_urls() -> Vec<String> {
    env_or("VERDICT_REGION_REDIS_PORTS", "16381 16382 16383")
        .split_whitespace()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect()
}

/// Fails the calling test, with how to start them, unless every region's Redis accepts
/// connections.
///
/// # Panics
/// When one does not answer.
pub fn require_regions() {
    for url in region_redis_urls() {
        if let Some(message) = unreachable_message(Service::Regions, &host_port(&url)) {
            panic!("{message}");
        }
    }
}

/// Drains a limiter's event queue to `topic` on the test broker (the limiter's own Kafka
/// sink, lingering 5 ms); the task ends, flushed, when the queue's last handle is dropped.
///
/// # Panics
/// When the producer cannot be created.
pub fn drain_to_kafka(
    events: verdict_limiter::EventReceiver,
    topic: &str,
    metrics: &Arc<verdict_limiter::LimiterMetrics>,
) -> tokio::task::JoinHandle<()> {
    let sink = verdict_events_kafka::KafkaSink::new(
        &verdict_events_kafka::KafkaSinkConfig {
            brokers: kafka_brokers(),
            topic: topic.to_owned(),
            linger_ms: 5,
            ..verdict_events_kafka::KafkaSinkConfig::default()
        },
        Arc::clone(metrics),
    )
    .expect("Kafka producer");
    verdict_limiter::spawn_drain(events, sink, Arc::clone(metrics))
}

/// A limiter's metrics and an event queue of `capacity` whose events are read and dropped
/// (for tests of decisions, not of events). Call it inside a Tokio runtime.
pub fn discarded_events(
    capacity: usize,
) -> (
    verdict_limiter::EventQueue,
    Arc<verdict_limiter::LimiterMetrics>,
) {
    let metrics = Arc::new(verdict_limiter::LimiterMetrics::new());
    let (queue, mut rx) = verdict_limiter::event_queue(capacity, Arc::clone(&metrics));
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    (queue, metrics)
}

/// A consumer of `topic` from its beginning, in a group of its own, committing nothing.
///
/// # Panics
/// When the consumer cannot be created or subscribe.
pub fn kafka_consumer(topic: &str) -> rdkafka::consumer::StreamConsumer {
    use rdkafka::consumer::Consumer as _;
    let consumer: rdkafka::consumer::StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", unique_name("check"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("Kafka consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

/// `host:port` out of `scheme://[user@]host:port[/path]`.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// The Redis counter store on `service` ([`Service::Redis`] or [`Service::RedisCluster`]),
/// with a generous deadline (tests run on a busy machine, so only real failures fail).
///
/// # Panics
/// When the service is not running, or for another service.
pub async fn redis_store(service: Service) -> verdict_counters_redis::RedisStore {
    require(service);
    let url = match service {
        Service::Redis => redis_url(),
        Service::RedisCluster => redis_cluster_url(),
        other => panic!("{} is not a Redis", other.name()),
    };
    verdict_counters_redis::RedisStore::connect(&verdict_counters_redis::RedisStoreConfig {
        url,
        timeout: Duration::from_secs(2),
        ..verdict_counters_redis::RedisStoreConfig::default()
    })
    .await
    .unwrap_or_else(|e| panic!("connect to {}: {e}", service.name()))
}

/// The value of the metric `name` (one without labels) on the `/metrics` page of the
/// service at `127.0.0.1:port`; `None` when the page or the metric is not there (yet).
pub async fn metric<T: std::str::FromStr>(
    http: &reqwest::Client,
    port: u16,
    name: &str,
) -> Option<T> {
    let m = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric_in(&m, name)
}

/// The value of the series `name` (a metric's name, with its labels if it has any, as
/// `verdict_query_answer_cache_total{outcome="hit"}`) in a Prometheus text page `text`;
/// `None` when the page has no such series (a labelled one never counted) or its value is
/// not a `T`.
pub fn metric_in<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Fails the calling test, with how to start it, unless `service` accepts connections.
///
/// # Panics
/// When the service does not answer: that is the point.
pub fn require(service: Service) {
    if let Some(message) = unreachable_message(service, &service.address()) {
        panic!("{message}");
    }
}

/// `None` if something accepts connections at `address`; otherwise the message that tells
/// the reader how to start `service`.
pub fn unreachable_message(service: Service, address: &str) -> Option<String> {
    let reachable = address
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .any(|a: SocketAddr| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    (!reachable).then(|| {
        format!(
            "{name} is not answering at {address}. The tests use the real services: start them \
             with `scripts/services.sh up` (or only this one: `scripts/services.sh up {name}`), \
             or run everything with `scripts/test.sh`.",
            name = service.name()
        )
    })
}

/// A store on a bucket of the S3 server, creating the bucket if it does not exist.
///
/// # Panics
/// When the S3 server is not running or refuses to create the bucket.
pub async fn s3_store(bucket: &str) -> Arc<dyn ObjectStore> {
    require(Service::S3);
    create_bucket(bucket).await;
    s3_store_at(&s3_endpoint(), bucket)
}

/// A store on `bucket` reached through `endpoint` (a proxy in front of the S3 server, say),
/// with the test server's credentials; the bucket must exist.
///
/// # Panics
/// When the configuration is refused.
pub fn s3_store_at(endpoint: &str, bucket: &str) -> Arc<dyn ObjectStore> {
    Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id("verdict")
            .with_secret_access_key("verdict")
            .build()
            .expect("S3 store configuration"),
    )
}

/// Creates a bucket on the S3 server (an unsigned PUT, which moto accepts); an existing
/// bucket is fine.
async fn create_bucket(bucket: &str) {
    let url = format!("{}/{bucket}", s3_endpoint());
    let response = reqwest::Client::new()
        .put(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("PUT {url}: {e}"));
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert!(
        status.is_success() || body.contains("BucketAlreadyOwnedByYou"),
        "creating bucket {bucket}: {status} {body}"
    );
}

/// A database of its own on the shared PostgreSQL, for a test that creates schemas:
/// `postgres://…/<prefix>_<unique>`.
///
/// # Panics
/// When PostgreSQL is not running.
pub async fn fresh_database(prefix: &str) -> String {
    require(Service::Postgres);
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    let name = unique_name(prefix).replace('-', "_");
    client
        .batch_execute(&format!("create database {name}"))
        .await
        .expect("create database");
    let base = postgres_url();
    let base = base
        .rsplit_once('/')
        .map_or(base.as_str(), |(b, _)| b)
        .to_owned();
    format!("{base}/{name}")
}

/// Polls `check` every 50 ms until it holds; fails the test with `what` if it still does
/// not after `within`. Returns how long it took.
///
/// # Panics
/// When `check` never holds: that is the point.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// Sends the logs of the code under test to the test's captured output (shown when the
/// test fails), at `RUST_LOG` or else `info` for the ingest worker. Safe to call from
/// every test: the first call installs it.
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,verdict_ingest=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A name no other test run has used: `prefix-<pid>-<nanos>`.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_strips_scheme_user_and_path() {
        assert_eq!(
            host_port("postgres://verdict@127.0.0.1:15432/verdict"),
            "127.0.0.1:15432"
        );
        assert_eq!(host_port("redis://127.0.0.1:16379"), "127.0.0.1:16379");
        assert_eq!(host_port("http://127.0.0.1:19000"), "127.0.0.1:19000");
    }

    #[test]
    fn a_missing_service_is_named_with_how_to_start_it() {
        // Nothing listens on port 1.
        let msg = unreachable_message(Service::Kafka, "127.0.0.1:1").unwrap();
        assert!(
            msg.starts_with("kafka is not answering at 127.0.0.1:1."),
            "{msg}"
        );
        assert!(msg.contains("`scripts/services.sh up kafka`"), "{msg}");
    }
}
