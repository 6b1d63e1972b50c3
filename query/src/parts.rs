//! The reports' kept parts: a report over the raw decisions reads its first level from parts
//! computed once per day and kept, through the level's table function (`review_parts(from,
//! to)` and the like). The levels themselves are the reports' (see
//! [`crate::reports::levels`]): this module keeps any [`Level`] it is given.
//!
//! The first levels of the reports over raw decisions are nearly all of their work: seconds
//! for the limit review over a week, for a page that analysts open again and again over
//! ranges that overlap. Each [`Level`] is one report's first level, which merges across
//! midnights: the range is cut at midnights (UTC) into pieces; each piece's rows are
//! computed from the decisions, unfiltered (one part serves every filter), and kept for the
//! same SQL reading the same files under the same policy (the rules of [`crate::answers`]:
//! a flush, a compaction or a late event into a day is another list of files, so that day's
//! part is computed again). The report then merges the parts' rows, which is exact: what
//! lies below the merged level (a key's hour, the bucket's span) lies within one piece.
//!
//! A part is computed when a query first needs it, inside the query's own session (its
//! memory pool and deadline), or beforehand by [`Parts::warm_day`], which `verdict query serve`
//! runs in the background for every closed day the raw table holds, at start and then
//! periodically, so that the page's first load finds the week's parts kept.
//!
//! The files a query's parts were computed from are listed by the plan's [`PartsExec`], so
//! an answer kept for the report's SQL (see [`crate::answers`]) is dropped when they change.
//! Every report keeps a portable statement too ([`crate::reports::Form::Portable`]), which
//! reads the decisions all the way, as DuckDB does in the benchmark, with the same rows.

use std::fmt;
use std::sync::{Arc, Weak};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::HashMap;

use chrono::{DateTime, Duration, NaiveDate, Timelike, Utc};
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::{MemTable, MemorySourceConfig};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, SessionState, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use datafusion::prelude::SessionContext;

use datafusion::execution::object_store::ObjectStoreUrl;
use futures::StreamExt;
use verdict_schemas::layout::{
    HourPartition, RAW_PREFIX, RECONCILE_ROUNDS_PREFIX, parse_date_segment, parse_hour_segment,
};

use crate::answers::{AnswerKey, Answers, describe};
use crate::range::{Range, hours, literal, parse_time, pieces};
use crate::stored::StoredPart;
use crate::tables::{LAKE_URL, PoliciesTable};
use object_store::{ObjectStore, ObjectStoreExt};
use verdict_lake::{Clock, TableDef};

/// One report's first level, kept in parts: its table function, its columns and the SQL of
/// one piece. The reports define theirs (`crate::reports::levels`); the parts know nothing
/// else of them.
#[derive(Debug, Clone, Copy)]
pub struct Level {
    /// Its table function's name in SQL (`review_parts`).
    pub function: &'static str,
    /// The columns of its rows, as [`columns`] reads them (`tier u8, key_id key, …`).
    pub columns: &'static str,
    /// The SQL of its rows over the decisions within the first range, unfiltered, so that
    /// one part serves every filter, for a part of the second range (a piece, never
    /// crossing a midnight; the first is the piece itself or one of its hours). What holds
    /// over the whole part (whether the reconcile ran) is read over the second.
    pub sql: fn(&Range, &Range) -> String,
    /// How its rows merge, when a part is best computed an hour at a time and folded (its
    /// rows per key: memory for an hour's decisions rather than the day's); `None`: a part is
    /// computed at once.
    pub fold: Option<Fold>,
    /// What its parts are computed from.
    pub source: Source,
}

/// What a level's parts are computed from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// The raw decisions. `verdict query levels` stores the parts of closed days in this
    /// table of the lake (see [`crate::stored`]).
    Decisions(TableDef),
    /// A table of the rollup, under this root (`rollup/demand_hourly/`), whose rows are
    /// hourly already: a day is one file or 24 small ones, so a part is cheap to compute and
    /// kept, never stored. Its first column is the `date` each row is of: the parts of many
    /// days are computed in one statement and cut by it.
    Rollup(&'static str),
}

/// How a level's rows merge: grouped by `group`, `aggregates` over them, in the level's
/// column order (`SUM(requests) AS requests, MAX(demand) AS demand, …`). Exact because what
/// lies below the level's row (a key's hour, a bucket's span) lies within one hour.
#[derive(Debug, Clone, Copy)]
pub struct Fold {
    /// The columns the rows are grouped by (`tier, route_class, key_id`).
    pub group: &'static str,
    /// The aggregates of the other columns, each named as its column.
    pub aggregates: &'static str,
}

impl Level {
    /// Its table in the lake, where its parts of closed days are stored; none for a level of
    /// the rollup.
    pub fn stored(&self) -> Option<&TableDef> {
        match &self.source {
            Source::Decisions(table) => Some(table),
            Source::Rollup(_) => None,
        }
    }

