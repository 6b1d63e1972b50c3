//! The ingest worker's Prometheus metrics, in a registry of its own (`verdict ingest
//! --metrics-addr` serves it at `/metrics`). Cloning shares the metrics: tests and the
//! bench read the same counters the worker writes.

use prometheus::core::Collector;
use prometheus::{
    Histogram, IntCounter, IntGauge, IntGaugeVec, Registry, TextEncoder,
    register_histogram_with_registry, register_int_counter_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry,
};

use crate::flush::FlushReport;

/// Every metric the ingest worker exports.
#[derive(Debug, Clone)]
pub struct IngestMetrics {
    /// The registry holding them.
    pub registry: Registry,
    /// `verdict_ingest_consumer_lag{partition}`: records in the partition after the last
    /// committed offset (so buffered, not yet durable records count as lag), from the
    /// Kafka client's statistics, for the partitions assigned to this worker.
    pub consumer_lag: IntGaugeVec,
    /// `verdict_ingest_partitions_owned`: partitions assigned and recovered.
    pub partitions_owned: IntGauge,
    /// `verdict_ingest_records_consumed_total`: records taken from Kafka into a buffer
    /// (good and bad; a replayed record counts again).
    pub records_consumed: IntCounter,
    /// `verdict_ingest_events_written_total`: events written to the raw table.
    pub events_written: IntCounter,
    /// `verdict_ingest_files_written_total`: raw Parquet files written.
    pub files_written: IntCounter,
    /// `verdict_ingest_bytes_written_total`: bytes of raw Parquet written.
    pub bytes_written: IntCounter,
    /// `verdict_ingest_quarantined_total`: bad records written to the quarantine prefix.
    pub quarantined: IntCounter,
    /// `verdict_ingest_upload_retries_total`: object store calls that had to be retried,
    /// counted as each retry happens (the worker hands it to its `StoreCalls::on_retry`).
    pub upload_retries: IntCounter,
    /// `verdict_ingest_flushes_total`: flushes completed (committed to the raw table; its offset committed,
    /// or owed to Kafka until a commit takes).
    pub flushes: IntCounter,
    /// `verdict_ingest_fenced_flushes_total`: flushes the raw table refused because another
    /// worker had committed the partition since (the partition is given up).
    pub fenced: IntCounter,
    /// `verdict_ingest_stalls_total`: partitions read again because their log in Kafka went
    /// past the next expected offset and nothing had arrived for the stall interval.
    pub stalls: IntCounter,
    /// `verdict_ingest_flush_seconds`: one flush, from its first file to its Delta commit.
    pub flush_seconds: Histogram,
}

impl Default for IngestMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl IngestMetrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let r = Registry::new();
        // The names and help texts are constants in a fresh registry: registering them
        // cannot fail.
        const VALID: &str = "a valid, unique metric";
        let counter = |name: &str, help: &str| {
            register_int_counter_with_registry!(name, help, r).expect(VALID)
        };
        Self {
            consumer_lag: register_int_gauge_vec_with_registry!(
                "verdict_ingest_consumer_lag",
                "Records in the partition after the last committed offset (buffered records \
                 count: they are not durable yet).",
                &["partition"],
                r
            )
            .expect(VALID),
            partitions_owned: register_int_gauge_with_registry!(
                "verdict_ingest_partitions_owned",
                "Partitions this worker owns (assigned and recovered).",
                r
            )
            .expect(VALID),
            records_consumed: counter(
                "verdict_ingest_records_consumed_total",
                "Records taken from Kafka into a partition buffer (replays count again).",
            ),
            events_written: counter(
                "verdict_ingest_events_written_total",
                "Events written to the raw table.",
            ),
            files_written: counter(
                "verdict_ingest_files_written_total",
                "Raw Parquet files written.",
            ),
            bytes_written: counter(
                "verdict_ingest_bytes_written_total",
                "Bytes of raw Parquet written.",
            ),
            quarantined: counter(
                "verdict_ingest_quarantined_total",
                "Bad records written to the quarantine prefix with their reason.",
            ),
            upload_retries: counter(
                "verdict_ingest_upload_retries_total",
                "Object store calls that failed and were retried.",
            ),
            flushes: counter(
                "verdict_ingest_flushes_total",
                "Flushes completed: files written and committed to the raw table with their offsets.",
            ),
            fenced: counter(
                "verdict_ingest_fenced_flushes_total",
                "Flushes refused by the raw table's log: another worker owns the partition now.",
            ),
            stalls: counter(
                "verdict_ingest_stalls_total",
                "Partitions read again from the next expected offset: their log in Kafka went past it and nothing had arrived for the stall interval.",
            ),
            flush_seconds: register_histogram_with_registry!(
                "verdict_ingest_flush_seconds",
                "One flush of a partition, from its first file to its Delta commit.",
                vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0],
                r
            )
            .expect(VALID),
            registry: r,
        }
    }

    /// Counts a completed flush.
    pub fn record(&self, report: &FlushReport, took: std::time::Duration) {
        self.flushes.inc();
        self.events_written.inc_by(report.events as u64);
        self.files_written.inc_by(report.files as u64);
        self.bytes_written.inc_by(report.bytes as u64);
        self.quarantined.inc_by(report.quarantined as u64);
        self.flush_seconds.observe(took.as_secs_f64());
    }

    /// Replaces the lag gauges with the lags in a statistics report: partitions this
    /// client fetches report a lag of zero or more; the others report -1 and are left out.
    pub fn set_lags(&self, lags: impl IntoIterator<Item = (i32, i64)>) {
        self.consumer_lag.reset();
        for (partition, lag) in lags {
            if partition >= 0 && lag >= 0 {
                self.consumer_lag
                    .with_label_values(&[&partition.to_string()])
                    .set(lag);
            }
        }
    }

    /// The lag gauges now, by partition.
    pub fn lags(&self) -> std::collections::BTreeMap<i32, i64> {
        self.consumer_lag
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter_map(|m| {
                let partition = m.get_label().first()?.value().parse().ok()?;
                Some((partition, m.get_gauge().get_value() as i64))
            })
            .collect()
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        // Encoding gathered metric families to a string cannot fail.
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_keep_only_fetched_partitions_and_replace_the_previous_report() {
        let m = IngestMetrics::new();
        m.set_lags([(0, 12), (1, -1), (-1, 5), (3, 0)]);
        let text = m.render();
        assert!(
            text.contains("verdict_ingest_consumer_lag{partition=\"0\"} 12"),
            "{text}"
        );
        assert!(
            text.contains("verdict_ingest_consumer_lag{partition=\"3\"} 0"),
            "{text}"
        );
        assert!(!text.contains("partition=\"1\""), "{text}");
        assert!(!text.contains("partition=\"-1\""), "{text}");
        assert_eq!(m.lags(), [(0, 12), (3, 0)].into());
        m.set_lags([(1, 7)]);
        let text = m.render();
        assert!(
            !text.contains("partition=\"0\""),
            "a revoked partition keeps no gauge"
        );
        assert!(
            text.contains("verdict_ingest_consumer_lag{partition=\"1\"} 7"),
            "{text}"
        );
    }
}
