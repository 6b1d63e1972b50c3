//! The rollup's aggregation, written for the raw table's layout.
//!
//! [`ROLLUP_SQL`](crate::ROLLUP_SQL) defines the rollup and [`DEMAND_SQL`](crate::DEMAND_SQL)
//! the demand histogram; DuckDB runs both unchanged in the benchmark. This module computes
//! the same rows (a test compares them with DataFusion running the SQL on the same files, row
//! for row) in two passes over the hour's raw files, each file read by one task, four tasks
//! per thread (while one waits for the store, another decodes), each task folding the files
//! it takes into state of its own:
//!
//! 1. **The refused keys and every key's demand.** The eight small columns the histogram
//!    and the refusals need are decoded for every row: a key's requests and quota per
//!    (tier, route class, region), and whether it was refused. The histogram is built from
//!    those sums once every file is read.
//! 2. **The groups of the refused keys.** `key_id` is decoded for every row, the other
//!    eleven columns only for the rows of refused keys, and those rows are folded into one
//!    [`Acc`] per (key, tier, route class, region).
//!
//! Raw files are sorted by key, so a key's rows come in runs: the key is looked up once per
//! run, and its few groups are searched in a short list. A group of a refused key that has
//! no refusal of its own (the key was refused on another route class) is dropped at the
//! end, as the SQL's join on the whole group drops it.
//!
//! Compared with DataFusion running the SQL, this skips the generic row format for the
//! group key (a 16-byte binary and three small integers), the join, the second scan the
//! histogram's SQL makes, and the decoding of eleven columns for the rows of keys never
//! refused (about 2 % of keys are).

use std::sync::Arc;

use std::collections::BTreeMap;

use arrow::array::{
    ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, Int16Array, Int64Array, RecordBatch,
    TimestampMillisecondArray, UInt8Array, UInt16Array, UInt32Array,
};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{
    DataType, Int64Type, TimeUnit, TimestampMillisecondType, UInt8Type, UInt16Type, UInt32Type,
};
use arrow::error::ArrowError;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowPredicateFn, RowFilter};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use rustc_hash::{FxHashMap, FxHashSet};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::tables::{demand_bucket, demand_hourly_schema, denied_hourly_schema, raw};

use crate::error::RollupError;
use crate::sources::RawFile;

/// A raw key id, its 16 bytes read big-endian (so the integers order as the bytes do).
type Key = u128;

/// Files read at a time per thread: while one waits for the store, another decodes.
const READS_PER_THREAD: usize = 4;

/// Rows decoded at a time.
const BATCH_ROWS: usize = 8192;

/// The aggregates of one group, the columns of `denied_hourly` after the group key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acc {
    allowed: u64,
    denied: u64,
    would_deny: u64,
    denied_by_bucket: u64,
    denied_by_window: u64,
    would_deny_by_window: u64,
    degraded: u64,
    /// Rows with any verdict but "allowed" (what makes the group part of the rollup).
    refused: u64,
    min_remaining_tokens: u32,
    min_remaining_window: u32,
    first_denial: i64,
    last_denial: i64,
    policy_version: u64,
    window_quota: u32,
}

impl Default for Acc {
    fn default() -> Self {
        Self {
            allowed: 0,
            denied: 0,
            would_deny: 0,
            denied_by_bucket: 0,
            denied_by_window: 0,
            would_deny_by_window: 0,
            degraded: 0,
            refused: 0,
            min_remaining_tokens: u32::MAX,
            min_remaining_window: u32::MAX,
            first_denial: i64::MAX,
            last_denial: i64::MIN,
            policy_version: 0,
            window_quota: 0,
        }
    }
}