    /// The schema of its rows.
    pub fn schema(&self) -> SchemaRef {
        columns(self.columns)
    }

    /// The call of its table function over `range`, as a report's SQL reads it.
    pub fn call(&self, range: &Range) -> String {
        format!(
            "{}('{}', '{}')",
            self.function,
            literal(range.from),
            literal(range.to)
        )
    }
}

/// A schema of nullable columns, as a level's rows have them, from `name type` pairs
/// separated by commas; the types: `u8`, `u16`, `u32`, `i32`, `i64`, `f64`, `date`, `time`
/// (UTC milliseconds), `key` (16 bytes).
pub fn columns(spec: &str) -> SchemaRef {
    let field = |column: &str| {
        let (name, kind) = column.trim().split_once(' ').unwrap_or((column, ""));
        let t = match kind {
            "u8" => DataType::UInt8,
            "u16" => DataType::UInt16,
            "u32" => DataType::UInt32,
            "i32" => DataType::Int32,
            "i64" => DataType::Int64,
            "f64" => DataType::Float64,
            "date" => DataType::Date32,
            "time" => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            "key" => DataType::FixedSizeBinary(16),
            other => panic!("level column {column:?}: no type {other:?}"),
        };
        Field::new(name, t, true)
    };
    Arc::new(Schema::new(spec.split(',').map(field).collect::<Vec<_>>()))
}

/// The kept parts.
#[derive(Debug)]
pub struct Parts {
    kept: Answers,
    /// The rollup levels' parts, apart: cheap to compute again, they never push out a part
    /// of the decisions (see [`ROLLUP_SHARE`]).
    rollup_kept: Answers,
    /// Raw bytes a part is computed from at once (see [`compute`]).
    block_bytes: u64,
    policies: Arc<PoliciesTable>,
    /// The levels of the decisions: warmed, and stored by `verdict query levels`.
    levels: &'static [Level],
    /// The levels of the rollup: computed when a query first needs them, then kept.
    rollup_levels: &'static [Level],
    /// The lake, where the levels' stored parts are (see [`crate::stored`]).
    lake: Arc<dyn ObjectStore>,
    /// The levels' tables there.
    stored: crate::stored::StoredTables,
    /// The parts being computed, or held by a plan, by their key's fingerprint: a part
    /// several scans ask for (the sampled review reads its level three times in one plan,
    /// and DataFusion plans them at once) is computed once, whether or not it is kept.
    shared: std::sync::Mutex<HashMap<String, Weak<SharedPart>>>,
    /// Parts computed from the decisions since the start.
    computed: std::sync::atomic::AtomicU64,
}

/// The rollup levels' parts are kept in a quarter of the bytes the decisions' parts may
/// hold, on top of them.
const ROLLUP_SHARE: usize = 4;

/// A part computed once for every scan that asks for it while one holds it.
type SharedPart = tokio::sync::OnceCell<Vec<RecordBatch>>;

/// What a warming did (see `Engine::warm_parts`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Warmed {
    /// Days whose parts were all kept already.
    pub kept: usize,
    /// Days with a part found stored in the lake (the plans read it), none computed.
    pub read: usize,
    /// Days with a part computed.
    pub computed: usize,
    /// The newest closed day the raw table holds (none when it holds none).
    pub newest: Option<chrono::NaiveDate>,
}

/// How the parts of a query came to be (see [`Parts::parts`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Made {
    /// Parts found stored in the lake (a plan scans their files).
    pub read: usize,
    /// Parts computed from the decisions.
    pub computed: usize,
}

/// A level's rows over some pieces, as [`Parts::parts`] found them.
#[derive(Debug, Default)]
pub struct Found {
    /// The rows held in memory: parts kept, and parts computed now.
    pub batches: Vec<RecordBatch>,
    /// The stored parts to read (a plan scans their files).
    pub stored: Vec<StoredPart>,
    /// The files the parts were computed from (path, size, time and tag).
    pub files: Vec<String>,
    /// How many parts were found stored and how many computed.
    pub made: Made,
    /// The parts computed now, held while the plan that reads them lives, so that the
    /// plan's other scans of them find them (see `Parts::shared`).
    pub held: Vec<Arc<SharedPart>>,
}

/// What `verdict query levels` did (see `Engine::write_levels`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LevelsWritten {
    /// Level × day parts written (missing or stale before).
    pub written: usize,
    /// Level × day parts already stored for the day's files and policy.
    pub unchanged: usize,
    /// Level × day parts removed: the raw table no longer holds the day.
    pub removed: usize,
    /// Files of earlier parts deleted (removed longer ago than the tables keep them).
    pub deleted: usize,
}

