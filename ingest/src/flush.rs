//! One flush of one Kafka partition, and where a partition resumes, against the raw Delta
//! table (`ingest/README.md`). A flush writes its files, then commits them in one Delta
//! commit that also carries the partition's progress: a `txn` whose application id names
//! the Kafka cluster, topic and partition and whose version is the flush's last offset.
//! The commit goes in only if the table's `txn` for the partition is still the one the
//! worker resumed from or last committed: a worker that lost its partition and comes back
//! late is refused, deletes nothing committed, and leaves only files no commit names, which vacuum
//! removes. Store calls are retried with capped backoff until `give_up_after`: a store
//! outage stops the flush, never loses or doubles a row.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use verdict_lake::{Action, Commit, LakeError};
use verdict_schemas::{DecisionEvent, DecodeError, HourPartition};

use crate::raw_file::{ConsumedEvent, build_hour_file};
use crate::raw_table::{KafkaSource, RawTable, raw_add, split_by_hour};
use verdict_lake::files::EncodeError;
use verdict_schemas::layout::QUARANTINE_PREFIX;

/// One flush's offset range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FlushRange {
    /// First offset (inclusive).
    pub first: i64,
    /// Last offset (inclusive).
    pub last: i64,
}

/// A record that could not go into the raw table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRecord {
    /// Kafka partition.
    pub partition: i32,
    /// Kafka offset.
    pub offset: i64,
    /// Why, as a stable kind (`wrong_length`, `unknown_version`, `event_time_out_of_range`…).
    pub kind: String,
    /// Why, in words.
    pub reason: String,
    /// The record's value, hex.
    pub value_hex: String,
}

impl BadRecord {
    /// A record that did not decode.
    pub fn undecodable(partition: i32, offset: i64, value: &[u8], e: &DecodeError) -> Self {
        Self {
            partition,
            offset,
            kind: e.kind().to_owned(),
            reason: e.to_string(),
            value_hex: hex::encode(value),
        }
    }

    /// A record whose event time the raw table does not take.
    pub fn out_of_range(partition: i32, offset: i64, value: &[u8], reason: String) -> Self {
        Self::refused(partition, offset, value, "event_time_out_of_range", reason)
    }

    /// A record that decoded but that the raw table does not take, as `kind`.
    fn refused(partition: i32, offset: i64, value: &[u8], kind: &str, reason: String) -> Self {
        Self {
            partition,
            offset,
            kind: kind.to_owned(),
            reason,
            value_hex: hex::encode(value),
        }
    }
}

/// What a partition has buffered since its last flush.
#[derive(Debug, Default)]
pub struct PartitionBuffer {
    /// First offset of the buffer (the flush range's start).
    pub first: Option<i64>,
    /// Last offset consumed.
    pub last: i64,
    /// Good events.
    pub events: Vec<ConsumedEvent>,
    /// Bad records.
    pub bad: Vec<BadRecord>,
    /// When the first record arrived.
    pub since: Option<Instant>,
}

impl PartitionBuffer {
    /// A buffer holding `events` (good events of one partition, by offset), as if each had
    /// been consumed in turn.
    pub fn of(mut events: Vec<ConsumedEvent>) -> Self {
        events.sort_by_key(|c| c.offset);
        let mut b = Self::default();
        for c in &events {
            b.consumed(c.offset);
        }
        b.events = events;
        b
    }

    /// Records that offset `offset` was consumed.
    pub fn consumed(&mut self, offset: i64) {
        if self.first.is_none() {
            self.first = Some(offset);
            self.since = Some(Instant::now());
        }
        self.last = offset;
    }

    /// Takes the record at `offset` of `partition` (after [`Self::consumed`]): an event whose
    /// event time is within `accept` (UTC ms, inclusive) into the events, one outside it or a
    /// value that does not decode into the bad records, with the reason.
    pub fn take(&mut self, partition: i32, offset: i64, value: &[u8], accept: RangeInclusive<i64>) {
        match DecisionEvent::decode(value) {
            // The raw table's `policy_version` is a Delta long: a version past it cannot be
            // kept as it was sent, and a clamped one would be a different version.
            Ok(event) if i64::try_from(event.policy_version).is_err() => {
                let reason = format!(
                    "policy version {} is past what the raw table's policy_version (a long) holds, {}",
                    event.policy_version,
                    i64::MAX
                );
                self.bad.push(BadRecord::refused(
                    partition,
                    offset,
                    value,
                    "policy_version_out_of_range",
                    reason,
                ));
            }
            Ok(event) if accept.contains(&event.event_time_ms) => self.events.push(ConsumedEvent {
                event,
                partition,
                offset,
            }),
            Ok(event) => {
                let reason = format!(
                    "event time {} ms is outside the raw table's window [{}, {}]",
                    event.event_time_ms,
                    accept.start(),
                    accept.end()
                );
                self.bad
                    .push(BadRecord::out_of_range(partition, offset, value, reason));
            }
            Err(e) => self
                .bad
                .push(BadRecord::undecodable(partition, offset, value, &e)),
        }
    }