impl Acc {
    fn merge(&mut self, o: &Acc) {
        self.allowed += o.allowed;
        self.denied += o.denied;
        self.would_deny += o.would_deny;
        self.denied_by_bucket += o.denied_by_bucket;
        self.denied_by_window += o.denied_by_window;
        self.would_deny_by_window += o.would_deny_by_window;
        self.degraded += o.degraded;
        self.refused += o.refused;
        self.min_remaining_tokens = self.min_remaining_tokens.min(o.min_remaining_tokens);
        self.min_remaining_window = self.min_remaining_window.min(o.min_remaining_window);
        self.first_denial = self.first_denial.min(o.first_denial);
        self.last_denial = self.last_denial.max(o.last_denial);
        self.policy_version = self.policy_version.max(o.policy_version);
        self.window_quota = self.window_quota.max(o.window_quota);
    }
}

/// Tier, route class and region packed so that their order is the tuple's order.
fn packed(tier: u8, route_class: u8, region: u16) -> u32 {
    (u32::from(tier) << 24) | (u32::from(route_class) << 16) | u32::from(region)
}

/// One key's demand in one (tier, route class, region): its decisions the limit review
/// counts (the limiter's, on Redis or the fallback) and the most quota it had.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Demand {
    requests: u64,
    /// The window quota times the sub-keys: a split key's whole quota.
    quota: u64,
}

impl Demand {
    fn merge(&mut self, o: &Demand) {
        self.requests += o.requests;
        self.quota = self.quota.max(o.quota);
    }
}

/// The groups of some keys: per key, its groups' packed tier/route/region and aggregates.
#[derive(Debug, Default)]
struct Groups {
    index: FxHashMap<Key, u32>,
    keys: Vec<KeyGroups>,
    /// Rows folded in.
    rows: u64,
}

#[derive(Debug)]
struct KeyGroups {
    key: Key,
    tags: Vec<u32>,
    accs: Vec<Acc>,
}

impl Groups {
    /// The position of `key`'s groups, added when new.
    fn key(&mut self, key: Key) -> u32 {
        *self.index.entry(key).or_insert_with(|| {
            self.keys.push(KeyGroups {
                key,
                tags: Vec::new(),
                accs: Vec::new(),
            });
            (self.keys.len() - 1) as u32
        })
    }

    /// The aggregates of group `tag` of the key at `at`.
    fn acc(&mut self, at: u32, tag: u32) -> &mut Acc {
        let g = &mut self.keys[at as usize];
        let i = match g.tags.iter().position(|t| *t == tag) {
            Some(i) => i,
            None => {
                g.tags.push(tag);
                g.accs.push(Acc::default());
                g.tags.len() - 1
            }
        };
        &mut g.accs[i]
    }

    fn merge(&mut self, other: Groups) {
        self.rows += other.rows;
        for g in other.keys {
            let at = self.key(g.key);
            for (tag, acc) in g.tags.into_iter().zip(&g.accs) {
                self.acc(at, tag).merge(acc);
            }
        }
    }

    /// The groups with a refusal, ordered by (key, tier, route class, region).
    fn into_rows(self) -> Vec<(Key, u32, Acc)> {
        let mut rows: Vec<(Key, u32, Acc)> = self
            .keys
            .into_iter()
            .flat_map(|g| {
                let key = g.key;
                g.tags
                    .into_iter()
                    .zip(g.accs)
                    .map(move |(t, acc)| (key, t, acc))
            })
            .filter(|(_, _, acc)| acc.refused > 0)
            .collect();
        rows.sort_unstable_by_key(|(key, tag, _)| (*key, *tag));
        rows
    }
}

/// Every key's demand per (tier, route class, region), summed the way a hash aggregate
/// partitioned by key does it, so that its tables stay in the cache.
///
/// A minute's file holds a small share of an hour's keys, most of them in a run of one or
/// two rows, so nearly every row adds a (key, group) pair; one table of the hour's groups
/// (a million at the design's scale) takes a cache miss for each. Pairs are instead
/// appended to one of [`DEMAND_PARTS`] lists by their key's hash, and once
/// [`DEMAND_PENDING`] are held each list is summed into its part's table, a sixty-fourth of
/// the whole.
#[derive(Debug)]
struct DemandSums {
    pending: Vec<Vec<(Key, u32, Demand)>>,
    held: usize,
    parts: Vec<FxHashMap<(Key, u32), Demand>>,
}

