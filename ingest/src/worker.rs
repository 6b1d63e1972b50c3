//! The ingest worker: one member of a Kafka consumer group. It buffers each partition it
//! owns, flushes by size and by age as `flush.rs` does (one Delta commit per flush, with
//! the partition's progress in it), and commits an offset to Kafka only after the flush's
//! Delta commit.
//!
//! Rebalances are served only while the worker polls, and flushes run between polls, so a
//! rebalance never lands inside a flush. A revoked partition's buffer is dropped (its new
//! owner replays it from the raw table's log); an assigned partition is paused until the
//! log has said where it resumes, then sought there. A store outage longer than the retry
//! deadline ends the run with an error: the process restarts and resumes from the log.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};

use crate::flush::{
    FlushError, FlushReport, PartitionBuffer, QuarantineFile, StoreCalls, delete_orphans,
    flush_partition, orphan_candidates, quarantine_files, resume_point,
};
use crate::metrics::IngestMetrics;
use crate::raw_table::{KafkaSource, RawTable};
use verdict_lake::Clock;

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Kafka bootstrap servers, `host:port,…`.
    pub brokers: String,
    /// The Kafka cluster's name, unique among the clusters that feed one lake (one per
    /// region): it is part of each partition's progress in the raw table's log, so two
    /// clusters' partition 3 are two applications.
    pub cluster: String,
    /// The decisions topic.
    pub topic: String,
    /// The consumer group: workers of one group share the partitions.
    pub group_id: String,
    /// A stable id of this worker within the group (Kafka static membership): a worker
    /// restarted with the same id takes its partitions back at once, without waiting for
    /// the dead one's session to expire or rebalancing the others.
    pub instance_id: Option<String>,
    /// A partition is flushed once it buffers this many records (bounds memory: about 100
    /// bytes per buffered event).
    pub flush_max_records: usize,
    /// … or once its oldest buffered record is this old.
    pub flush_max_age: Duration,
    /// Events older than this (by event time, against the worker's clock) are quarantined.
    pub max_event_age: Duration,
    /// Events further in the future than this are quarantined.
    pub max_event_lead: Duration,
    /// How store calls are retried.
    pub retry: StoreCalls,
    /// How often the Kafka client reports statistics (the consumer lag gauges).
    pub stats_interval: Duration,
    /// A partition none of whose records has arrived for this long is checked against
    /// Kafka: if its log goes past the next offset expected, the partition is read again
    /// from there, once for each next offset (the client has been seen to deliver the first
    /// part of a partition after a rebalance and nothing more of it).
    pub stall_after: Duration,
    /// The time: event times are judged against it, and the raw table's commits, files and
    /// progress are stamped with it.
    pub clock: Clock,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            cluster: "main".into(),
            topic: "verdict.decisions.v1".into(),
            group_id: "verdict-ingest".into(),
            instance_id: None,
            flush_max_records: 1_000_000,
            flush_max_age: Duration::from_secs(60),
            max_event_age: Duration::from_secs(7 * 24 * 3600),
            max_event_lead: Duration::from_secs(3600),
            retry: StoreCalls::default(),
            stats_interval: Duration::from_secs(5),
            stall_after: Duration::from_secs(10),
            clock: Arc::new(verdict_schemas::SystemClock),
        }
    }
}