    /// Records in the buffer, good and bad.
    pub fn records(&self) -> usize {
        self.events.len() + self.bad.len()
    }
}

/// Why a flush or a recovery failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// Building a file failed.
    #[error(transparent)]
    File(#[from] EncodeError),
    /// The store kept failing past the deadline.
    #[error("object store unavailable for {waited:?} ({what}): {source}")]
    Store {
        /// What was being done.
        what: String,
        /// How long it was retried.
        waited: Duration,
        /// The last error.
        source: object_store::Error,
    },
    /// The table's progress for the partition is not what this worker last saw: another
    /// worker owns the partition now (or replayed it). Nothing of this flush is committed.
    #[error("flush {range:?} of partition {partition} was refused: {reason}")]
    Fenced {
        /// The partition.
        partition: i32,
        /// The flush.
        range: FlushRange,
        /// The conflict the log reported.
        reason: String,
    },
    /// The raw table could not be read or committed to.
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// The quarantine file could not be encoded.
    #[error("quarantine of partition {partition}: {reason}")]
    Quarantine {
        /// The partition.
        partition: i32,
        /// What is wrong.
        reason: String,
    },
}

/// How the flush talks to the store: retries, and when a file goes up in parts.
#[derive(Debug, Clone)]
pub struct StoreCalls {
    /// First wait.
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
    /// Stop retrying after this long and fail the flush.
    pub give_up_after: Duration,
    /// Files larger than this go up as multipart uploads (in parts of this size).
    pub multipart_threshold: usize,
    /// Counted at each retry, as it happens (the worker's
    /// `verdict_ingest_upload_retries_total`, which so moves during an outage rather than
    /// after it).
    pub on_retry: Option<prometheus::IntCounter>,
}

impl Default for StoreCalls {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            give_up_after: Duration::from_secs(240),
            multipart_threshold: 16 * 1024 * 1024,
            on_retry: None,
        }
    }
}

/// Counts what a flush did (for metrics and logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Offsets covered.
    pub range: Option<FlushRange>,
    /// Raw files written.
    pub files: usize,
    /// Events written.
    pub events: usize,
    /// Bytes written (raw files).
    pub bytes: usize,
    /// Records quarantined.
    pub quarantined: usize,
    /// Store calls that had to be retried.
    pub retries: usize,
    /// The hour partitions written, one raw file each, in order.
    pub hours: Vec<HourPartition>,
    /// The raw files written, in the order of `hours`.
    pub paths: Vec<Path>,
}

/// Runs `op` until it succeeds, retrying store errors with capped exponential backoff
/// until `retry.give_up_after`. `NotFound` on a delete is success.
async fn with_retry<T, F, Fut>(
    retry: &StoreCalls,
    what: &str,
    report: &mut FlushReport,
    mut op: F,
) -> Result<T, FlushError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let started = Instant::now();
    let mut wait = retry.initial;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => {
                return Err(FlushError::Store {
                    what: what.to_owned(),
                    waited: started.elapsed(),
                    source: e,
                });
            }
            Err(e) if started.elapsed() >= retry.give_up_after => {
                return Err(FlushError::Store {
                    what: what.to_owned(),
                    waited: started.elapsed(),
                    source: e,
                });
            }
            Err(e) => {
                report.retries += 1;
                if let Some(counter) = &retry.on_retry {
                    counter.inc();
                }
                tracing::warn!(error = %e, what, retry_in = ?wait, "object store call failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(retry.max);
            }
        }
    }
}

/// One file a flush writes.
struct Planned {
    path: Path,
    bytes: Vec<u8>,
    rows: usize,
}

/// What a flush writes: the raw files with their `add`s, and the quarantine file.
struct FlushFiles {
    raw: Vec<(Planned, Action)>,
    /// The hour partition of each raw file, in order.
    hours: Vec<HourPartition>,
    quarantine: Option<Planned>,
}