/// What the parts are kept under: the policy, and the raw table's files by day, each with
/// its hour, as one listing of a session's view of the lake found them.
#[derive(Debug)]
pub struct Listing {
    policy: Option<Arc<verdict_limiter::PolicySnapshot>>,
    /// Each day's raw files: hour, description ([`describe`]) and size in bytes.
    by_day: HashMap<NaiveDate, Vec<(u8, String, u64)>>,
    /// The files of the reconcile's rounds, by day: the review counts a key's need by
    /// whether the reconcile ran, so a day's part is computed again when its rounds change.
    rounds_by_day: HashMap<NaiveDate, Vec<String>>,
    /// The levels' stored parts, by level and day.
    stored: HashMap<(&'static str, NaiveDate), StoredPart>,
    /// A rollup table's files by day, each with its hour (none for a day compacted into
    /// one file), as [`Parts::rollup_listing`] found them; empty in a listing of the
    /// decisions.
    rollup: HashMap<NaiveDate, Vec<(Option<u8>, String)>>,
}

impl Listing {
    /// The days the raw table holds, newest first.
    pub fn days(&self) -> Vec<NaiveDate> {
        let mut days: Vec<NaiveDate> = self.by_day.keys().copied().collect();
        days.sort_unstable_by(|a, b| b.cmp(a));
        days
    }

    /// The raw files of `piece`'s hours (it never crosses a midnight): hour, description and
    /// size.
    fn raw(&self, piece: &Range) -> impl Iterator<Item = &(u8, String, u64)> {
        let hours = piece.from.hour()..=(piece.to - Duration::milliseconds(1)).hour();
        self.by_day
            .get(&piece.from.date_naive())
            .into_iter()
            .flatten()
            .filter(move |(hour, _, _)| hours.contains(&u32::from(*hour)))
    }

    /// The raw files of `piece`'s hours, then the files of its day's reconcile rounds; none
    /// when it has no raw files.
    fn files(&self, piece: &Range) -> Vec<String> {
        let mut files: Vec<String> = self.raw(piece).map(|(_, file, _)| file.clone()).collect();
        if !files.is_empty() {
            let day = piece.from.date_naive();
            files.extend(self.rounds_by_day.get(&day).into_iter().flatten().cloned());
        }
        files
    }

    /// The rollup table's files of `piece`'s hours (it never crosses a midnight): a day
    /// compacted into one file gives that file.
    fn rollup_files(&self, piece: &Range) -> Vec<String> {
        let hours = piece.from.hour()..=(piece.to - Duration::milliseconds(1)).hour();
        self.rollup
            .get(&piece.from.date_naive())
            .into_iter()
            .flatten()
            .filter(|(hour, _)| hour.is_none_or(|h| hours.contains(&u32::from(h))))
            .map(|(_, file)| file.clone())
            .collect()
    }

