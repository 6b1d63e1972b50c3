//! One `DecisionEvent` per decision, on a bounded queue that never blocks the decision: when
//! it is full the event is dropped and counted (telemetry is the one thing allowed to be
//! lossy). A background task drains the queue into an [`EventSink`]: Kafka
//! (`verdict_events_kafka::KafkaSink`: idempotent, lz4, lingering 50 ms, keyed by key id)
//! or an in-process channel for the embedded default ([`ChannelSink`]).

use std::sync::Arc;

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

    /// The events waiting now, in order.
    pub fn waiting(&mut self) -> Vec<DecisionEvent> {
        std::iter::from_fn(|| self.try_recv()).collect()
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

/// What became of one event handed to a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// Delivered (the drain counts it sent).
    Sent,
    /// On its way: the sink counts it sent or failed when it knows (Kafka's
    /// acknowledgement).
    Pending,
    /// Lost (the drain counts it failed).
    Lost,
}

/// Where drained events go.
#[async_trait::async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Hands one event on. May wait (off the decision path): the bounded queue in front is
    /// where drops happen.
    async fn send(&self, event: DecisionEvent) -> Handoff;

    /// At shutdown: waits for the pending events to be delivered, and returns how many
    /// were not (the drain counts them failed; the sink no longer counts them).
    async fn close(&self) -> u64 {
        0
    }
}

/// An in-process consumer (the embedded default's ingest writer). The drain task waits for
/// room here, so the bounded queue in front is where drops happen.
#[derive(Debug, Clone)]
pub struct ChannelSink(pub mpsc::Sender<DecisionEvent>);

#[async_trait::async_trait]
impl EventSink for ChannelSink {
    async fn send(&self, event: DecisionEvent) -> Handoff {
        match self.0.send(event).await {
            Ok(()) => Handoff::Sent,
            Err(_) => Handoff::Lost,
        }
    }
}

/// Drains `rx` into `sink` until every queue handle is dropped, then closes the sink. Every
/// event taken off the queue is counted once: sent, or failed (the sink lost it, or it was
/// still undelivered when the sink closed).
pub fn spawn_drain(
    mut rx: EventReceiver,
    sink: impl EventSink,
    metrics: Arc<LimiterMetrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            match sink.send(e).await {
                Handoff::Sent => metrics.events_sent.inc(),
                Handoff::Pending => {}
                Handoff::Lost => metrics.events_failed.inc(),
            }
        }
        let lost = sink.close().await;
        if lost > 0 {
            metrics.events_failed.inc_by(lost);
            tracing::warn!(lost, "decision events not delivered at shutdown");
        }
    })
}