/// The raw files of one flush with their `add`s, and the quarantine file.
fn plan_files(
    source: &KafkaSource,
    range: FlushRange,
    buf: PartitionBuffer,
    today: &str,
    now_ms: i64,
) -> Result<FlushFiles, FlushError> {
    let mut raw = Vec::new();
    let mut hours = Vec::new();
    let mut bad = buf.bad;
    let split = split_by_hour(buf.events);
    for (c, e) in split.unplaceable {
        bad.push(BadRecord::out_of_range(
            source.partition,
            c.offset,
            &c.event.encode(),
            e.to_string(),
        ));
    }
    for (hour, events) in split.hours {
        let (Some(first), Some(last)) = (
            events.iter().map(|c| c.offset).min(),
            events.iter().map(|c| c.offset).max(),
        ) else {
            continue;
        };
        if let Some(file) =
            build_hour_file(&source.cluster, source.file_name(first, last), hour, events)?
        {
            let add = Action::Add(raw_add(&file, now_ms, true));
            hours.push(hour);
            raw.push((
                Planned {
                    path: Path::from(file.path()),
                    rows: file.rows,
                    bytes: file.bytes,
                },
                add,
            ));
        }
    }
    let quarantine = if bad.is_empty() {
        None
    } else {
        bad.sort_by_key(|b| b.offset);
        let mut body = Vec::new();
        for b in &bad {
            serde_json::to_writer(&mut body, b).map_err(|e| FlushError::Quarantine {
                partition: source.partition,
                reason: e.to_string(),
            })?;
            body.push(b'\n');
        }
        Some(Planned {
            path: quarantine_path(source, range, today),
            bytes: body,
            rows: bad.len(),
        })
    };
    Ok(FlushFiles {
        raw,
        hours,
        quarantine,
    })
}

/// `quarantine/date=<day of ingestion>/<cluster>-<topic>-<partition>-<first>-<last>-<random>.jsonl`:
/// a prefix of JSON lines, not a table. A flush writes it before its commit, under a name
/// unique to that writing, and its commit names it ([`QUARANTINE_PARAMETER`]); a flush that
/// is refused deletes it; one that never committed (its worker killed) leaves an orphan that
/// the partition's owner deletes once it is decided ([`orphan_candidates`],
/// [`delete_orphans`]). So each bad record ends in one file.
pub fn quarantine_path(source: &KafkaSource, range: FlushRange, today: &str) -> Path {
    Path::from(format!(
        "{QUARANTINE_PREFIX}/date={today}/{}",
        source.unique_name(range.first, range.last, "jsonl")
    ))
}

/// The operation parameter of a flush's commit that names the quarantine file written with
/// it: the log says which quarantine files are committed.
pub const QUARANTINE_PARAMETER: &str = "quarantine";

/// One quarantine file of a source, as its name and the store's listing say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineFile {
    /// Its path.
    pub path: Path,
    /// The offsets of the flush that wrote it.
    pub offsets: FlushRange,
    /// When the store says it was written, Unix ms.
    pub written_ms: i64,
}

