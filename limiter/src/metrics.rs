//! The limiter's Prometheus metrics, in a registry of its own (a process may hold several
//! limiters; the gateway serves this registry at `/metrics`).

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Every metric the limiter exports.
#[derive(Debug, Clone)]
pub struct LimiterMetrics {
    /// The registry holding them.
    pub registry: Registry,
    /// `verdict_decisions_total{verdict, source}`.
    pub decisions: IntCounterVec,
    /// `verdict_store_latency_seconds`: one round trip to the counter store.
    pub store_latency: Histogram,
    /// `verdict_store_errors_total{kind}`: timeouts and failures of the counter store.
    pub store_errors: IntCounterVec,
    /// `verdict_breaker_state`: 0 closed, 1 half-open, 2 open (the most open of the
    /// shards' breakers).
    pub breaker_state: IntGauge,
    /// `verdict_breaker_open_shards`: how many of the store's shards have their breaker open.
    pub breaker_open_shards: IntGauge,
    /// `verdict_fallback_decisions_total`: decisions made by the local fallback.
    pub fallback_decisions: IntCounter,
    /// `verdict_overload_decisions_total`: decisions the local fallback made because the
    /// deadline passed while the request waited in this process (overload, not a failing
    /// store: no breaker opens for them).
    pub overload_decisions: IntCounter,
    /// `verdict_breaker_openings_total`: times a shard's breaker opened.
    pub breaker_openings: IntCounter,
    /// `verdict_charged_back_total`: requests the local fallback admitted that were handed
    /// to the counter store to count.
    pub charged_back: IntCounter,
    /// `verdict_charges_dropped_total`: requests the local fallback admitted that the
    /// counter store will never count (older than their window, or past the bound kept).
    pub charges_dropped: IntCounter,
    /// `verdict_unconfigured_decisions_total`: requests whose tier or route class the policy
    /// does not know (allowed, and worth an alert).
    pub unconfigured: IntCounter,
    /// `verdict_events_dropped_total`: events dropped because the queue was full.
    pub events_dropped: IntCounter,
    /// `verdict_events_sent_total`: events delivered (acknowledged by Kafka, or taken by
    /// the in-process consumer).
    pub events_sent: IntCounter,
    /// `verdict_events_failed_total`: events lost after the queue: refused by the sink,
    /// refused by Kafka after its retries, or undelivered at shutdown.
    pub events_failed: IntCounter,
    /// `verdict_policy_version`: version of the policy in force.
    pub policy_version: IntGauge,
    /// `verdict_policy_age_seconds`: since the policy source last confirmed it.
    pub policy_age_seconds: IntGauge,
    /// `verdict_policy_reload_errors_total`: source reads or documents that were refused.
    pub policy_reload_errors: IntCounter,
    /// `verdict_share_version`: version of the regional shares in force.
    pub share_version: IntGauge,
    /// `verdict_share_reload_errors_total`: share reads that failed (the last stay).
    pub share_reload_errors: IntCounter,
    /// `verdict_near_limit_reported_total`: near-limit requests reported to the region's
    /// Redis for the reconcile job.
    pub near_limit_reported: IntCounter,
    /// `verdict_near_limit_dropped_total`: near-limit requests not reported (the report
    /// failed, or too many distinct keys in one interval).
    pub near_limit_dropped: IntCounter,
}

impl Default for LimiterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl LimiterMetrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        // The names and help texts are constants: building or registering them cannot fail.
        let reg = |m: Box<dyn Collector>| registry.register(m).expect("unique, valid metric");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric name");
            reg(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric name");
            reg(Box::new(g.clone()));
            g
        };
        let counter_vec = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            reg(Box::new(c.clone()));
            c
        };
        let decisions = IntCounterVec::new(
            Opts::new(
                "verdict_decisions_total",
                "Decisions by verdict and by where they came from.",
            ),
            &["verdict", "source"],
        )
        .expect("valid metric");
        reg(Box::new(decisions.clone()));
        let store_latency = Histogram::with_opts(
            HistogramOpts::new(
                "verdict_store_latency_seconds",
                "One decision's round trip to the counter store.",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.003, 0.005, 0.01,
            ]),
        )
        .expect("valid metric");
        reg(Box::new(store_latency.clone()));
        Self {
            decisions,
            store_latency,
            store_errors: counter_vec(
                "verdict_store_errors_total",
                "Counter store calls that did not decide, by kind (timeout, backend, bad_reply: the store failed; busy, overloaded: this process was too slow).",
                "kind",
            ),
            breaker_state: gauge(
                "verdict_breaker_state",
                "Circuit breakers in front of the counter store's shards, the most open: 0 closed, 1 half-open, 2 open.",
            ),
            breaker_open_shards: gauge(
                "verdict_breaker_open_shards",
                "Shards of the counter store whose breaker is open (their keys decided by the local fallback).",
            ),
            fallback_decisions: counter(
                "verdict_fallback_decisions_total",
                "Decisions made by the local fallback bucket.",
            ),
            overload_decisions: counter(
                "verdict_overload_decisions_total",
                "Decisions made by the local fallback because the deadline passed while the request waited in this process (no breaker opens for them).",
            ),
            breaker_openings: counter(
                "verdict_breaker_openings_total",
                "Times a shard's circuit breaker opened.",
            ),
            charged_back: counter(
                "verdict_charged_back_total",
                "Requests admitted by the local fallback and handed to the counter store to count.",
            ),
            charges_dropped: counter(
                "verdict_charges_dropped_total",
                "Requests admitted by the local fallback that the counter store will not count (older than their window, or past the bound kept).",
            ),
            unconfigured: counter(
                "verdict_unconfigured_decisions_total",
                "Requests whose tier or route class is not in the policy (allowed).",
            ),
            events_dropped: counter(
                "verdict_events_dropped_total",
                "Decision events dropped because the event queue was full.",
            ),
            events_sent: counter(
                "verdict_events_sent_total",
                "Decision events delivered (acknowledged by Kafka or taken in-process).",
            ),
            events_failed: counter(
                "verdict_events_failed_total",
                "Decision events lost after the queue (refused, failed after retries, or undelivered at shutdown).",
            ),
            policy_version: gauge("verdict_policy_version", "Version of the policy in force."),
            policy_age_seconds: gauge(
                "verdict_policy_age_seconds",
                "Seconds since the policy source last confirmed the policy in force.",
            ),
            policy_reload_errors: counter(
                "verdict_policy_reload_errors_total",
                "Policy reads or documents that were refused (the previous policy stays).",
            ),
            share_version: gauge(
                "verdict_share_version",
                "Version of the regional shares in force (0: static weights only).",
            ),
            share_reload_errors: counter(
                "verdict_share_reload_errors_total",
                "Regional share reads that failed (the last shares stay in force).",
            ),
            near_limit_reported: counter(
                "verdict_near_limit_reported_total",
                "Near-limit requests reported to the region's Redis for the reconcile job.",
            ),
            near_limit_dropped: counter(
                "verdict_near_limit_dropped_total",
                "Near-limit requests not reported (report failed or too many keys).",
            ),
            registry,
        }
    }

    /// Decisions made, of every verdict and source: each offered one event to the queue,
    /// so once the queue is drained this is events sent + failed + dropped.
    pub fn decisions_total(&self) -> u64 {
        self.decisions
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding gathered metric families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