/// The parts of [`DemandSums`].
const DEMAND_PARTS: usize = 64;

/// Pairs held before they are summed into the parts' tables (40 bytes each).
const DEMAND_PENDING: usize = 1 << 16;

impl Default for DemandSums {
    fn default() -> Self {
        Self {
            pending: (0..DEMAND_PARTS).map(|_| Vec::new()).collect(),
            held: 0,
            parts: (0..DEMAND_PARTS).map(|_| FxHashMap::default()).collect(),
        }
    }
}

impl DemandSums {
    /// The part of `key`: a multiplicative hash of its two halves, not the tables' own
    /// hash (whose high bits would then be the same for every key of a table).
    fn part(key: Key) -> usize {
        let mixed = ((key >> 64) as u64 ^ key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> (64 - DEMAND_PARTS.trailing_zeros())) as usize
    }

    fn add(&mut self, key: Key, tag: u32, d: Demand) {
        self.pending[Self::part(key)].push((key, tag, d));
        self.held += 1;
        if self.held >= DEMAND_PENDING {
            self.sum_pending();
        }
    }

    fn sum_pending(&mut self) {
        for (list, part) in self.pending.iter_mut().zip(&mut self.parts) {
            for (key, tag, d) in list.drain(..) {
                part.entry((key, tag)).or_default().merge(&d);
            }
        }
        self.held = 0;
    }

    fn merge(&mut self, mut other: DemandSums) {
        self.sum_pending();
        other.sum_pending();
        for (mine, theirs) in self.parts.iter_mut().zip(other.parts) {
            let (mut into, from) = if mine.len() < theirs.len() {
                (theirs, std::mem::take(mine))
            } else {
                (std::mem::take(mine), theirs)
            };
            for (group, d) in from {
                into.entry(group).or_default().merge(&d);
            }
            *mine = into;
        }
    }

    /// Every (key, packed group) and its demand.
    fn into_sums(mut self) -> impl Iterator<Item = ((Key, u32), Demand)> {
        self.sum_pending();
        self.parts.into_iter().flatten()
    }
}

/// What pass 1 finds in the files a task reads.
#[derive(Debug, Default)]
struct Scan {
    rows: u64,
    refused: FxHashSet<Key>,
    demand: DemandSums,
}

impl Scan {
    fn merge(&mut self, other: Scan) {
        self.rows += other.rows;
        if self.refused.len() < other.refused.len() {
            let mine = std::mem::replace(&mut self.refused, other.refused);
            self.refused.extend(mine);
        } else {
            self.refused.extend(other.refused);
        }
        self.demand.merge(other.demand);
    }

    /// Adds the groups of one run of `key`'s rows, emptying `run`.
    fn add_run(&mut self, key: Key, run: &mut Vec<(u32, Demand)>) {
        for (tag, d) in run.drain(..) {
            self.demand.add(key, tag, d);
        }
    }
}

/// An hour's rollup: the `denied_hourly` rows, the `demand_hourly` rows, and the number
/// of raw events read.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    /// The rows of `denied_hourly`.
    pub denied: RecordBatch,
    /// The rows of `demand_hourly`.
    pub demand: RecordBatch,
    /// Raw events read.
    pub events: u64,
}

