//! The reconcile's Prometheus metrics, in a registry of their own (`verdict jobs reconcile
//! --metrics-addr` serves it): its runs as every job records them (`job="reconcile"`), and
//! what the last round saw.

use prometheus::{IntGauge, register_int_gauge_with_registry};
use verdict_jobs::metrics::{RunMetrics, VALID};

/// Every metric the reconcile exports.
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    /// Its runs (and the registry the others are in).
    pub run: RunMetrics,
    /// `verdict_reconcile_keys`: keys near their limit in the last reconcile round.
    pub keys: IntGauge,
    /// `verdict_reconcile_unreachable_regions`: regions the last round could not read
    /// (they keep their last share).
    pub unreachable: IntGauge,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ReconcileMetrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let run = RunMetrics::new();
        let r = &run.registry;
        Self {
            keys: register_int_gauge_with_registry!(
                "verdict_reconcile_keys",
                "Keys near their limit in the last reconcile round.",
                r
            )
            .expect(VALID),
            unreachable: register_int_gauge_with_registry!(
                "verdict_reconcile_unreachable_regions",
                "Regions the last reconcile round could not read (they keep their last share).",
                r
            )
            .expect(VALID),
            run,
        }
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        self.run.render()
    }
}
