//! One `DecisionEvent` per decision, on a bounded queue that never blocks the decision: when
//! it is full the event is dropped and counted (telemetry is the one thing allowed to be
//! lossy). A background task drains the queue into a sink: Kafka (idempotent, lz4, lingering
//! a few ms, keyed by key id) or an in-process channel for the embedded default.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use tokio::sync::mpsc;
use verdict_schemas::DecisionEvent;

use crate::metrics::LimiterMetrics;

/// The decision side of the queue.
#[derive(Debug, Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<DecisionEvent>,
    metrics: Arc<LimiterMetrics>,
}

/// The drain side of the queue.
#[derive(Debug)]
pub struct EventReceiver(mpsc::Receiver<DecisionEvent>);

impl EventReceiver {
    /// The next event, `None` once every queue handle is gone.
    pub async fn recv(&mut self) -> Option<DecisionEvent> {
        self.0.recv().await
    }

    /// An event if one is waiting.
    pub fn try_recv(&mut self) -> Option<DecisionEvent> {
        self.0.try_recv().ok()
    }
}

/// A bounded queue of `capacity` events.
pub fn event_queue(capacity: usize, metrics: Arc<LimiterMetrics>) -> (EventQueue, EventReceiver) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (EventQueue { tx, metrics }, EventReceiver(rx))
}

impl EventQueue {
    /// Offers an event; never waits. Returns false (and counts it) if it was dropped.
    pub fn offer(&self, event: DecisionEvent) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(_) => {
                self.metrics.events_dropped.inc();
                false
            }
        }
    }
}

/// Where drained events go.
pub enum EventSink {
    /// Kafka.
    Kafka(KafkaSink),
    /// An in-process consumer (the embedded default's ingest writer). The drain task waits
    /// for room here, so the bounded queue in front is where drops happen.
    Channel(mpsc::Sender<DecisionEvent>),
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kafka(k) => write!(f, "EventSink::Kafka({})", k.topic),
            Self::Channel(_) => f.write_str("EventSink::Channel"),
        }
    }
}

/// How to produce to Kafka.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// `host:port,…`
    pub brokers: String,
    /// The decisions topic.
    pub topic: String,
    /// How long the producer lingers to batch, ms.
    pub linger_ms: u32,
}

impl Default for KafkaSinkConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic: "verdict.decisions.v1".into(),
            linger_ms: 5,
        }
    }
}

/// Counts deliveries Kafka refused after the producer's own retries.
struct DeliveryCounter(Arc<LimiterMetrics>);

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.0.events_failed.inc();
        }
    }
}

/// An idempotent, compressed Kafka producer keyed by key id.
pub struct KafkaSink {
    producer: ThreadedProducer<DeliveryCounter>,
    topic: String,
}

impl KafkaSink {
    /// Creates the producer (it connects in the background).
    ///
    /// # Errors
    /// When librdkafka refuses the configuration.
    pub fn new(cfg: &KafkaSinkConfig, metrics: Arc<LimiterMetrics>) -> Result<Self, KafkaError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("linger.ms", cfg.linger_ms.to_string())
            .set("queue.buffering.max.messages", "1000000")
            .set("message.timeout.ms", "120000")
            .create_with_context(DeliveryCounter(metrics))?;
        Ok(Self {
            producer,
            topic: cfg.topic.clone(),
        })
    }

    async fn send(&self, e: &DecisionEvent) {
        let payload = e.encode();
        loop {
            let record = BaseRecord::to(&self.topic)
                .key(e.key_id.as_bytes().as_slice())
                .payload(payload.as_slice());
            match self.producer.send(record) {
                Ok(()) => return,
                // librdkafka's own queue is full: wait here (off the decision path), so the
                // bounded queue in front fills and drops instead.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => {
                    tracing::warn!(error = %e, "producing a decision event failed");
                    return;
                }
            }
        }
    }

    /// Waits until every produced event is acknowledged (at shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(timeout)
    }
}

/// Drains `rx` into `sink` until every queue handle is dropped, then flushes.
pub fn spawn_drain(
    mut rx: EventReceiver,
    sink: EventSink,
    metrics: Arc<LimiterMetrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            match &sink {
                EventSink::Kafka(k) => k.send(&e).await,
                EventSink::Channel(tx) => {
                    if tx.send(e).await.is_err() {
                        metrics.events_failed.inc();
                    }
                }
            }
            metrics.events_sent.inc();
        }
        if let EventSink::Kafka(k) = &sink
            && let Err(e) = k.flush(Duration::from_secs(10))
        {
            tracing::warn!(error = %e, "flushing decision events at shutdown");
        }
    })
}