/// The rollup and the demand histogram of `files` (the raw files of `hour` a reader
/// takes), with `threads` threads' worth of files read at a time.
pub async fn rollup_files(
    store: &Arc<dyn ObjectStore>,
    hour: HourPartition,
    files: &[RawFile],
    threads: usize,
) -> Result<Folded, RollupError> {
    let files: Arc<[RawFile]> = files.into();
    let threads = threads.max(1);

    let started = std::time::Instant::now();
    let scans = in_parallel(store, &files, threads, |store, file, scan| async move {
        scan_file(&store, &file, scan).await
    })
    .await?;
    let mut scan = Scan::default();
    for s in scans {
        scan.merge(s);
    }
    let Scan {
        rows: events,
        refused: keys,
        demand,
    } = scan;
    let demand = demand_batch(hour, demand)?;
    tracing::debug!(
        seconds = started.elapsed().as_secs_f64(),
        keys = keys.len(),
        demand_rows = demand.num_rows(),
        "rollup pass 1: the refused keys and the demand"
    );
    if keys.is_empty() {
        return Ok(Folded {
            denied: RecordBatch::new_empty(denied_hourly_schema()),
            demand,
            events,
        });
    }

    let keys = Arc::new(keys);
    let pass_2 = std::time::Instant::now();
    let folded = in_parallel(store, &files, threads, move |store, file, groups| {
        let keys = Arc::clone(&keys);
        async move { fold_file(&store, &file, keys, groups).await }
    })
    .await?;
    let mut groups = Groups::default();
    for g in folded {
        groups.merge(g);
    }
    tracing::debug!(
        seconds = pass_2.elapsed().as_secs_f64(),
        rows = groups.rows,
        "rollup pass 2: the groups of those keys"
    );
    Ok(Folded {
        denied: to_batch(hour, groups.into_rows())?,
        demand,
        events,
    })
}

/// Runs `work` on every file, [`READS_PER_THREAD`] × `threads` tasks each taking the next
/// file until none is left and folding it into the task's own state (which starts as
/// `S::default()`); returns the tasks' states.
async fn in_parallel<S, F, Fut>(
    store: &Arc<dyn ObjectStore>,
    files: &Arc<[RawFile]>,
    threads: usize,
    work: F,
) -> Result<Vec<S>, RollupError>
where
    S: Default + Send + 'static,
    F: Fn(Arc<dyn ObjectStore>, RawFile, S) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<S, RollupError>> + Send,
{
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..(threads * READS_PER_THREAD).min(files.len()) {
        let (store, files, next, work) = (
            Arc::clone(store),
            Arc::clone(files),
            Arc::clone(&next),
            work.clone(),
        );
        tasks.spawn(async move {
            let mut state = S::default();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(file) = files.get(i) else {
                    return Ok::<_, RollupError>(state);
                };
                state = work(Arc::clone(&store), file.clone(), state).await?;
            }
        });
    }
    let mut states = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let done = done.map_err(|e| RollupError::Task(e.to_string()))?;
        states.push(done?);
    }
    Ok(states)
}

/// Reads one raw object for the Parquet decoder: the footer from the size the listing gave,
/// then the column chunks the decoder asks for.
struct StoreReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

fn store_error(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(store_error)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(store_error)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// A reader of `file` decoding `columns` (by name; each must have its type in the raw
/// schema), with the positions of those columns among the file's leaves.
///
/// (Key ids are decoded as 16 bytes per row. Reading them as a dictionary array, the
/// chunk's dictionary once and an index per row, would be cheaper, but parquet 59 fails
/// to decode a `FIXED_LEN_BYTE_ARRAY` dictionary page into one.)
async fn open(
    store: &Arc<dyn ObjectStore>,
    file: &RawFile,
    columns: &[(&str, DataType)],
) -> Result<(ParquetRecordBatchStreamBuilder<StoreReader>, Vec<usize>), RollupError> {
    let mut reader = StoreReader {
        store: Arc::clone(store),
        path: file.meta.location.clone(),
        size: file.meta.size,
    };
    let meta = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
        .await
        .map_err(|e| read_error(file, e))?;
    let schema = Arc::clone(meta.schema());
    let mut leaves = Vec::with_capacity(columns.len());
    for (name, ty) in columns {
        let Some((i, field)) = schema.column_with_name(name) else {
            return Err(read_error(file, format!("no column {name}")));
        };
        if !readable_as(field.data_type(), ty) {
            return Err(read_error(
                file,
                format!(
                    "column {name} is {}, the raw table's is {ty}",
                    field.data_type()
                ),
            ));
        }
        leaves.push(i);
    }
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
        .with_batch_size(BATCH_ROWS);
    Ok((builder, leaves))
}

/// Whether a column of type `found` holds what the raw table's `want` does: the same type,
/// or for a millisecond timestamp any time zone (the values are instants either way;
/// writers spell UTC as "UTC" or "+00:00").
fn readable_as(found: &DataType, want: &DataType) -> bool {
    match (found, want) {
        (
            DataType::Timestamp(TimeUnit::Millisecond, _),
            DataType::Timestamp(TimeUnit::Millisecond, _),
        ) => true,
        _ => found == want,
    }
}

fn key_type() -> DataType {
    DataType::FixedSizeBinary(16)
}

/// Column `name` of a batch the reader was asked to decode it in.
fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch
        .column_by_name(name)
        .expect("the reader was asked for this column")
}