/// Why the worker stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// Kafka refused the configuration or a call.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A flush or a resume failed past its retries.
    #[error(transparent)]
    Flush(#[from] FlushError),
    /// The raw table could not be opened.
    #[error(transparent)]
    Lake(#[from] verdict_lake::LakeError),
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Flushes completed.
    pub flushes: usize,
    /// Events written.
    pub events: usize,
    /// Raw files written.
    pub files: usize,
    /// Raw bytes written.
    pub bytes: usize,
    /// Records quarantined.
    pub quarantined: usize,
    /// Store calls retried.
    pub retries: usize,
    /// Flushes refused because another worker had committed the partition since.
    pub fenced: usize,
}

impl IngestStats {
    fn add(&mut self, r: &FlushReport) {
        self.flushes += 1;
        self.events += r.events;
        self.files += r.files;
        self.bytes += r.bytes;
        self.quarantined += r.quarantined;
        self.retries += r.retries;
    }
}

/// What woke the worker's loop.
enum Event {
    Tick,
    Record {
        partition: i32,
        offset: i64,
        payload: Option<Vec<u8>>,
    },
}

#[derive(Debug)]
enum Change {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
}

/// Records rebalances for the loop to act on between polls, and turns the client's
/// statistics into lag gauges.
struct Rebalances {
    changes: Mutex<Vec<Change>>,
    /// The partitions assigned to this client now. The client's statistics also list
    /// partitions it fetched before a rebalance took them away, with their last lag; only
    /// these get a gauge, so a partition is reported by the worker that owns it.
    assigned: Mutex<BTreeSet<i32>>,
    /// The client's own view of each partition in its last statistics (fetch state and
    /// offsets), said in a stall's warning so the log tells where the client stood.
    views: Mutex<HashMap<i32, String>>,
    metrics: IngestMetrics,
    topic: String,
}

impl Rebalances {
    fn push(&self, change: Change) {
        {
            let mut assigned = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
            match &change {
                Change::Assigned(ps) => assigned.extend(ps),
                Change::Revoked(ps) => ps.iter().for_each(|p| {
                    assigned.remove(p);
                }),
            }
        }
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(change);
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

impl ClientContext for Rebalances {
    fn stats(&self, statistics: Statistics) {
        if let Some(topic) = statistics.topics.get(&self.topic) {
            let assigned = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
            self.metrics.set_lags(
                topic
                    .partitions
                    .iter()
                    .filter(|(p, _)| assigned.contains(p))
                    .map(|(p, stats)| (*p, stats.consumer_lag)),
            );
            let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
            views.clear();
            views.extend(topic.partitions.iter().map(|(p, s)| {
                (
                    *p,
                    format!(
                        "fetch_state={} next_offset={} app_offset={} hi_offset={} ls_offset={} fetchq_cnt={} rx_ver_drops={}",
                        s.fetch_state,
                        s.next_offset,
                        s.app_offset,
                        s.hi_offset,
                        s.ls_offset,
                        s.fetchq_cnt,
                        s.rx_ver_drops
                    ),
                )
            }));
        }
    }
}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.push(Change::Revoked(partitions(tpl)));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Nothing is consumed from a new partition before its recovery.
            if let Err(e) = consumer.pause(tpl) {
                tracing::warn!(error = %e, "pausing newly assigned partitions");
            }
            self.push(Change::Assigned(partitions(tpl)));
        }
    }
}

struct Owned {
    source: KafkaSource,
    buf: PartitionBuffer,
    /// The next offset expected (records below it are already in the table; one above it
    /// means records in between were not delivered, see [`IngestWorker::take`]).
    next: Option<i64>,
    /// The offset the worker last sought back to because a record arrived past `next`.
    gap_sought: Option<i64>,
    /// When a record of the partition last arrived (or the partition was recovered, or last
    /// checked for a stall): see [`IngestConfig::stall_after`].
    heard: Instant,
    /// The offset the worker last sought back to because Kafka held records past `next`
    /// and none arrived ([`IngestWorker::unstall`]).
    stall_sought: Option<i64>,
    /// The partition's progress in the raw table's log as this worker last saw it (from
    /// the resume or its own last commit): the next flush's commit expects exactly this.
    committed: Option<i64>,
    /// An offset the raw table's log has reached but Kafka's committed offset has not
    /// (its commit failed, or the resume found the log ahead): committed again on every
    /// tick until it takes, so the group's offset and the lag gauge catch up with the truth.
    owed_commit: Option<i64>,
    /// Quarantine files of the partition past the log's progress when the worker took it:
    /// their flushes may still commit, so they are decided once this worker's own commits
    /// cover them ([`orphan_candidates`]).
    undecided: Vec<QuarantineFile>,
}

/// The worker.
pub struct IngestWorker {
    cfg: IngestConfig,
    store: Arc<dyn ObjectStore>,
    /// The raw table, opened on first use.
    raw: Option<RawTable>,
    consumer: StreamConsumer<Rebalances>,
    owned: HashMap<i32, Owned>,
    /// Partitions the group assigns to this worker whose flush the raw table refused: each
    /// resumes from the log on the next tick ([`IngestWorker::recover_refused`]).
    refused: BTreeSet<i32>,
    stats: IngestStats,
    metrics: IngestMetrics,
}