    /// The bytes of the raw files of `piece`'s hours.
    fn raw_bytes(&self, piece: &Range) -> u64 {
        self.raw(piece).map(|(_, _, size)| size).sum()
    }
}

impl Parts {
    /// Keeps up to `max_bytes` of the parts of `levels` (of the decisions) and of
    /// `rollup_levels` (0: none; every report computes its parts), under the policy of
    /// `policies`, reading stored parts from `lake`.
    pub fn new(
        max_bytes: usize,
        block_bytes: u64,
        policies: Arc<PoliciesTable>,
        levels: &'static [Level],
        rollup_levels: &'static [Level],
        lake: Arc<dyn ObjectStore>,
    ) -> Self {
        Self {
            kept: Answers::new(max_bytes),
            rollup_kept: Answers::new(max_bytes / ROLLUP_SHARE),
            block_bytes,
            policies,
            levels,
            rollup_levels,
            lake,
            stored: crate::stored::StoredTables::default(),
            shared: std::sync::Mutex::new(HashMap::new()),
            computed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Parts computed from the decisions since the start (every level and piece).
    pub fn computed(&self) -> u64 {
        self.computed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The part of `fingerprint` being computed or held by a plan, or a new one to compute.
    fn shared_part(&self, fingerprint: String) -> Arc<SharedPart> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.retain(|_, part| part.strong_count() > 0);
        if let Some(part) = shared.get(&fingerprint).and_then(Weak::upgrade) {
            return part;
        }
        let part = Arc::new(SharedPart::new());
        shared.insert(fingerprint, Arc::downgrade(&part));
        part
    }

    /// What parts computed in `ctx` now are kept under. The policy is read first: a part
    /// computed while the policy changes is kept under the old one, and so computed again
    /// under the new; likewise a part computed from files committed after the listing.
    pub async fn listing(&self, ctx: &SessionContext) -> DfResult<Listing> {
        let policy = self.policies.snapshot().await?;
        let url = ObjectStoreUrl::parse(LAKE_URL)?;
        let store = ctx.runtime_env().object_store(&url)?;
        let mut listed = store.list(Some(&object_store::path::Path::from(RAW_PREFIX)));
        let mut by_day: HashMap<NaiveDate, Vec<(u8, String, u64)>> = HashMap::new();
        while let Some(meta) = listed.next().await {
            let meta = meta?;
            if let Ok(hour) = HourPartition::from_path(meta.location.as_ref()) {
                by_day.entry(hour.date()).or_default().push((
                    hour.hour(),
                    describe(&meta),
                    meta.size,
                ));
            }
        }
        for files in by_day.values_mut() {
            files.sort_unstable();
        }
        let mut rounds_by_day: HashMap<NaiveDate, Vec<String>> = HashMap::new();
        for (day, files) in by_day_listed(store.as_ref(), RECONCILE_ROUNDS_PREFIX).await? {
            let mut files: Vec<String> = files.into_iter().map(|(_, file)| file).collect();
            files.sort_unstable();
            rounds_by_day.insert(day, files);
        }
        let tables: Vec<TableDef> = self
            .levels
            .iter()
            .filter_map(|l| l.stored())
            .copied()
            .collect();
        let stored = self.stored.parts(&self.lake, &tables).await;
        Ok(Listing {
            policy,
            by_day,
            rounds_by_day,
            stored,
            rollup: HashMap::new(),
        })
    }

    /// What the parts of a rollup table's level computed in `ctx` now are kept under: the
    /// table's files under `root` by day, as the session's view of the lake lists them (its
    /// snapshot). Not the policy: the rollup's rows do not depend on it.
    pub async fn rollup_listing(&self, ctx: &SessionContext, root: &str) -> DfResult<Listing> {
        let url = ObjectStoreUrl::parse(LAKE_URL)?;
        let store = ctx.runtime_env().object_store(&url)?;
        let rollup = by_day_listed(store.as_ref(), root).await?;
        Ok(Listing {
            policy: None,
            by_day: HashMap::new(),
            rounds_by_day: HashMap::new(),
            stored: HashMap::new(),
            rollup,
        })
    }

    /// The rows of `level` in each of `pieces` (none crossing a midnight), in `ctx`: kept,
    /// or read from the part stored for the same files and policy, or computed, and kept;
    /// with the files they were computed from, and how many were read and computed.
    ///
    /// A part is kept under the raw files of its hours in `listing` (finding a kept part
    /// plans nothing), so a commit into another hour of the day leaves a part of closed
    /// hours kept.
    pub async fn parts(
        &self,
        ctx: &SessionContext,
        level: &Level,
        pieces: &[Range],
        listing: &Listing,
    ) -> DfResult<Found> {
        if let Source::Rollup(_) = level.source {
            return self.rollup_parts(ctx, level, pieces, listing).await;
        }
        let schema = level.schema();
        let mut found = Found::default();
        for piece in pieces {
            let piece_files = listing.files(piece);
            // No files in those hours: no rows, nothing to plan.
            if piece_files.is_empty() {
                continue;
            }
            let sql = (level.sql)(piece, piece);
            let key = AnswerKey::new(&sql, piece_files.clone(), listing.policy.clone());
            found.files.extend(piece_files);
            if let Some((body, _)) = self.kept.get(&key) {
                found.batches.extend(decode(body)?);
                continue;
            }
            if let Some(stored) = self.stored_part(level, piece, &key, listing).await {
                found.made.read += 1;
                found.stored.push(stored);
                continue;
            }
            let shared = self.shared_part(key.fingerprint());
            let part = shared
                .get_or_try_init::<DataFusionError, _, _>(|| async {
                    found.made.computed += 1;
                    self.computed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let part = compute(ctx, level, piece, listing, self.block_bytes).await?;
                    if self.kept.enabled() {
                        let rows = part.iter().map(RecordBatch::num_rows).sum();
                        self.kept.put(key, encode(&schema, &part)?, rows);
                    }
                    DfResult::Ok(part)
                })
                .await?;
            found.batches.extend(part.iter().cloned());
            found.held.push(shared);
        }
        Ok(found)
    }

    /// The rows of a rollup table's `level` in each of `pieces`, in `ctx`: kept, or computed
    /// and kept. The parts not kept are computed in one statement over the range from the
    /// first of them to the last, and cut by their `date`: a range of five years never
    /// kept is one scan of the table, not one per day.
    async fn rollup_parts(
        &self,
        ctx: &SessionContext,
        level: &Level,
        pieces: &[Range],
        listing: &Listing,
    ) -> DfResult<Found> {
        let schema = level.schema();
        let mut found = Found::default();
        let mut missing: Vec<(Range, AnswerKey)> = Vec::new();
        for piece in pieces {
            let piece_files = listing.rollup_files(piece);
            if piece_files.is_empty() {
                continue;
            }
            let key = AnswerKey::new(&(level.sql)(piece, piece), piece_files.clone(), None);
            found.files.extend(piece_files);
            match self.rollup_kept.get(&key) {
                Some((body, _)) => found.batches.extend(decode(body)?),
                None => missing.push((*piece, key)),
            }
        }
        let (Some((first, _)), Some((last, _))) = (missing.first(), missing.last()) else {
            return Ok(found);
        };
        let span = Range {
            from: first.from,
            to: last.to,
        };
        let mut by_day = by_date(
            &schema,
            rows(ctx, &(level.sql)(&span, &span), &schema).await?,
        )?;
        for (piece, key) in missing {
            let part = by_day.remove(&piece.from.date_naive()).unwrap_or_default();
            found.made.computed += 1;
            self.computed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.rollup_kept.enabled() {
                let rows = part.iter().map(RecordBatch::num_rows).sum();
                self.rollup_kept.put(key, encode(&schema, &part)?, rows);
            }
            found.batches.extend(part);
        }
        Ok(found)
    }

    /// `level`'s part of `piece` as stored in the lake, when `piece` is a whole day and the
    /// stored part was computed from what `key` names, for the plan to read (it is never
    /// held in memory whole: a week of the review's parts at 134 M decisions is 8 M rows);
    /// a stored part whose file is gone is said in the log and computed instead.
    async fn stored_part(
        &self,
        level: &Level,
        piece: &Range,
        key: &AnswerKey,
        listing: &Listing,
    ) -> Option<StoredPart> {
        let day = whole_day(piece)?;
        let table = level.stored()?;
        let stored = listing
            .stored
            .get(&(table.name, day))
            .filter(|s| s.source == key.fingerprint())?;
        match self.lake.head(&stored.path).await {
            Ok(_) => Some(stored.clone()),
            Err(e) => {
                tracing::warn!(path = %stored.path, error = %e, "a stored part cannot be read; computing it");
                self.stored.forget(table.name).await;
                None
            }
        }
    }

    /// Makes sure every level's part of the whole `day` is kept in memory or stored in the
    /// lake (a stored part is read by the plans that need it, not here), computing the
    /// others, in `ctx` under `listing`; how many were found stored and computed.
    pub async fn warm_day(
        &self,
        ctx: &SessionContext,
        day: NaiveDate,
        listing: &Listing,
    ) -> DfResult<Made> {
        let Some(piece) = day_range(day) else {
            return Ok(Made::default());
        };
        let started = std::time::Instant::now();
        let mut made = Made::default();
        for level in self.levels {
            let m = self.parts(ctx, level, &[piece], listing).await?.made;
            made.read += m.read;
            made.computed += m.computed;
        }
        if made.computed + made.read > 0 {
            tracing::info!(
                %day,
                computed = made.computed,
                read = made.read,
                ms = started.elapsed().as_millis() as u64,
                "kept the reports' parts of a day"
            );
        }
        Ok(made)
    }

    /// Stores in `lake` every level's part of the whole `day` that is not stored for the
    /// day's files and policy, in `ctx` under `listing`: how many were written and found
    /// unchanged (see [`crate::stored`]).
    pub async fn store_day(
        &self,
        ctx: &SessionContext,
        day: NaiveDate,
        listing: &Listing,
        lake: &Arc<dyn ObjectStore>,
        clock: &Clock,
    ) -> DfResult<LevelsWritten> {
        let mut done = LevelsWritten::default();
        let Some(piece) = day_range(day) else {
            return Ok(done);
        };
        for level in self.levels {
            let Some(table) = level.stored() else {
                continue;
            };
            let piece_files = listing.files(&piece);
            if piece_files.is_empty() {
                continue;
            }
            let sql = (level.sql)(&piece, &piece);
            let source = AnswerKey::new(&sql, piece_files, listing.policy.clone()).fingerprint();
            if listing
                .stored
                .get(&(table.name, day))
                .is_some_and(|s| s.source == source)
            {
                done.unchanged += 1;
                continue;
            }
            let started = std::time::Instant::now();
            let found = self.parts(ctx, level, &[piece], listing).await?;
            if !found.stored.is_empty() {
                // Stored for these files and policy since the listing was read.
                done.unchanged += 1;
                continue;
            }
            let part = found.batches;
            let path = crate::stored::write_part(lake, clock, table, day, &source, &part)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            tracing::info!(
                %day,
                level = level.function,
                rows = part.iter().map(RecordBatch::num_rows).sum::<usize>(),
                %path,
                ms = started.elapsed().as_millis() as u64,
                "stored a level's part of a day"
            );
            done.written += 1;
        }
        Ok(done)
    }

    /// Removes from `lake` the stored parts of the days the raw table no longer holds (see
    /// [`crate::stored::remove_days`]).
    pub async fn remove_stored(
        &self,
        listing: &Listing,
        lake: &Arc<dyn ObjectStore>,
        clock: &Clock,
    ) -> DfResult<LevelsWritten> {
        let mut done = LevelsWritten::default();
        for table in self.levels.iter().filter_map(Level::stored) {
            let gone: Vec<NaiveDate> = listing
                .stored
                .keys()
                .filter(|(f, day)| *f == table.name && !listing.by_day.contains_key(day))
                .map(|(_, day)| *day)
                .collect();
            let (removed, deleted) = crate::stored::remove_days(lake, clock, table, &gone)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            done.removed += removed;
            done.deleted += deleted;
        }
        Ok(done)
    }

    /// Registers each level's table function in `ctx`, reading and keeping parts here.
    pub fn register(self: &Arc<Self>, ctx: &SessionContext) {
        for level in self.levels.iter().chain(self.rollup_levels) {
            ctx.register_udtf(
                level.function,
                Arc::new(PartsFunction {
                    level: *level,
                    parts: Arc::clone(self),
                }),
            );
        }
    }
}

/// `level`'s rows of `piece`, computed in `ctx`: at once when the piece's raw files hold
/// at most `block_bytes` ([`crate::limits::PART_BLOCK_BYTES`] by default) or the level
/// does not fold; else in blocks of whole hours of about that many bytes (the hours
/// `listing` has files of), each folded into the rows so far.
async fn compute(
    ctx: &SessionContext,
    level: &Level,
    piece: &Range,
    listing: &Listing,
    block_bytes: u64,
) -> DfResult<Vec<RecordBatch>> {
    let schema = level.schema();
    let blocks = blocks(piece, listing, block_bytes);
    let fold = match level.fold {
        Some(fold) if blocks.len() > 1 => fold,
        _ => return rows(ctx, &(level.sql)(piece, piece), &schema).await,
    };
    // The merge runs in a session of its own, on the query's memory pool and settings: its
    // table is no one else's.
    let scratch = SessionContext::new_with_config_rt(
        ctx.copied_config()
            .with_create_default_catalog_and_schema(true),
        ctx.runtime_env(),
    );
    let merge = format!(
        "SELECT {group}, {aggregates} FROM folded GROUP BY {group}",
        group = fold.group,
        aggregates = fold.aggregates
    );
    let mut folded: Vec<RecordBatch> = Vec::new();
    for block in blocks {
        let block_rows = rows(ctx, &(level.sql)(&block, piece), &schema).await?;
        if folded.is_empty() {
            folded = block_rows;
            continue;
        }
        folded.extend(block_rows);
        let table = MemTable::try_new(Arc::clone(&schema), vec![std::mem::take(&mut folded)])?;
        scratch.register_table("folded", Arc::new(table))?;
        let merged = rows(&scratch, &merge, &schema).await;
        scratch.deregister_table("folded")?;
        folded = merged?;
    }
    Ok(folded)
}

/// `piece` cut into blocks of whole hours with raw files in `listing`, each of at most
/// `bytes` of them (or one hour, if that hour alone holds more); hours without files are
/// left out.
fn blocks(piece: &Range, listing: &Listing, bytes: u64) -> Vec<Range> {
    let mut out: Vec<(Range, u64)> = Vec::new();
    for hour in hours(piece) {
        let size = listing.raw_bytes(&hour);
        if size == 0 {
            continue;
        }
        match out.last_mut() {
            Some((block, held)) if block.to == hour.from && *held + size <= bytes => {
                block.to = hour.to;
                *held += size;
            }
            _ => out.push((hour, size)),
        }
    }
    out.into_iter().map(|(block, _)| block).collect()
}

/// The rows `sql` answers in `ctx`, with `schema`'s types.
async fn rows(ctx: &SessionContext, sql: &str, schema: &SchemaRef) -> DfResult<Vec<RecordBatch>> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await?
        .into_iter()
        .map(|b| conform(schema, b))
        .collect()
}

/// The objects under `prefix` in a `date=…` folder, by day, each with the hour of its
/// `hour=…` folder if it is in one and its description ([`describe`]), sorted.
async fn by_day_listed(
    store: &dyn ObjectStore,
    prefix: &str,
) -> DfResult<HashMap<NaiveDate, Vec<(Option<u8>, String)>>> {
    let mut listed = store.list(Some(&object_store::path::Path::from(prefix)));
    let mut by_day: HashMap<NaiveDate, Vec<(Option<u8>, String)>> = HashMap::new();
    while let Some(meta) = listed.next().await {
        let meta = meta?;
        let segments = || meta.location.parts();
        let Some(day) = segments().find_map(|p| parse_date_segment(p.as_ref())) else {
            continue;
        };
        let hour = segments().find_map(|p| parse_hour_segment(p.as_ref()));
        by_day.entry(day).or_default().push((hour, describe(&meta)));
    }
    for files in by_day.values_mut() {
        files.sort_unstable();
    }
    Ok(by_day)
}

/// `batches` cut by the date of their first column (a rollup level's `date`).
fn by_date(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> DfResult<HashMap<NaiveDate, Vec<RecordBatch>>> {
    let mut out: HashMap<NaiveDate, Vec<RecordBatch>> = HashMap::new();
    for batch in batches {
        let dates = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::Date32Array>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "a rollup level's first column is not a date: {}",
                    schema.field(0)
                ))
            })?;
        let mut rows: HashMap<NaiveDate, Vec<u32>> = HashMap::new();
        for i in 0..dates.len() {
            let day = (!arrow::array::Array::is_null(dates, i))
                .then(|| dates.value_as_date(i))
                .flatten()
                .ok_or_else(|| {
                    DataFusionError::Internal("a rollup level's row without a date".into())
                })?;
            rows.entry(day).or_default().push(i as u32);
        }
        for (day, indices) in rows {
            let indices = arrow::array::UInt32Array::from(indices);
            out.entry(day)
                .or_default()
                .push(arrow::compute::take_record_batch(&batch, &indices)?);
        }
    }
    Ok(out)
}