/// The key ids of a batch the reader was asked to decode them in.
fn keys_of(batch: &RecordBatch) -> &FixedSizeBinaryArray {
    column(batch, raw::KEY_ID).as_fixed_size_binary()
}

/// The key ids of an array of 16-byte values, in order.
fn key_ids(ids: &FixedSizeBinaryArray) -> impl Iterator<Item = Key> + '_ {
    ids.value_data()
        .chunks_exact(16)
        .map(|b| Key::from_be_bytes(b.try_into().expect("16-byte chunks")))
}

fn read_error(file: &RawFile, e: impl std::fmt::Display) -> RollupError {
    RollupError::RawFile {
        path: file.meta.location.to_string(),
        reason: e.to_string(),
    }
}

/// The columns pass 1 reads, in the order [`scan_file`] takes them.
fn scan_columns() -> [(&'static str, DataType); 8] {
    [
        (raw::KEY_ID, key_type()),
        (raw::TIER, DataType::UInt8),
        (raw::ROUTE_CLASS, DataType::UInt8),
        (raw::REGION, DataType::UInt16),
        (raw::VERDICT, DataType::UInt8),
        (raw::SOURCE, DataType::UInt8),
        (raw::WINDOW_QUOTA, DataType::UInt32),
        (raw::SUB_KEYS, DataType::UInt8),
    ]
}

/// Pass 1 over one file, folded into `scan`: its rows, the keys with a refusal, and each
/// key's demand.
async fn scan_file(
    store: &Arc<dyn ObjectStore>,
    file: &RawFile,
    mut scan: Scan,
) -> Result<Scan, RollupError> {
    let (builder, at) = open(store, file, &scan_columns()).await?;
    scan.rows += builder.metadata().file_metadata().num_rows().max(0) as u64;
    let schema = builder.parquet_schema().clone();
    let mut stream = builder
        .with_projection(ProjectionMask::leaves(&schema, at.iter().copied()))
        .build()
        .map_err(|e| read_error(file, e))?;
    while let Some(batch) = stream.try_next().await.map_err(|e| read_error(file, e))? {
        scan_batch(&mut scan, &batch);
    }
    Ok(scan)
}

/// Folds the rows of one batch (the columns of [`scan_columns`]) into `scan`.
fn scan_batch(scan: &mut Scan, batch: &RecordBatch) {
    let col = |name: &str| column(batch, name);
    let tier = col(raw::TIER).as_primitive::<UInt8Type>().values();
    let route = col(raw::ROUTE_CLASS).as_primitive::<UInt8Type>().values();
    let region = col(raw::REGION).as_primitive::<UInt16Type>().values();
    let verdict = col(raw::VERDICT).as_primitive::<UInt8Type>().values();
    let source = col(raw::SOURCE).as_primitive::<UInt8Type>().values();
    let quota = col(raw::WINDOW_QUOTA).as_primitive::<UInt32Type>().values();
    let sub_keys = col(raw::SUB_KEYS).as_primitive::<UInt8Type>().values();

    // The current run's key, whether it is known to be refused, and its groups so far.
    let mut current: Option<(Key, bool)> = None;
    let mut run: Vec<(u32, Demand)> = Vec::with_capacity(16);
    for (i, k) in key_ids(keys_of(batch)).enumerate() {
        let refused = match &mut current {
            Some((key, refused)) if *key == k => refused,
            _ => {
                if let Some((key, _)) = current {
                    scan.add_run(key, &mut run);
                }
                &mut current.insert((k, false)).1
            }
        };
        if verdict[i] != 0 && !*refused {
            scan.refused.insert(k);
            *refused = true;
        }
        // The limit review's decisions: the limiter's own, on Redis (0) or the fallback (1).
        if source[i] > 1 {
            continue;
        }
        let tag = packed(tier[i], route[i], region[i]);
        let q = u64::from(quota[i]) * u64::from(sub_keys[i]);
        match run.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, d)) => {
                d.requests += 1;
                d.quota = d.quota.max(q);
            }
            None => run.push((
                tag,
                Demand {
                    requests: 1,
                    quota: q,
                },
            )),
        }
    }
    if let Some((key, _)) = current {
        scan.add_run(key, &mut run);
    }
}

