//! Where Kafka stands in the demo: the gateway's decision events, counted and encoded to
//! their 64-byte wire form on their key's partition, then written to the raw table by the
//! ingest worker's own flush ([`verdict_ingest::flush::flush_partition`]): one flush per
//! partition, committed with the partition's progress, bad records quarantined.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use object_store::ObjectStore;
use verdict_ingest::flush::{FlushReport, PartitionBuffer, StoreCalls, flush_partition};
use verdict_ingest::{KafkaSource, RawTable};
use verdict_limiter::EventReceiver;
use verdict_schemas::{DecisionEvent, EVENT_V1_LEN, HourPartition, Verdict};

use crate::report::DemoReport;

/// The topic name the demo writes into file names, as production does.
pub const DEMO_TOPIC: &str = "verdict.decisions.v1";

/// What the queue's consumers have seen so far.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    events: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    pub(crate) would_deny: AtomicU64,
    degraded: AtomicU64,
    /// Per region (by id): events, and refusals (denied or would-deny).
    regions: Vec<(AtomicU64, AtomicU64)>,
}

impl Counts {
    /// Nothing seen yet, from `regions` regions.
    pub(crate) fn new(regions: usize) -> Self {
        Self {
            regions: (0..regions).map(|_| Default::default()).collect(),
            ..Self::default()
        }
    }

    fn take(&self, e: &DecisionEvent) {
        self.events.fetch_add(1, Ordering::Relaxed);
        if let Some((events, refused)) = self.regions.get(usize::from(e.region.0)) {
            events.fetch_add(1, Ordering::Relaxed);
            if e.verdict != Verdict::Allowed {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        match e.verdict {
            Verdict::Allowed => &self.allowed,
            Verdict::Denied => &self.denied,
            Verdict::WouldDeny => &self.would_deny,
        }
        .fetch_add(1, Ordering::Relaxed);
        if e.is_degraded() {
            self.degraded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Copies the counts into the report.
    pub(crate) fn fill(&self, report: &mut DemoReport) {
        let c = |n: &AtomicU64| n.load(Ordering::Relaxed);
        report.events = c(&self.events);
        report.allowed = c(&self.allowed);
        report.denied = c(&self.denied);
        report.would_deny = c(&self.would_deny);
        report.degraded = c(&self.degraded);
        report.regions = crate::regions::REGIONS
            .iter()
            .zip(&self.regions)
            .map(
                |((name, weight, _), (events, refused))| crate::report::RegionTraffic {
                    name: (*name).to_owned(),
                    weight: *weight,
                    events: c(events),
                    refused: c(refused),
                },
            )
            .collect();
    }
}

/// The queue partition of an event, as Kafka keys records by key id: the key id is already a
/// hash, so its first bytes spread keys evenly over partitions.
pub fn partition_of(e: &DecisionEvent, partitions: u32) -> usize {
    let k = e.key_id.as_bytes();
    (u32::from_le_bytes([k[0], k[1], k[2], k[3]]) % partitions.max(1)) as usize
}

/// Each partition's records in wire form, in offset order.
pub type Partitions = Vec<Vec<[u8; EVENT_V1_LEN]>>;

/// Takes events off a gateway's queue until told to finish (then takes what is left):
/// each is counted, encoded to its wire form and appended to its key's partition.
pub(crate) async fn consume(
    mut events: EventReceiver,
    partitions: u16,
    counts: Arc<Counts>,
    mut finish: tokio::sync::oneshot::Receiver<()>,
) -> Partitions {
    let mut queues = vec![Vec::new(); usize::from(partitions)];
    let mut take = |e: DecisionEvent| {
        counts.take(&e);
        queues[partition_of(&e, u32::from(partitions))].push(e.encode());
    };
    loop {
        tokio::select! {
            e = events.recv() => match e {
                Some(e) => take(e),
                None => break,
            },
            _ = &mut finish => {
                while let Some(e) = events.try_recv() {
                    take(e);
                }
                break;
            }
        }
    }
    queues
}

/// What the raw table's writes did, over all partitions.
#[derive(Debug, Default)]
pub struct Written {
    /// Raw files committed.
    pub files: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Records quarantined (undecodable, or an event time outside the calendar).
    pub quarantined: usize,
    /// The hour partitions written, in order.
    pub hours: Vec<HourPartition>,
}

/// Writes every partition's records into the raw table in `store` (created if missing), one
/// flush per partition, the partitions concurrently.
pub async fn write_raw(
    store: Arc<dyn ObjectStore>,
    partitions: Partitions,
) -> anyhow::Result<Written> {
    let raw = RawTable::open(store)
        .await
        .context("creating the raw table")?;
    let mut tasks = tokio::task::JoinSet::new();
    for (partition, records) in partitions.into_iter().enumerate() {
        let mut raw = raw.clone();
        tasks.spawn(async move { flush_records(&mut raw, partition as i32, records).await });
    }
    let mut written = Written::default();
    while let Some(done) = tasks.join_next().await {
        let report = done.context("a partition writer panicked")??;
        written.files += report.files;
        written.bytes += report.bytes;
        written.quarantined += report.quarantined;
        written.hours.extend(report.hours);
    }
    written.hours.sort();
    written.hours.dedup();
    Ok(written)
}

/// One partition's records, each taken at its offset as the ingest worker takes a record
/// from Kafka (any event time is accepted: the demo's hours are its own), then flushed.
async fn flush_records(
    raw: &mut RawTable,
    partition: i32,
    records: Vec<[u8; EVENT_V1_LEN]>,
) -> anyhow::Result<FlushReport> {
    let mut buf = PartitionBuffer::default();
    for (offset, bytes) in records.iter().enumerate() {
        let offset = offset as i64;
        buf.consumed(offset);
        buf.take(partition, offset, bytes, i64::MIN..=i64::MAX);
    }
    let source = KafkaSource::new("local", DEMO_TOPIC, partition);
    let report = flush_partition(raw, &source, None, buf, &StoreCalls::default())
        .await
        .with_context(|| format!("writing partition {partition} to the raw table"))?;
    if report.quarantined > 0 {
        tracing::warn!(
            partition,
            records = report.quarantined,
            "records quarantined rather than written"
        );
    }
    Ok(report)
}