impl IngestWorker {
    /// Joins the group (the assignment arrives with the first polls).
    pub fn new(mut cfg: IngestConfig, store: Arc<dyn ObjectStore>) -> Result<Self, IngestError> {
        let metrics = IngestMetrics::new();
        cfg.retry.on_retry = Some(metrics.upload_retries.clone());
        let mut client = ClientConfig::new();
        if let Some(id) = &cfg.instance_id {
            client.set("group.instance.id", id);
        }
        let consumer: StreamConsumer<Rebalances> = client
            .set("bootstrap.servers", &cfg.brokers)
            .set("group.id", &cfg.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set(
                "max.poll.interval.ms",
                (cfg.retry.give_up_after.as_millis() as u64 + 60_000).to_string(),
            )
            .set(
                "statistics.interval.ms",
                cfg.stats_interval.as_millis().to_string(),
            )
            .create_with_context(Rebalances {
                changes: Mutex::default(),
                assigned: Mutex::default(),
                views: Mutex::default(),
                metrics: metrics.clone(),
                topic: cfg.topic.clone(),
            })?;
        consumer.subscribe(&[&cfg.topic])?;
        Ok(Self {
            cfg,
            store,
            raw: None,
            consumer,
            owned: HashMap::new(),
            refused: BTreeSet::new(),
            stats: IngestStats::default(),
            metrics,
        })
    }

    /// The worker's metrics; the clone shares them, so it can be read (or served) while the
    /// worker runs.
    pub fn metrics(&self) -> IngestMetrics {
        self.metrics.clone()
    }

    /// What the worker has done so far.
    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// Runs until `shutdown` resolves, then flushes everything it holds, commits, and
    /// returns what it did.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<IngestStats, IngestError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        loop {
            let event = tokio::select! {
                _ = &mut shutdown => break,
                _ = ticker.tick() => Event::Tick,
                m = self.consumer.recv() => match m {
                    Ok(m) => Event::Record {
                        partition: m.partition(),
                        offset: m.offset(),
                        payload: m.payload().map(<[u8]>::to_vec),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka consumer error; the client reconnects by itself");
                        continue;
                    }
                },
            };
            // The client runs the rebalance callbacks inside `recv`, and takes a revocation as
            // done when its callback returns: the next owner may already be recovering the
            // partition. So revocations are applied before anything else is done, and nothing
            // of a revoked partition is flushed after it.
            self.apply_rebalances().await?;
            match event {
                Event::Tick => {
                    self.recover_refused().await?;
                    self.flush_aged().await?;
                    self.unstall();
                    self.commit_owed();
                }
                Event::Record {
                    partition,
                    offset,
                    payload,
                } => self.take(partition, offset, payload.as_deref()).await?,
            }
        }
        self.apply_rebalances().await?;
        let all: Vec<i32> = self.owned.keys().copied().collect();
        for p in all {
            self.flush(p).await?;
        }
        self.consumer.unsubscribe();
        tracing::info!(?self.stats, "ingest stopped");
        Ok(self.stats)
    }

    async fn apply_rebalances(&mut self) -> Result<(), IngestError> {
        let changes = std::mem::take(
            &mut *self
                .consumer
                .context()
                .changes
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for change in changes {
            match change {
                Change::Revoked(ps) => {
                    for p in ps {
                        self.refused.remove(&p);
                        if let Some(o) = self.owned.remove(&p) {
                            self.metrics.partitions_owned.dec();
                            tracing::info!(
                                partition = p,
                                dropped = o.buf.records(),
                                "partition revoked; its buffer is replayed by the next owner"
                            );
                        }
                    }
                }
                Change::Assigned(ps) => {
                    for p in ps {
                        self.refused.remove(&p);
                        self.recover(p).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn recover(&mut self, p: i32) -> Result<(), IngestError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.cfg.topic, p);
        let committed = self
            .consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .ok()
            .and_then(|c| c.find_partition(&self.cfg.topic, p).map(|e| e.offset()))
            .and_then(|o| match o {
                Offset::Offset(n) => Some(n),
                _ => None,
            });
        let source = KafkaSource::new(&self.cfg.cluster, &self.cfg.topic, p);
        let retry = self.cfg.retry.clone();
        let raw = self.raw().await?;
        let r = resume_point(raw, &source, committed, &retry).await?;
        let store = Arc::clone(raw.table().store());
        let files = quarantine_files(&store, &source, &retry).await?;
        let (candidates, undecided) = orphan_candidates(files, r.committed);
        let dropped = delete_orphans(raw, &candidates, &retry).await?;
        // With no progress anywhere, the partition starts at its first offset still in
        // Kafka: known, so that a record delivered out of place is seen as one.
        let at = match r.at {
            Some(at) => Some(at),
            None => {
                match self
                    .consumer
                    .fetch_watermarks(&self.cfg.topic, p, Duration::from_secs(10))
                {
                    Ok((low, _)) => Some(low),
                    Err(e) => {
                        tracing::warn!(partition = p, error = %e, "reading the partition's first offset; taking the first record delivered as the start");
                        None
                    }
                }
            }
        };
        let start = at.map_or(Offset::Beginning, Offset::Offset);
        tracing::info!(
            partition = p,
            ?start,
            kafka_committed = committed,
            log_committed = r.committed,
            orphaned_quarantine_deleted = dropped,
            undecided_quarantine = undecided.len(),
            "partition assigned; resuming where the raw table's log says"
        );
        let fresh = Owned {
            source,
            buf: PartitionBuffer::default(),
            next: at,
            gap_sought: None,
            heard: Instant::now(),
            stall_sought: None,
            committed: r.committed,
            owed_commit: r.at.filter(|&at| committed.is_none_or(|c| c < at)),
            undecided,
        };
        if self.owned.insert(p, fresh).is_none() {
            self.metrics.partitions_owned.inc();
        }
        self.consumer
            .seek(&self.cfg.topic, p, start, Duration::from_secs(10))?;
        self.consumer.resume(&tpl)?;
        Ok(())
    }

    /// Resumes each refused partition the group still assigns here from the raw table's log,
    /// as after an assignment. A Kafka call that fails (the client may be rejoining the group
    /// after a long stop) is tried again on the next tick; a partition the group has taken
    /// away meanwhile is left to its revocation.
    async fn recover_refused(&mut self) -> Result<(), IngestError> {
        let refused: Vec<i32> = self.refused.iter().copied().collect();
        for p in refused {
            if !self.is_assigned(p) {
                self.refused.remove(&p);
                continue;
            }
            match self.recover(p).await {
                Ok(()) => {
                    self.refused.remove(&p);
                }
                Err(IngestError::Kafka(e)) => {
                    tracing::warn!(partition = p, error = %e, "resuming a refused partition; tried again on the next tick");
                    if self.owned.remove(&p).is_some() {
                        self.metrics.partitions_owned.dec();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether the group assigns partition `p` to this worker now.
    fn is_assigned(&self, p: i32) -> bool {
        self.consumer
            .context()
            .assigned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&p)
    }

    /// The raw table, opened (or created) the first time it is needed.
    async fn raw(&mut self) -> Result<&mut RawTable, IngestError> {
        if self.raw.is_none() {
            self.raw = Some(
                RawTable::open_at(Arc::clone(&self.store), Arc::clone(&self.cfg.clock)).await?,
            );
        }
        Ok(self.raw.as_mut().expect("opened above"))
    }

    async fn take(
        &mut self,
        p: i32,
        offset: i64,
        payload: Option<&[u8]>,
    ) -> Result<(), IngestError> {
        let now = self.cfg.clock.now_ms();
        let (oldest, newest) = (
            now - self.cfg.max_event_age.as_millis() as i64,
            now + self.cfg.max_event_lead.as_millis() as i64,
        );
        let Some(o) = self.owned.get_mut(&p) else {
            // Fetched before the pause of a new assignment took effect: it is fetched again
            // after the partition's recovery and seek.
            return Ok(());
        };
        o.heard = Instant::now();
        if o.next.is_some_and(|next| offset < next) {
            return Ok(());
        }
        // A record past the next expected offset: the client delivered one fetched before a
        // seek or a rebalance (it happens), or Kafka no longer holds the offsets between.
        // Read again from the expected offset once; a record still past it then means
        // Kafka's retention took the offsets in between, and they are gone.
        if let Some(next) = o.next.filter(|&next| offset > next) {
            if o.gap_sought != Some(next) {
                tracing::warn!(
                    partition = p,
                    offset,
                    expected = next,
                    "a record arrived past the next expected offset; reading the partition again from there"
                );
                o.gap_sought = Some(next);
                if let Err(e) = self.consumer.seek(
                    &self.cfg.topic,
                    p,
                    Offset::Offset(next),
                    Duration::from_secs(10),
                ) {
                    // The record is not taken; the next one past `next` tries again.
                    tracing::warn!(partition = p, error = %e, "seeking back to the next expected offset");
                    o.gap_sought = None;
                }
                return Ok(());
            }
            tracing::error!(
                partition = p,
                first_missing = next,
                last_missing = offset - 1,
                "offsets are no longer in Kafka (its retention took them before they were ingested)"
            );
        }
        o.next = Some(offset + 1);
        o.buf.consumed(offset);
        self.metrics.records_consumed.inc();
        o.buf
            .take(p, offset, payload.unwrap_or_default(), oldest..=newest);
        if o.buf.records() >= self.cfg.flush_max_records {
            self.flush(p).await?;
        }
        Ok(())
    }

    /// Reads again, from the next offset expected, each owned partition none of whose
    /// records has arrived for [`IngestConfig::stall_after`] while Kafka's log goes past it
    /// (its end as a reader of committed records sees it, the last stable offset: an open
    /// transaction is no stall). Once for each next offset, so an offset no record fills (a
    /// committed transaction's marker) costs one seek, not one a check.
    fn unstall(&mut self) {
        let quiet: Vec<i32> = self
            .owned
            .iter()
            .filter(|(p, o)| o.heard.elapsed() >= self.cfg.stall_after && !self.refused.contains(p))
            .map(|(p, _)| *p)
            .collect();
        for p in quiet {
            let high = self
                .consumer
                .fetch_watermarks(&self.cfg.topic, p, Duration::from_secs(5));
            let Some(o) = self.owned.get_mut(&p) else {
                continue;
            };
            o.heard = Instant::now();
            let high = match high {
                Ok((_, high)) => high,
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "reading where a quiet partition ends in kafka; checked again later");
                    continue;
                }
            };
            let Some(next) = stalled_at(o.next, high, o.stall_sought) else {
                continue;
            };
            let client = (self.consumer.context().views.lock())
                .unwrap_or_else(|e| e.into_inner())
                .get(&p)
                .cloned()
                .unwrap_or_else(|| "no statistics yet".into());
            tracing::warn!(
                partition = p,
                next,
                kafka_end = high,
                quiet_secs = self.cfg.stall_after.as_secs_f64(),
                client,
                "kafka's log goes past the next expected offset and nothing arrived; reading the partition again from there (a committed transaction's marker at a partition's end does this once)"
            );
            o.stall_sought = Some(next);
            self.metrics.stalls.inc();
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.cfg.topic, p);
            let sought = self
                .consumer
                .seek(
                    &self.cfg.topic,
                    p,
                    Offset::Offset(next),
                    Duration::from_secs(10),
                )
                .and_then(|()| self.consumer.resume(&tpl));
            if let Err(e) = sought {
                tracing::warn!(partition = p, error = %e, "reading a stalled partition again; tried again later");
                o.stall_sought = None;
            }
        }
    }

    async fn flush_aged(&mut self) -> Result<(), IngestError> {
        let due: Vec<i32> = self
            .owned
            .iter()
            .filter(|(_, o)| {
                o.buf
                    .since
                    .is_some_and(|s| s.elapsed() >= self.cfg.flush_max_age)
            })
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.flush(p).await?;
        }
        Ok(())
    }

    /// Commits every offset owed to Kafka (see [`Owned::owed_commit`]).
    fn commit_owed(&mut self) {
        let owed: Vec<i32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.owed_commit.is_some())
            .map(|(p, _)| *p)
            .collect();
        for p in owed {
            self.commit_owed_by(p);
        }
    }

    /// Commits the offset owed for partition `p`, if any; on failure it stays owed.
    fn commit_owed_by(&mut self, p: i32) {
        let Some(o) = self.owned.get_mut(&p) else {
            return;
        };
        let Some(offset) = o.owed_commit else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        let committed = tpl
            .add_partition_offset(&self.cfg.topic, p, Offset::Offset(offset))
            .and_then(|()| self.consumer.commit(&tpl, CommitMode::Sync));
        match committed {
            Ok(()) => o.owed_commit = None,
            Err(e) => tracing::warn!(
                partition = p,
                offset,
                error = %e,
                "offset commit failed; the raw table's log holds the progress, the commit is retried"
            ),
        }
    }

    async fn flush(&mut self, p: i32) -> Result<(), IngestError> {
        if self.owned.get(&p).is_none_or(|o| o.buf.first.is_none()) {
            return Ok(());
        }
        self.raw().await?;
        let (Some(o), Some(raw)) = (self.owned.get_mut(&p), self.raw.as_mut()) else {
            return Ok(());
        };
        let buf = std::mem::take(&mut o.buf);
        let started = Instant::now();
        match flush_partition(raw, &o.source, o.committed, buf, &self.cfg.retry).await {
            Ok(report) => {
                self.stats.add(&report);
                self.metrics.record(&report, started.elapsed());
                if let Some(range) = report.range {
                    o.committed = Some(range.last);
                    // The log is the truth; a failed commit only means a later replay
                    // start, which the resume corrects, and it is tried again on the next tick.
                    o.owed_commit = Some(range.last + 1);
                    self.commit_owed_by(p);
                    tracing::info!(
                        partition = p,
                        first = range.first,
                        last = range.last,
                        events = report.events,
                        files = report.files,
                        quarantined = report.quarantined,
                        "flush committed"
                    );
                    self.settle_quarantine(p, range.last).await?;
                }
                Ok(())
            }
            Err(FlushError::Fenced {
                partition,
                range,
                reason,
            }) => {
                self.stats.fenced += 1;
                self.metrics.fenced.inc();
                if self.owned.remove(&p).is_some() {
                    self.metrics.partitions_owned.dec();
                }
                // Another worker committed the partition since this one last read its
                // progress. Whether that worker owns it now is the group's to say: while the
                // group assigns the partition here, this worker resumes it from the log on
                // the next tick (its records are never left unread); once the group takes
                // it away, the revocation is all there is to do.
                if self.is_assigned(p) {
                    tracing::warn!(
                        partition,
                        ?range,
                        %reason,
                        "the raw table refused this flush: another worker committed the partition since; the group still assigns it here, so it resumes from the raw table's log"
                    );
                    self.refused.insert(p);
                } else {
                    tracing::warn!(
                        partition,
                        ?range,
                        %reason,
                        "the raw table refused this flush: the group has given the partition to another worker"
                    );
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Decides the undecided quarantine files of partition `p` that its progress, now
    /// `committed`, covers, deleting the orphans among them ([`delete_orphans`]).
    async fn settle_quarantine(&mut self, p: i32, committed: i64) -> Result<(), IngestError> {
        let Some(o) = self.owned.get_mut(&p) else {
            return Ok(());
        };
        if o.undecided.is_empty() {
            return Ok(());
        }
        let (covered, undecided): (Vec<_>, Vec<_>) = std::mem::take(&mut o.undecided)
            .into_iter()
            .partition(|f| f.offsets.last <= committed);
        o.undecided = undecided;
        if let Some(raw) = self.raw.as_ref() {
            delete_orphans(raw, &covered, &self.cfg.retry).await?;
        }
        Ok(())
    }
}

/// The offset to read a quiet partition again from: its next expected offset `next`, when
/// the end of the partition's log in Kafka, `high`, is past it and the worker has not
/// already sought back there (`sought`). `None` while nothing is expected yet (the first
/// record delivered sets it).
fn stalled_at(next: Option<i64>, high: i64, sought: Option<i64>) -> Option<i64> {
    next.filter(|&next| high > next && sought != Some(next))
}

#[cfg(test)]
mod tests {
    use super::stalled_at;

    #[test]
    fn a_quiet_partition_is_read_again_from_its_next_offset_once_while_kafka_holds_more() {
        // Kafka holds offsets 26..=29 past the next expected, 26: read again from 26.
        assert_eq!(stalled_at(Some(26), 30, None), Some(26));
        // Already sought back to 26 and still nothing: not again.
        assert_eq!(stalled_at(Some(26), 30, Some(26)), None);
        // Records arrived since (next moved on) and it went quiet again: read again.
        assert_eq!(stalled_at(Some(28), 30, Some(26)), Some(28));
        // Everything Kafka holds was delivered: a quiet partition, not a stalled one.
        assert_eq!(stalled_at(Some(30), 30, None), None);
        // Nothing expected yet: the first record delivered sets where the partition is.
        assert_eq!(stalled_at(None, 30, None), None);
    }
}
