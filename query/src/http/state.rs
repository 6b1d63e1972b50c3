//! What the HTTP handlers share: the engine, the accepted tokens and the service's metrics.

use prometheus::core::Collector;
use prometheus::{
    HistogramVec, IntCounterVec, Registry, TextEncoder, register_histogram_vec_with_registry,
    register_int_counter_vec_with_registry,
};

use crate::engine::Engine;

/// The service's own metrics.
#[derive(Debug, Clone)]
pub struct QueryMetrics {
    /// The registry holding them.
    pub registry: Registry,
    /// `verdict_query_requests_total{endpoint, outcome}`: outcome is `ok` or an error kind.
    pub requests: IntCounterVec,
    /// `verdict_query_seconds{endpoint}`: time to the answer's first byte.
    pub seconds: HistogramVec,
    /// `verdict_query_rows_total{endpoint}`: rows answered.
    pub rows: IntCounterVec,
    /// `verdict_query_answer_cache_total{outcome}`: reports answered from a kept answer
    /// (`hit`) or computed (`miss`).
    pub answer_cache: IntCounterVec,
}

impl QueryMetrics {
    /// A fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = register_int_counter_vec_with_registry!(
            "verdict_query_requests_total",
            "Queries answered, by endpoint and outcome (ok or the error kind)",
            &["endpoint", "outcome"],
            registry
        )
        .expect("a valid, unique metric");
        let seconds = register_histogram_vec_with_registry!(
            "verdict_query_seconds",
            "Time from the request to the answer's first byte",
            &["endpoint"],
            vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
            ],
            registry
        )
        .expect("a valid, unique metric");
        let rows = register_int_counter_vec_with_registry!(
            "verdict_query_rows_total",
            "Rows answered, by endpoint",
            &["endpoint"],
            registry
        )
        .expect("a valid, unique metric");
        let answer_cache = register_int_counter_vec_with_registry!(
            "verdict_query_answer_cache_total",
            "Named reports answered from an answer kept while their tables and policy were unchanged (hit), or computed (miss)",
            &["outcome"],
            registry
        )
        .expect("a valid, unique metric");
        Self {
            registry,
            requests,
            seconds,
            rows,
            answer_cache,
        }
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        self.render_with(&[])
    }

    /// The metrics with `more` (the engine's own, such as what its queries spilled).
    pub fn render_with(&self, more: &[&dyn Collector]) -> String {
        let mut families = self.registry.gather();
        families.extend(more.iter().flat_map(|c| c.collect()));
        TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
}

impl Default for QueryMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// Accepted bearer tokens; empty: no authentication (loopback only).
    pub tokens: Vec<String>,
    /// Metrics.
    pub metrics: QueryMetrics,
}