/// The range of the whole `day`.
fn day_range(day: NaiveDate) -> Option<Range> {
    let from = day.and_hms_opt(0, 0, 0)?.and_utc();
    Some(Range {
        from,
        to: from + Duration::days(1),
    })
}

/// The day `piece` is, when it is a whole day.
fn whole_day(piece: &Range) -> Option<NaiveDate> {
    let day = piece.from.date_naive();
    (day_range(day)? == *piece).then_some(day)
}

/// `batch` with `schema`'s types (an engine rule may widen an integer on the way).
fn conform(schema: &SchemaRef, batch: RecordBatch) -> DfResult<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(Arc::clone(column))
            } else {
                arrow::compute::cast(column, field.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

fn encode(schema: &SchemaRef, batches: &[RecordBatch]) -> DfResult<Bytes> {
    let mut out = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    Ok(Bytes::from(out))
}

fn decode(body: Bytes) -> DfResult<Vec<RecordBatch>> {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)?;
    Ok(reader.collect::<Result<Vec<_>, _>>()?)
}

/// A level's table function, `review_parts(from, to)` and the like: two times (RFC 3339, or
/// as the reports take them).
#[derive(Debug)]
struct PartsFunction {
    level: Level,
    parts: Arc<Parts>,
}

impl TableFunctionImpl for PartsFunction {
    fn call_with_args(
        &self,
        args: datafusion::catalog::TableFunctionArgs,
    ) -> DfResult<Arc<dyn TableProvider>> {
        let function = self.level.function;
        let time = |i: usize, name: &str| -> DfResult<DateTime<Utc>> {
            match args.exprs().get(i) {
                Some(Expr::Literal(ScalarValue::Utf8(Some(text)), _)) => parse_time(name, text)
                    .map_err(|e| DataFusionError::Plan(format!("{function}: {e}"))),
                _ => Err(DataFusionError::Plan(format!(
                    "{function} takes two times as text, from and to, such as \
                     {function}('2026-11-23', '2026-11-30')"
                ))),
            }
        };
        if args.exprs().len() != 2 {
            return Err(DataFusionError::Plan(format!(
                "{function} takes two arguments (from, to), not {}",
                args.exprs().len()
            )));
        }
        let (from, to) = (time(0, "from")?, time(1, "to")?);
        if from >= to {
            return Err(DataFusionError::Plan(format!(
                "{function}: the range is empty ({from} is not before {to})"
            )));
        }
        Ok(Arc::new(PartsTable {
            level: self.level,
            range: Range { from, to },
            parts: Arc::clone(&self.parts),
        }))
    }
}

/// A level's parts of one range, as a table.
#[derive(Debug)]
struct PartsTable {
    level: Level,
    range: Range,
    parts: Arc<Parts>,
}

#[async_trait]
impl TableProvider for PartsTable {
    fn schema(&self) -> SchemaRef {
        self.level.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!("{} outside a session", self.level.function))
            })?;
        // The query's own session: its memory pool, its view of the lake (time travel too).
        let ctx = SessionContext::new_with_state(state.clone());
        let threads = state.config().target_partitions().max(1);
        let mut partitions = vec![Vec::new(); threads];
        let listing = match self.level.source {
            Source::Decisions(_) => self.parts.listing(&ctx).await?,
            Source::Rollup(root) => self.parts.rollup_listing(&ctx, root).await?,
        };
        let found = self
            .parts
            .parts(&ctx, &self.level, &pieces(self.range), &listing)
            .await?;
        for (i, batch) in found.batches.into_iter().enumerate() {
            partitions[i % threads].push(batch);
        }
        let schema = self.level.schema();
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = vec![MemorySourceConfig::try_new_exec(
            &partitions,
            Arc::clone(&schema),
            projection.cloned(),
        )?];
        if !found.stored.is_empty() {
            // The stored parts' files, read as the plan runs: a batch at a time, in as many
            // groups as the session has threads.
            let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); threads];
            for (i, part) in found.stored.iter().enumerate() {
                groups[i % threads].push(PartitionedFile::new(part.path.to_string(), part.size));
            }
            let config = FileScanConfigBuilder::new(
                ObjectStoreUrl::parse(LAKE_URL)?,
                Arc::new(ParquetSource::new(Arc::clone(&schema))),
            )
            .with_file_groups(
                groups
                    .into_iter()
                    .filter(|g| !g.is_empty())
                    .map(FileGroup::new)
                    .collect(),
            )
            .with_projection_indices(projection.cloned())?
            .build();
            inputs.push(DataSourceExec::from_data_source(config));
        }
        let inner = UnionExec::try_new(inputs)?;
        let files = found.files;
        Ok(Arc::new(PartsExec {
            inner,
            files,
            _held: found.held,
        }))
    }
}