/// The histogram of every key's demand: per (tier, route class, region) and bucket of
/// requests over quota, the keys, their requests and the most quota any of them had.
fn demand_batch(hour: HourPartition, demand: DemandSums) -> Result<RecordBatch, RollupError> {
    let mut buckets: BTreeMap<(u32, i16), (i64, i64, u64)> = BTreeMap::new();
    for ((_, tag), d) in demand.into_sums() {
        let bucket = demand_bucket(d.requests as f64 / d.quota.max(1) as f64);
        let b = buckets.entry((tag, bucket)).or_default();
        b.0 += 1;
        b.1 += i64::try_from(d.requests).unwrap_or(i64::MAX);
        b.2 = b.2.max(d.quota);
    }
    let n = buckets.len();
    let tags = || buckets.keys().map(|(tag, _)| *tag);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMillisecondArray::from(vec![hour.start_ms(); n]).with_timezone("UTC")),
        Arc::new(UInt8Array::from_iter_values(
            tags().map(|t| (t >> 24) as u8),
        )),
        Arc::new(UInt8Array::from_iter_values(
            tags().map(|t| (t >> 16) as u8),
        )),
        Arc::new(UInt16Array::from_iter_values(tags().map(|t| t as u16))),
        Arc::new(Int16Array::from_iter_values(buckets.keys().map(|k| k.1))),
        Arc::new(Int64Array::from_iter_values(buckets.values().map(|v| v.0))),
        Arc::new(Int64Array::from_iter_values(buckets.values().map(|v| v.1))),
        Arc::new(UInt32Array::from_iter_values(
            buckets
                .values()
                .map(|v| u32::try_from(v.2).unwrap_or(u32::MAX)),
        )),
    ];
    Ok(RecordBatch::try_new(demand_hourly_schema(), columns)?)
}