/// The quarantine files of `source` in the store, by path.
pub async fn quarantine_files(
    store: &Arc<dyn ObjectStore>,
    source: &KafkaSource,
    retry: &StoreCalls,
) -> Result<Vec<QuarantineFile>, FlushError> {
    let mut report = FlushReport::default();
    let prefix = Path::from(QUARANTINE_PREFIX);
    let prefix = &prefix;
    let listed = with_retry(retry, QUARANTINE_PREFIX, &mut report, move || {
        store.list(Some(prefix)).try_collect::<Vec<_>>()
    })
    .await?;
    let mut files: Vec<QuarantineFile> = listed
        .into_iter()
        .filter_map(|meta| {
            let (first, last) = source.offsets_in(meta.location.filename()?)?;
            Some(QuarantineFile {
                offsets: FlushRange { first, last },
                written_ms: meta.last_modified.timestamp_millis(),
                path: meta.location,
            })
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Splits the quarantine files of one source against the raw table's progress for it,
/// `committed`, into the candidates for orphans and the undecided.
///
/// A file whose offsets the progress does not yet cover is undecided: the flush that wrote
/// it may still commit (a worker stopped past its session wakes and can win the race), so
/// nothing deletes it; the owner looks at it again once its own commits cover it. A file
/// the progress covers is decided: some commit took its offsets, and it holds their bad
/// records if that commit names it. Only a covered file whose offsets overlap another
/// file's of the source can be an orphan (the flush that committed those offsets wrote the
/// same bad records into a file of its own); the log says which ([`delete_orphans`]).
pub fn orphan_candidates(
    files: Vec<QuarantineFile>,
    committed: Option<i64>,
) -> (Vec<QuarantineFile>, Vec<QuarantineFile>) {
    let overlaps = |f: &QuarantineFile| {
        files.iter().any(|g| {
            g.path != f.path
                && g.offsets.first <= f.offsets.last
                && f.offsets.first <= g.offsets.last
        })
    };
    let (covered, undecided): (Vec<_>, Vec<_>) = files
        .iter()
        .cloned()
        .partition(|f| committed.is_some_and(|c| f.offsets.last <= c));
    let candidates = covered.into_iter().filter(|f| overlaps(f)).collect();
    (candidates, undecided)
}

/// How far before a quarantine file's write the log is read for the commit naming it: the
/// commit comes after the file, so this only allows for clocks that disagree.
const NAMING_SLACK_MS: i64 = 10 * 60 * 1000;

/// Deletes the `candidates` (covered quarantine files of a source, [`orphan_candidates`])
/// that no commit names: files of flushes that never committed, whose offsets and bad
/// records another flush committed. A file is kept whenever the log cannot say (it was
/// cleaned past the file's time, or could not be read): a record in two files is a smaller
/// harm than a record in none. Returns how many it deleted.
pub async fn delete_orphans(
    raw: &RawTable,
    candidates: &[QuarantineFile],
    retry: &StoreCalls,
) -> Result<usize, FlushError> {
    let Some(since) = candidates.iter().map(|f| f.written_ms).min() else {
        return Ok(0);
    };
    let named: std::collections::HashSet<String> = match raw
        .table()
        .parameters_since(since - NAMING_SLACK_MS)
        .await
    {
        Ok(Some(commits)) => commits
            .into_iter()
            .filter_map(|(_, mut p)| match p.remove(QUARANTINE_PARAMETER) {
                Some(serde_json::Value::String(path)) => Some(path),
                _ => None,
            })
            .collect(),
        Ok(None) => {
            tracing::warn!(
                files = candidates.len(),
                "the raw table's log no longer holds the commits of these quarantine files' time; they are kept"
            );
            return Ok(0);
        }
        Err(error) => {
            tracing::warn!(%error, files = candidates.len(), "could not read which commits name these quarantine files; they are kept");
            return Ok(0);
        }
    };
    let store = Arc::clone(raw.table().store());
    let store = &store;
    let mut report = FlushReport::default();
    let mut deleted = 0;
    for f in candidates
        .iter()
        .filter(|f| !named.contains(f.path.as_ref()))
    {
        let location = &f.path;
        with_retry(retry, location.as_ref(), &mut report, move || async move {
            match store.delete(location).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                other => other,
            }
        })
        .await?;
        tracing::info!(path = %f.path, "deleted the quarantine file of a flush that never committed; another flush committed its offsets and records");
        deleted += 1;
    }
    Ok(deleted)
}

/// Deletes the files a refused flush wrote. Their names are unique to that flush and no
/// commit holds them, so nothing committed goes; a file left behind is only an orphan for
/// vacuum (raw) or for the partition's owner ([`delete_orphans`]).
async fn drop_refused(store: &Arc<dyn ObjectStore>, written: &[Path]) {
    for path in written {
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => {
                tracing::warn!(%path, %error, "could not delete a file of a refused flush; it stays an orphan");
            }
        }
    }
}

async fn put_file(
    store: &Arc<dyn ObjectStore>,
    f: &Planned,
    retry: &StoreCalls,
    report: &mut FlushReport,
) -> Result<(), FlushError> {
    if f.bytes.len() > retry.multipart_threshold {
        // A failed attempt starts the upload over; the store expires abandoned parts.
        with_retry(retry, f.path.as_ref(), report, || async {
            let upload = store.put_multipart(&f.path).await?;
            let mut parts = WriteMultipart::new_with_chunk_size(upload, retry.multipart_threshold);
            parts.write(&f.bytes);
            parts.finish().await
        })
        .await?;
    } else {
        let payload = PutPayload::from(f.bytes.clone());
        with_retry(retry, f.path.as_ref(), report, || {
            store.put(&f.path, payload.clone())
        })
        .await?;
    }
    tracing::debug!(path = %f.path, rows = f.rows, bytes = f.bytes.len(), "file written");
    Ok(())
}

/// Writes one flush of `source` and commits it with the partition's progress, provided the
/// raw table's progress for it is still `expected` (what the worker resumed from or last
/// committed). Returns what it wrote; the caller commits `range.last + 1` to Kafka after.
pub async fn flush_partition(
    raw: &mut RawTable,
    source: &KafkaSource,
    expected: Option<i64>,
    buf: PartitionBuffer,
    retry: &StoreCalls,
) -> Result<FlushReport, FlushError> {
    let mut report = FlushReport::default();
    let Some(first) = buf.first else {
        return Ok(report);
    };
    let range = FlushRange {
        first,
        last: buf.last,
    };
    report.range = Some(range);
    report.events = buf.events.len();
    let now = chrono::DateTime::from_timestamp_millis(raw.table().now_ms()).unwrap_or_default();
    let today = now.format("%Y-%m-%d").to_string();
    let FlushFiles {
        raw: files,
        hours,
        quarantine,
    } = plan_files(source, range, buf, &today, now.timestamp_millis())?;
    report.hours = hours;
    let store = Arc::clone(raw.table().store());
    let mut written = Vec::with_capacity(files.len() + 1);
    if let Some(q) = &quarantine {
        report.quarantined = q.rows;
        put_file(&store, q, retry, &mut report).await?;
        written.push(q.path.clone());
    }
    let mut adds = Vec::with_capacity(files.len());
    for (f, add) in files {
        put_file(&store, &f, retry, &mut report).await?;
        written.push(f.path.clone());
        report.paths.push(f.path.clone());
        report.files += 1;
        report.bytes += f.bytes.len();
        adds.push(add);
    }
    let mut commit = Commit::new("STREAMING UPDATE", adds.clone())
        .with_parameter("outputMode", "Append")
        .with_parameter("source", source.app_id())
        .with_parameter("offsets", format!("{}-{}", range.first, range.last));
    if let Some(q) = &quarantine {
        commit = commit.with_parameter(QUARANTINE_PARAMETER, &q.path);
    }
    let commit = commit.with_txn(
        &source.app_id(),
        expected,
        range.last,
        now.timestamp_millis(),
    );
    let started = Instant::now();
    let mut wait = retry.initial;
    loop {
        match raw.commit(commit.clone()).await {
            Ok(version) => {
                tracing::debug!(partition = source.partition, version, "flush committed");
                return Ok(report);
            }
            Err(LakeError::Conflict { conflict, .. }) => {
                // A commit of ours whose answer was lost and that the retry then met is not
                // a conflict: the table holds this flush's progress and its files.
                raw.refresh().await?;
                let snapshot = raw.snapshot();
                let ours = snapshot.txn_version(&source.app_id()) == Some(range.last)
                    && adds.iter().all(|a| match a {
                        Action::Add(add) => snapshot.file(&add.path).is_some(),
                        _ => true,
                    });
                if ours {
                    return Ok(report);
                }
                drop_refused(&store, &written).await;
                return Err(FlushError::Fenced {
                    partition: source.partition,
                    range,
                    reason: conflict.to_string(),
                });
            }
            Err(LakeError::Store { source: e, .. }) if started.elapsed() < retry.give_up_after => {
                report.retries += 1;
                wait = back_off(retry, wait, &e, "committing the flush").await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `events` of `source` as one flush after the raw table's progress for it, as a
/// worker's flush does (the files, then one commit carrying the progress): how the
/// embedded default, the benches and the tests write a lake, through the one write path.
/// Offsets at or below the progress are moved past it, keeping their order and gaps, so
/// successive calls continue the partition as later flushes would.
pub async fn flush_after_progress(
    raw: &mut RawTable,
    source: &KafkaSource,
    mut events: Vec<ConsumedEvent>,
    retry: &StoreCalls,
) -> Result<FlushReport, FlushError> {
    // The writer's snapshot, which its own commits keep current: another writer's commit
    // since makes the flush's expectation fail, as a worker's would.
    let progress = raw.snapshot().txn_version(&source.app_id());
    if let (Some(p), Some(first)) = (progress, events.iter().map(|c| c.offset).min())
        && first <= p
    {
        let shift = p + 1 - first;
        for c in &mut events {
            c.offset += shift;
        }
    }
    flush_partition(raw, source, progress, PartitionBuffer::of(events), retry).await
}

/// Counts and logs a failed store call, waits `wait`, and returns the next wait (doubled,
/// capped).
async fn back_off(
    retry: &StoreCalls,
    wait: Duration,
    error: &object_store::Error,
    what: &str,
) -> Duration {
    if let Some(counter) = &retry.on_retry {
        counter.inc();
    }
    tracing::warn!(%error, retry_in = ?wait, what, "object store call failed; retrying");
    tokio::time::sleep(wait).await;
    (wait * 2).min(retry.max)
}

/// Where a partition resumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resume {
    /// The offset to consume from (`None`: the consumer's reset policy decides).
    pub at: Option<i64>,
    /// The table's progress for the partition, which the next flush's commit expects.
    pub committed: Option<i64>,
}

/// Where `source` resumes: after the last offset the raw table's log holds for it, or at
/// Kafka's committed offset if that is later (the table was emptied on purpose) or the log
/// holds none. Store calls are retried like a flush's.
pub async fn resume_point(
    raw: &mut RawTable,
    source: &KafkaSource,
    kafka_committed: Option<i64>,
    retry: &StoreCalls,
) -> Result<Resume, FlushError> {
    let started = Instant::now();
    let mut wait = retry.initial;
    loop {
        match raw.refresh().await {
            Ok(snapshot) => {
                let committed = snapshot.txn_version(&source.app_id());
                let at = match (committed.map(|c| c + 1), kafka_committed) {
                    (Some(t), Some(k)) => Some(t.max(k)),
                    (t, k) => t.or(k),
                };
                return Ok(Resume { at, committed });
            }
            Err(LakeError::Store { source: e, .. }) if started.elapsed() < retry.give_up_after => {
                wait = back_off(retry, wait, &e, "reading the raw table's log").await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;

    use super::*;

    const TOPIC: &str = "verdict.decisions.v1";
    const H14: i64 = 1_796_047_200_000;

    fn event(offset: i64, time: i64) -> ConsumedEvent {
        ConsumedEvent::allowed((offset % 7) as u8, time, 2, offset)
    }

    fn buffer(range: std::ops::Range<i64>) -> PartitionBuffer {
        let mut b = PartitionBuffer::default();
        for o in range {
            b.consumed(o);
            // Every tenth event is an hour late.
            let t = if o % 10 == 0 {
                H14 - 3_600_000 + o
            } else {
                H14 + o
            };
            b.events.push(event(o, t));
        }
        b
    }

    async fn names(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = store
            .list(Some(&Path::from(prefix)))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        v.sort();
        v
    }

    async fn local() -> (tempfile::TempDir, Arc<dyn ObjectStore>, RawTable) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let raw = RawTable::open(Arc::clone(&store)).await.unwrap();
        (dir, store, raw)
    }

    fn source() -> KafkaSource {
        KafkaSource::new("local", TOPIC, 2)
    }

    #[tokio::test]
    async fn a_flush_is_one_commit_of_its_hours_and_its_progress() {
        let (_dir, store, mut raw) = local().await;
        let calls = StoreCalls::default();
        let report = flush_partition(&mut raw, &source(), None, buffer(100..200), &calls)
            .await
            .unwrap();
        assert_eq!(
            (report.files, report.events, report.quarantined),
            (2, 100, 0)
        );
        let files = names(&store, "raw/date=2026-11-30").await;
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(files[0].starts_with(
            "raw/date=2026-11-30/hour=13/local-verdict.decisions.v1-00002-00000000000000000100-00000000000000000190-"
        ));
        let mut fresh = RawTable::open(Arc::clone(&store)).await.unwrap();
        let snapshot = fresh.snapshot();
        assert_eq!((snapshot.version(), snapshot.files().count()), (1, 2));
        assert_eq!(snapshot.num_records(), 100);
        assert_eq!(snapshot.txn_version(&source().app_id()), Some(199));
        let r = resume_point(&mut fresh, &source(), None, &calls)
            .await
            .unwrap();
        assert_eq!(
            r,
            Resume {
                at: Some(200),
                committed: Some(199)
            }
        );
        // Kafka ahead of the log (the table was emptied on purpose) wins; behind, it does not.
        assert_eq!(
            resume_point(&mut fresh, &source(), Some(500), &calls)
                .await
                .unwrap()
                .at,
            Some(500)
        );
        assert_eq!(
            resume_point(&mut fresh, &source(), Some(40), &calls)
                .await
                .unwrap()
                .at,
            Some(200)
        );
        let other = KafkaSource::new("other-region", TOPIC, 2);
        assert_eq!(
            resume_point(&mut fresh, &other, None, &calls)
                .await
                .unwrap(),
            Resume::default()
        );
    }

    #[tokio::test]
    async fn a_worker_that_lost_its_partition_is_refused_and_leaves_only_orphans() {
        let (_dir, store, mut owner) = local().await;
        let calls = StoreCalls::default();
        let mut zombie = RawTable::open(Arc::clone(&store)).await.unwrap();
        flush_partition(&mut owner, &source(), None, buffer(0..100), &calls)
            .await
            .unwrap();
        // The zombie resumed from nothing before it paused; the owner has committed since.
        let e = flush_partition(&mut zombie, &source(), None, buffer(0..150), &calls)
            .await
            .unwrap_err();
        match &e {
            FlushError::Fenced {
                partition: 2,
                range,
                reason,
            } => {
                assert_eq!(
                    *range,
                    FlushRange {
                        first: 0,
                        last: 149
                    }
                );
                assert!(reason.contains("advanced application"), "{reason}");
            }
            other => panic!("{other}"),
        }
        let snapshot = RawTable::open(Arc::clone(&store))
            .await
            .unwrap()
            .snapshot()
            .clone();
        assert_eq!(snapshot.num_records(), 100);
        assert_eq!(snapshot.txn_version(&source().app_id()), Some(99));
        // It deleted the files it wrote, which no commit names; the owner's are there.
        let on_disk = names(&store, "raw/date=2026-11-30").await;
        assert_eq!((on_disk.len(), snapshot.files().count()), (2, 2));
        // The owner goes on from its own progress.
        flush_partition(&mut owner, &source(), Some(99), buffer(100..150), &calls)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn files_above_the_threshold_go_up_in_parts_and_read_back_whole() {
        let (_dir, store, mut raw) = local().await;
        let calls = StoreCalls {
            multipart_threshold: 1_024,
            ..StoreCalls::default()
        };
        let report = flush_partition(&mut raw, &source(), None, buffer(0..3_000), &calls)
            .await
            .unwrap();
        assert!(
            report.bytes > 2 * 1_024,
            "the files must be larger than the threshold: {report:?}"
        );
        let mut rows = 0;
        for p in names(&store, "raw/date=2026-11-30").await {
            let bytes = store
                .get(&Path::from(p))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .unwrap()
                    .build()
                    .unwrap();
            rows += reader.map(|b| b.unwrap().num_rows()).sum::<usize>();
        }
        assert_eq!(rows, 3_000);
    }

    #[test]
    fn a_policy_version_the_table_cannot_hold_is_a_bad_record_not_clamped() {
        let mut b = PartitionBuffer::default();
        let mut e = event(0, H14).event;
        for (offset, version) in [(0, i64::MAX as u64), (1, 1 << 63), (2, u64::MAX)] {
            e.policy_version = version;
            b.consumed(offset);
            b.take(2, offset, &e.encode(), 0..=i64::MAX);
        }
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.events[0].event.policy_version, i64::MAX as u64);
        let bad: Vec<(i64, &str)> = b.bad.iter().map(|r| (r.offset, r.kind.as_str())).collect();
        assert_eq!(
            bad,
            [
                (1, "policy_version_out_of_range"),
                (2, "policy_version_out_of_range")
            ]
        );
        assert!(
            b.bad[0]
                .reason
                .contains("policy version 9223372036854775808 is past"),
            "{}",
            b.bad[0].reason
        );
    }

    #[tokio::test]
    async fn bad_records_go_to_quarantine_with_their_reason() {
        let (_dir, store, mut raw) = local().await;
        let mut b = buffer(0..5);
        b.consumed(5);
        b.bad.push(BadRecord::undecodable(
            2,
            5,
            &[2, 0, 0],
            &verdict_schemas::DecisionEvent::decode(&[2, 0, 0]).unwrap_err(),
        ));
        b.consumed(6);
        b.events.push(event(6, i64::MAX));
        let report = flush_partition(&mut raw, &source(), None, b, &StoreCalls::default())
            .await
            .unwrap();
        assert_eq!((report.events, report.quarantined), (6, 2));
        let q = names(&store, "quarantine").await;
        assert_eq!(q.len(), 1);
        let name = q[0].rsplit('/').next().unwrap();
        assert!(
            name.starts_with(
                "local-verdict.decisions.v1-00002-00000000000000000000-00000000000000000006-"
            ) && name.ends_with(".jsonl"),
            "{q:?}"
        );
        assert_eq!(source().offsets_in(name), Some((0, 6)));
        let body = store
            .get(&Path::from(q[0].as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let lines: Vec<serde_json::Value> = body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines[0]["offset"], 5);
        assert_eq!(lines[0]["kind"], "unknown_version");
        assert_eq!(lines[1]["offset"], 6);
        assert_eq!(lines[1]["kind"], "event_time_out_of_range");
    }

    /// What the owner of a partition decides about its quarantine files: a file past the
    /// progress is left (its flush may still commit), a covered one is deleted only when
    /// another file holds its offsets and no commit names it.
    #[tokio::test]
    async fn the_owner_deletes_only_the_quarantine_no_commit_will_name() {
        let (_dir, store, mut raw) = local().await;
        let calls = StoreCalls::default();
        let with_bad = |range: std::ops::RangeInclusive<i64>| {
            let mut b = buffer(*range.start()..*range.end());
            b.bad.push(BadRecord::undecodable(
                2,
                *range.end(),
                &[2, 0, 0],
                &verdict_schemas::DecodeError::Empty,
            ));
            b.consumed(*range.end());
            b
        };
        let files = |store: Arc<dyn ObjectStore>| async move {
            quarantine_files(&store, &source(), &StoreCalls::default())
                .await
                .unwrap()
        };
        flush_partition(&mut raw, &source(), None, with_bad(0..=10), &calls)
            .await
            .unwrap();
        let first = files(Arc::clone(&store)).await;
        assert_eq!(first.len(), 1);
        // A worker killed after writing the quarantine of 11..=20 and before its commit,
        // and a file of another source.
        let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
        let range = FlushRange {
            first: 11,
            last: 20,
        };
        let killed = quarantine_path(&source(), range, &today);
        let other = quarantine_path(&KafkaSource::new("local", TOPIC, 3), range, &today);
        for p in [&killed, &other] {
            store
                .put(p, PutPayload::from_static(b"{}\n"))
                .await
                .unwrap();
        }
        // Taking the partition at progress 10: the killed flush's file is undecided, and
        // the committed one is no candidate.
        let (candidates, undecided) = orphan_candidates(files(Arc::clone(&store)).await, Some(10));
        assert_eq!(candidates, Vec::new());
        assert_eq!(
            undecided.iter().map(|f| &f.path).collect::<Vec<_>>(),
            vec![&killed]
        );
        // The owner commits 11..=20 with the same bad record: the killed flush's file is
        // covered, overlaps the owner's, and no commit names it.
        flush_partition(&mut raw, &source(), Some(10), with_bad(11..=20), &calls)
            .await
            .unwrap();
        let (candidates, undecided) = orphan_candidates(files(Arc::clone(&store)).await, Some(20));
        assert_eq!(undecided, Vec::new());
        assert_eq!(candidates.len(), 2, "{candidates:?}");
        assert_eq!(delete_orphans(&raw, &candidates, &calls).await.unwrap(), 1);
        let left = files(Arc::clone(&store)).await;
        assert_eq!(left.len(), 2);
        assert!(left.iter().all(|f| f.path != killed), "{left:?}");
        // A stopped worker's flush of 21..=30 wins the race against the owner's: the owner's
        // flush is refused and deletes its own file; the winner's, which its commit names,
        // is kept.
        let mut stopped = RawTable::open(Arc::clone(&store)).await.unwrap();
        flush_partition(&mut stopped, &source(), Some(20), with_bad(21..=30), &calls)
            .await
            .unwrap();
        let refused = flush_partition(&mut raw, &source(), Some(20), with_bad(21..=30), &calls)
            .await
            .unwrap_err();
        assert!(matches!(refused, FlushError::Fenced { .. }), "{refused}");
        let (candidates, undecided) = orphan_candidates(files(Arc::clone(&store)).await, Some(30));
        assert_eq!((candidates.len(), undecided.len()), (0, 0));
        assert_eq!(files(Arc::clone(&store)).await.len(), 3);
        assert_eq!(
            names(&store, "quarantine").await.len(),
            4,
            "the other source's file stays"
        );
        // Files past the progress are never candidates, whatever overlaps them.
        let (candidates, undecided) = orphan_candidates(files(Arc::clone(&store)).await, None);
        assert_eq!((candidates.len(), undecided.len()), (0, 3));
    }
}