/// The kept parts of a query, and the files they were computed from.
#[derive(Debug)]
pub struct PartsExec {
    inner: Arc<dyn ExecutionPlan>,
    files: Vec<String>,
    /// The parts computed for this plan, for its other scans (see `Parts::shared`).
    _held: Vec<Arc<SharedPart>>,
}

impl PartsExec {
    /// The files the parts were computed from (path, size, time and tag).
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// The plan that reads the parts: the kept ones from memory, the stored ones' files.
    pub fn inner(&self) -> &Arc<dyn ExecutionPlan> {
        &self.inner
    }
}

impl DisplayAs for PartsExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PartsExec: parts of {} files", self.files.len())
    }
}

impl ExecutionPlan for PartsExec {
    fn name(&self) -> &'static str {
        "PartsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.inner.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.inner.execute(partition, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Date32Array, Int64Array};
    use arrow::datatypes::Date32Type;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn a_rollup_levels_rows_are_cut_by_their_date() {
        let schema = columns("date date, keys i64");
        let days = |d: &[&str]| -> Vec<i32> {
            d.iter()
                .map(|t| Date32Type::from_naive_date(day(t)))
                .collect()
        };
        let batch = |d: &[&str], keys: Vec<i64>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Date32Array::from(days(d))),
                    Arc::new(Int64Array::from(keys)),
                ],
            )
            .unwrap()
        };
        let cut = by_date(
            &schema,
            vec![
                batch(&["2026-11-01", "2026-11-02", "2026-11-01"], vec![1, 2, 3]),
                batch(&["2026-11-02"], vec![4]),
            ],
        )
        .unwrap();
        let keys = |d: &str| -> Vec<i64> {
            cut[&day(d)]
                .iter()
                .flat_map(|b| {
                    let a = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                    (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
                })
                .collect()
        };
        assert_eq!(cut.len(), 2);
        assert_eq!(keys("2026-11-01"), vec![1, 3]);
        assert_eq!(keys("2026-11-02"), vec![2, 4]);

        // A row without a date is an error, not a row lost.
        let undated = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Date32Array::from(vec![None::<i32>])),
                Arc::new(Int64Array::from(vec![1])),
            ],
        )
        .unwrap();
        assert!(by_date(&schema, vec![undated]).is_err());
    }

    #[test]
    fn a_rollup_days_files_are_those_of_the_pieces_hours_or_the_days_one() {
        let t = |text: &str| crate::range::parse_time("t", text).unwrap();
        let listing = Listing {
            policy: None,
            by_day: HashMap::new(),
            rounds_by_day: HashMap::new(),
            stored: HashMap::new(),
            rollup: [
                (
                    day("2026-11-01"),
                    vec![(None, "date=2026-11-01/day.parquet".to_string())],
                ),
                (
                    day("2026-11-02"),
                    (0..24u8)
                        .map(|h| (Some(h), format!("date=2026-11-02/hour={h:02}/h.parquet")))
                        .collect(),
                ),
            ]
            .into(),
        };
        let piece = |from: &str, to: &str| Range {
            from: t(from),
            to: t(to),
        };
        assert_eq!(
            listing.rollup_files(&piece("2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z")),
            vec!["date=2026-11-01/day.parquet"]
        );
        assert_eq!(
            listing.rollup_files(&piece("2026-11-02T05:30:00Z", "2026-11-02T07:00:00Z")),
            vec![
                "date=2026-11-02/hour=05/h.parquet",
                "date=2026-11-02/hour=06/h.parquet"
            ]
        );
        assert_eq!(
            listing
                .rollup_files(&piece("2026-11-02T00:00:00Z", "2026-11-03T00:00:00Z"))
                .len(),
            24
        );
        assert!(
            listing
                .rollup_files(&piece("2026-11-03T00:00:00Z", "2026-11-04T00:00:00Z"))
                .is_empty()
        );
    }
}