/// The columns pass 2 reads, in the order [`fold_file`] takes them.
fn fold_columns() -> [(&'static str, DataType); 13] {
    [
        (raw::KEY_ID, key_type()),
        (raw::TIER, DataType::UInt8),
        (raw::ROUTE_CLASS, DataType::UInt8),
        (raw::REGION, DataType::UInt16),
        (raw::VERDICT, DataType::UInt8),
        (raw::DENIED_BY_BUCKET, DataType::Boolean),
        (raw::DENIED_BY_WINDOW, DataType::Boolean),
        (raw::SOURCE, DataType::UInt8),
        (raw::REMAINING_TOKENS, DataType::UInt32),
        (raw::REMAINING_WINDOW, DataType::UInt32),
        (
            raw::EVENT_TIME,
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
        ),
        (raw::POLICY_VERSION, DataType::Int64),
        (raw::WINDOW_QUOTA, DataType::UInt32),
    ]
}

/// Pass 2 over one file, folded into `groups`: the groups of the rows whose key is in
/// `keys`.
async fn fold_file(
    store: &Arc<dyn ObjectStore>,
    file: &RawFile,
    keys: Arc<FxHashSet<Key>>,
    mut groups: Groups,
) -> Result<Groups, RollupError> {
    let columns = fold_columns();
    let (builder, at) = open(store, file, &columns).await?;
    let schema = builder.parquet_schema().clone();
    let schema = &schema;
    let mut last: Option<(Key, bool)> = None;
    let wanted = ArrowPredicateFn::new(
        ProjectionMask::leaves(schema, [at[0]]),
        move |batch: RecordBatch| -> Result<BooleanArray, ArrowError> {
            let mut ids = key_ids(batch.column(0).as_fixed_size_binary());
            Ok(BooleanBuffer::collect_bool(batch.num_rows(), |_| {
                let k = ids.next().unwrap_or_default();
                match last {
                    Some((l, hit)) if l == k => hit,
                    _ => {
                        let hit = keys.contains(&k);
                        last = Some((k, hit));
                        hit
                    }
                }
            })
            .into())
        },
    );
    let mut stream = builder
        .with_projection(ProjectionMask::leaves(schema, at.iter().copied()))
        .with_row_filter(RowFilter::new(vec![Box::new(wanted)]))
        .build()
        .map_err(|e| read_error(file, e))?;
    while let Some(batch) = stream.try_next().await.map_err(|e| read_error(file, e))? {
        fold_batch(&mut groups, &batch);
    }
    Ok(groups)
}

/// Folds the rows of one batch (the columns of [`fold_columns`], checked when the file
/// was opened) into `groups`.
fn fold_batch(groups: &mut Groups, batch: &RecordBatch) {
    let col = |name: &str| column(batch, name);
    let ids = keys_of(batch);
    let tier = col(raw::TIER).as_primitive::<UInt8Type>().values();
    let route = col(raw::ROUTE_CLASS).as_primitive::<UInt8Type>().values();
    let region = col(raw::REGION).as_primitive::<UInt16Type>().values();
    let verdict = col(raw::VERDICT).as_primitive::<UInt8Type>().values();
    let by_bucket = col(raw::DENIED_BY_BUCKET).as_boolean();
    let by_window = col(raw::DENIED_BY_WINDOW).as_boolean();
    let source = col(raw::SOURCE).as_primitive::<UInt8Type>().values();
    let tokens = col(raw::REMAINING_TOKENS)
        .as_primitive::<UInt32Type>()
        .values();
    let window = col(raw::REMAINING_WINDOW)
        .as_primitive::<UInt32Type>()
        .values();
    let time = col(raw::EVENT_TIME)
        .as_primitive::<TimestampMillisecondType>()
        .values();
    let version = col(raw::POLICY_VERSION)
        .as_primitive::<Int64Type>()
        .values();
    let quota = col(raw::WINDOW_QUOTA).as_primitive::<UInt32Type>().values();

    groups.rows += batch.num_rows() as u64;
    let mut current: Option<(Key, u32)> = None;
    for (i, k) in key_ids(ids).enumerate() {
        let at = match current {
            Some((c, at)) if c == k => at,
            _ => {
                let at = groups.key(k);
                current = Some((k, at));
                at
            }
        };
        let acc = groups.acc(at, packed(tier[i], route[i], region[i]));
        let v = verdict[i];
        acc.allowed += u64::from(v == 0);
        acc.denied += u64::from(v == 1);
        acc.would_deny += u64::from(v == 2);
        if v != 0 {
            acc.refused += 1;
            acc.denied_by_bucket += u64::from(by_bucket.value(i));
            acc.denied_by_window += u64::from(by_window.value(i));
            acc.would_deny_by_window += u64::from(v == 2 && by_window.value(i));
            acc.first_denial = acc.first_denial.min(time[i]);
            acc.last_denial = acc.last_denial.max(time[i]);
        }
        acc.degraded += u64::from(source[i] != 0);
        acc.min_remaining_tokens = acc.min_remaining_tokens.min(tokens[i]);
        acc.min_remaining_window = acc.min_remaining_window.min(window[i]);
        acc.policy_version = acc
            .policy_version
            .max(u64::try_from(version[i]).unwrap_or(0));
        acc.window_quota = acc.window_quota.max(quota[i]);
    }
}

/// The rows as one batch of `denied_hourly`.
fn to_batch(hour: HourPartition, rows: Vec<(Key, u32, Acc)>) -> Result<RecordBatch, RollupError> {
    let n = rows.len();
    if n == 0 {
        return Ok(RecordBatch::new_empty(denied_hourly_schema()));
    }
    // Counts are `Int64` in the table (Delta has no unsigned 64-bit type); an hour's
    // count is far below 2^63.
    let u64s = |f: fn(&Acc) -> u64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(
            rows.iter()
                .map(|r| i64::try_from(f(&r.2)).unwrap_or(i64::MAX)),
        ))
    };
    let u32s = |f: fn(&Acc) -> u32| -> ArrayRef {
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| f(&r.2))))
    };
    let times = |f: fn(&Acc) -> i64| -> ArrayRef {
        Arc::new(
            TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| f(&r.2)))
                .with_timezone("UTC"),
        )
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMillisecondArray::from(vec![hour.start_ms(); n]).with_timezone("UTC")),
        Arc::new(FixedSizeBinaryArray::try_from_iter(
            rows.iter().map(|r| r.0.to_be_bytes()),
        )?),
        Arc::new(UInt8Array::from_iter_values(
            rows.iter().map(|r| (r.1 >> 24) as u8),
        )),
        Arc::new(UInt8Array::from_iter_values(
            rows.iter().map(|r| (r.1 >> 16) as u8),
        )),
        Arc::new(UInt16Array::from_iter_values(
            rows.iter().map(|r| r.1 as u16),
        )),
        u64s(|a| a.allowed),
        u64s(|a| a.denied),
        u64s(|a| a.would_deny),
        u64s(|a| a.denied_by_bucket),
        u64s(|a| a.denied_by_window),
        u64s(|a| a.would_deny_by_window),
        u64s(|a| a.degraded),
        u32s(|a| a.min_remaining_tokens),
        u32s(|a| a.min_remaining_window),
        times(|a| a.first_denial),
        times(|a| a.last_denial),
        u64s(|a| a.policy_version),
        u32s(|a| a.window_quota),
    ];
    Ok(RecordBatch::try_new(denied_hourly_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The partitioned sums equal a plain sum, across the pending lists' flushes and a
    /// merge of two tasks' sums, with every key's parts the same in both.
    #[test]
    fn partitioned_demand_sums_equal_a_plain_sum() {
        let mut want: BTreeMap<(Key, u32), Demand> = BTreeMap::new();
        let mut tasks = [DemandSums::default(), DemandSums::default()];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for i in 0..(3 * DEMAND_PENDING) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 5,000 keys in 3 groups each, so most pairs come back many times.
            let key = Key::from(x % 5_000) * 0x1_0000_0000_0000_0001;
            let tag = packed((x >> 20) as u8 % 3, 1, 0);
            let d = Demand {
                requests: 1 + (x >> 40) % 3,
                quota: (x >> 50) % 1_000,
            };
            want.entry((key, tag)).or_default().merge(&d);
            tasks[i % 2].add(key, tag, d);
        }
        let [mut one, two] = tasks;
        one.merge(two);
        let got: BTreeMap<(Key, u32), Demand> = one.into_sums().collect();
        assert_eq!(got.len(), 15_000);
        assert_eq!(got, want);
    }

    #[test]
    fn a_timestamp_in_any_time_zone_reads_as_the_event_time_and_other_types_must_match() {
        let ms = |tz: Option<&str>| DataType::Timestamp(TimeUnit::Millisecond, tz.map(Into::into));
        assert!(readable_as(&ms(Some("+00:00")), &ms(Some("UTC"))));
        assert!(readable_as(&ms(None), &ms(Some("UTC"))));
        assert!(!readable_as(
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            &ms(Some("UTC"))
        ));
        assert!(!readable_as(&DataType::UInt16, &DataType::UInt8));
        assert!(readable_as(&key_type(), &key_type()));
    }
}
