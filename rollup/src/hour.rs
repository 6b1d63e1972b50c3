//! Rolling up one hour: the raw files a reader takes (see [`crate::sources`]) are grouped
//! as [`ROLLUP_SQL`] defines (by [`crate::fold`], an aggregation written for the raw
//! layout that gives the same rows), and the result becomes one Parquet file of the
//! `denied_hourly` Delta table,
//! `rollup/denied_hourly/date=…/hour=…/denied_hourly-<uuid>.parquet`, with the hour's
//! `demand_hourly` file beside it (see [`crate::demand`]).
//!
//! An hour is replaced in one commit per table: the `remove` of the files the hour had and
//! the `add` of its new file, so a reader sees the old rollup or the new one, never half
//! of one or both, and a query planned before keeps reading the old file (vacuum leaves it
//! an hour). The rows are ordered by the group key and depend only on the raw files read,
//! so a re-run over the same raw version writes the same rows. The job that rolls hours up
//! as data arrives ([`Rollup::commit_hours`] with a [`Progress`]) records in each table a
//! `txn` whose version is the raw table's version it read: the next run looks only at the
//! raw commits after it, and two runs at once cannot both commit.

use std::sync::Arc;

use arrow::array::{RecordBatch, TimestampMillisecondArray};
use arrow::datatypes::SchemaRef;
use datafusion::datasource::file_format::options::ParquetReadOptions;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::{SessionConfig, SessionContext};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_lake::log::data_path;
use verdict_lake::stats::file_stats;
use verdict_lake::tables::{DEMAND_HOURLY, DENIED_HOURLY, date_partition};
use verdict_lake::{Add, Clock, PartitionValues, Snapshot, TableDef};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::tables::{denied_hourly_schema, raw_schema};

use crate::error::RollupError;
use crate::output::conform;
use crate::sources::{HourFiles, hour_files};
use verdict_lake::files::encode_rollup_parquet;

/// The start of a histogram file's name inside its hour folder.
pub const DEMAND_FILE: &str = "demand_hourly";

/// The rollup of the table `raw`, one row per (key, tier, route class, region) with at
/// least one denial or would-deny. Plain SQL that DuckDB runs unchanged (the benchmark
/// compares the two on the same files); the columns are those of `denied_hourly` after
/// `hour`, in order, and are cast to its types when written.
///
/// The groups with a refusal are found first (a scan of few columns, few rows match) and
/// only their rows are aggregated: about 2 % of keys are ever refused, so most rows skip
/// the twelve aggregates. On one peak hour this took DataFusion from 7.2 s to 3.1 s;
/// [`crate::fold`] computes the same rows in the same two steps, in less than half that.
pub const ROLLUP_SQL: &str = "\
WITH refused AS (
  SELECT DISTINCT key_id, tier, route_class, region FROM raw WHERE verdict <> 0
)
SELECT r.key_id, r.tier, r.route_class, r.region,
  COUNT(*) FILTER (WHERE verdict = 0) AS allowed,
  COUNT(*) FILTER (WHERE verdict = 1) AS denied,
  COUNT(*) FILTER (WHERE verdict = 2) AS would_deny,
  COUNT(*) FILTER (WHERE verdict <> 0 AND denied_by_bucket) AS denied_by_bucket,
  COUNT(*) FILTER (WHERE verdict <> 0 AND denied_by_window) AS denied_by_window,
  COUNT(*) FILTER (WHERE verdict = 2 AND denied_by_window) AS would_deny_by_window,
  COUNT(*) FILTER (WHERE source <> 0) AS degraded,
  MIN(remaining_tokens) AS min_remaining_tokens,
  MIN(remaining_window) AS min_remaining_window,
  MIN(event_time) FILTER (WHERE verdict <> 0) AS first_denial,
  MAX(event_time) FILTER (WHERE verdict <> 0) AS last_denial,
  MAX(policy_version) AS policy_version,
  MAX(window_quota) AS window_quota
FROM raw r
JOIN refused f
  ON r.key_id = f.key_id AND r.tier = f.tier AND r.route_class = f.route_class
  AND r.region = f.region
GROUP BY r.key_id, r.tier, r.route_class, r.region
ORDER BY r.key_id, r.tier, r.route_class, r.region";

/// The start of a rollup file's name inside its hour folder.
pub const ROLLUP_FILE: &str = "denied_hourly";

/// The `txn` application of the rollup job in `denied_hourly` and `demand_hourly`: its
/// version is the raw table's version the job has rolled up to.
pub const ROLLUP_APP_ID: &str = "verdict-rollup:raw";

/// `add` tag: the raw table's version the file was computed from.
pub const TAG_RAW_VERSION: &str = "verdict.rawVersion";
/// `add` tag: how many raw files it was computed from.
pub const TAG_SOURCE_FILES: &str = "verdict.sourceFiles";
/// `add` tag: how many raw events it summarises.
pub const TAG_EVENTS: &str = "verdict.events";

/// What rolling up one hour did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupReport {
    /// The hour.
    pub hour: HourPartition,
    /// Raw files read.
    pub source_files: usize,
    /// Their bytes.
    pub source_bytes: u64,
    /// The raw table's version the files were taken from.
    pub raw_version: i64,
    /// Raw events summarised.
    pub events: u64,
    /// Rows of the rollup (groups with a denial or would-deny).
    pub rows: usize,
    /// Bytes of the rollup file.
    pub bytes: usize,
    /// Where it was written.
    pub path: Path,
    /// Rows of the demand histogram written beside it (see [`crate::demand`]).
    pub demand_rows: usize,
    /// Bytes of the demand histogram file.
    pub demand_bytes: usize,
    /// The `denied_hourly` version whose commit put the hour in (`None` until committed).
    pub version: Option<i64>,
}

/// What the `denied_hourly` table holds for an hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupState {
    /// The raw table's version it was computed from.
    pub raw_version: i64,
    /// Raw events it summarises.
    pub events: u64,
    /// Its rows.
    pub rows: i64,
    /// Its bytes.
    pub bytes: u64,
    /// Its file, relative to the table's root.
    pub path: String,
}

/// One hour rolled up and its two files written, not yet committed.
#[derive(Debug, Clone)]
pub struct HourRollup {
    /// What was computed and written.
    pub report: RollupReport,
    denied: Add,
    demand: Add,
}

/// The rollup job's progress a commit carries: the raw version it read, and the versions
/// each table held for [`ROLLUP_APP_ID`] when the job looked (the commit is refused if
/// another run has moved them since).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The raw table's version every hour of the commit was read from.
    pub raw_version: i64,
    /// `denied_hourly`'s progress when the job read it.
    pub denied_expected: Option<i64>,
    /// `demand_hourly`'s progress when the job read it.
    pub demand_expected: Option<i64>,
}

/// The folder of an hour's files in the tables partitioned by `date`, relative to the
/// table's root, with its trailing `/`.
pub fn hour_dir(hour: &HourPartition) -> String {
    format!("{}/", hour.partition_path())
}

/// The URL under which the store is known to DataFusion.
const STORE_URL: &str = "verdict://lake";

/// Rolls hours up from one object store (the lake: `raw/` and `rollup/` side by side).
#[derive(Clone)]
pub struct Rollup {
    ctx: SessionContext,
    store: Arc<dyn ObjectStore>,
    threads: usize,
    clock: Clock,
}

impl Rollup {
    /// A rollup over `store`, reading `threads` raw files at a time and using as many
    /// partitions for queries (the machine's cores).
    pub fn new(store: Arc<dyn ObjectStore>, threads: usize) -> Self {
        let config = SessionConfig::new()
            .with_target_partitions(threads.max(1))
            .with_information_schema(false);
        let ctx = SessionContext::new_with_config(config);
        let url = ObjectStoreUrl::parse(STORE_URL).expect("a constant, valid store URL");
        ctx.register_object_store(url.as_ref(), Arc::clone(&store));
        Self {
            ctx,
            store,
            threads: threads.max(1),
            clock: Arc::new(verdict_schemas::SystemClock),
        }
    }

    /// The same rollup reading the time from `clock`: its files and commits are stamped
    /// with it.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The store it reads and writes.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The clock it stamps its files and commits with.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Rolls `hour` up from the raw table's latest snapshot and replaces it in both
    /// tables (the job's `txn` progress is left as it is: this is the on-demand re-run).
    pub async fn run_hour(&self, hour: HourPartition) -> Result<RollupReport, RollupError> {
        let files = hour_files(&self.store, &hour).await?;
        let written = self.write_hour(hour, &files).await?;
        let mut reports = self.commit_hours(vec![written], None).await?;
        Ok(reports.remove(0))
    }

    /// Rolls `hour` up from `files` and writes its `denied_hourly` and `demand_hourly`
    /// files, uncommitted (a reader does not see them; if no commit follows, vacuum
    /// deletes them as orphans).
    pub async fn write_hour(
        &self,
        hour: HourPartition,
        files: &HourFiles,
    ) -> Result<HourRollup, RollupError> {
        // The fold checks every raw file (one of another schema is refused by column), so
        // it runs first.
        let crate::fold::Folded {
            denied: batch,
            demand,
            events,
        } = self.compute(hour, files).await?;
        let now = self.clock.now_ms();
        let tags = [
            (TAG_RAW_VERSION, files.version.to_string()),
            (TAG_SOURCE_FILES, files.files.len().to_string()),
            (TAG_EVENTS, events.to_string()),
        ];
        let dir = hour_dir(&hour);
        let day = date_partition(hour.date());
        let demand_add = self
            .put_file(&DEMAND_HOURLY, &dir, DEMAND_FILE, &demand, &tags, &day, now)
            .await?;
        let denied_add = self
            .put_file(&DENIED_HOURLY, &dir, ROLLUP_FILE, &batch, &tags, &day, now)
            .await?;
        let report = RollupReport {
            hour,
            source_files: files.files.len(),
            source_bytes: files.bytes(),
            raw_version: files.version,
            events,
            rows: batch.num_rows(),
            bytes: usize::try_from(denied_add.size).unwrap_or(0),
            path: data_path(&Path::from(DENIED_HOURLY.root), &denied_add.path),
            demand_rows: demand.num_rows(),
            demand_bytes: usize::try_from(demand_add.size).unwrap_or(0),
            version: None,
        };
        Ok(HourRollup {
            report,
            denied: denied_add,
            demand: demand_add,
        })
    }

    /// Writes `batch` as a new file `<dir><stem>-<uuid>.parquet` of `table` in the
    /// partition `partition`, and returns its `add`.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_file(
        &self,
        table: &TableDef,
        dir: &str,
        stem: &str,
        batch: &RecordBatch,
        tags: &[(&str, String)],
        partition: &PartitionValues,
        now_ms: i64,
    ) -> Result<Add, RollupError> {
        let body = encode_rollup_parquet(batch)?;
        let name = format!("{dir}{stem}-{}.parquet", verdict_lake::tables::uuid());
        let size = body.len() as i64;
        self.store
            .put(
                &data_path(&Path::from(table.root), &name),
                PutPayload::from(body),
            )
            .await?;
        Ok(Add {
            path: name,
            partition_values: partition.clone(),
            size,
            modification_time: now_ms,
            data_change: true,
            stats: Some(file_stats(
                std::slice::from_ref(batch),
                &table.partition_names(),
            )),
            tags: Some(
                tags.iter()
                    .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
                    .collect(),
            ),
        })
    }

    /// Commits hours written by [`Self::write_hour`]: one commit to `demand_hourly`, then
    /// one to `denied_hourly`, each removing the files those hours had and adding the new
    /// ones, and, with `progress`, moving the job's `txn` to the raw version read. A
    /// concurrent commit adding files to the same days, or another run's progress, makes
    /// the commit fail with a conflict (the files written stay, orphans for vacuum).
    pub async fn commit_hours(
        &self,
        hours: Vec<HourRollup>,
        progress: Option<Progress>,
    ) -> Result<Vec<RollupReport>, RollupError> {
        if hours.is_empty() && progress.is_none() {
            return Ok(Vec::new());
        }
        let txn = |expected| progress.map(|p| (expected, p.raw_version));
        let demand: Vec<(String, Add)> = hours
            .iter()
            .map(|h| (hour_dir(&h.report.hour), h.demand.clone()))
            .collect();
        DEMAND_HOURLY
            .replace(
                &self.store,
                &self.clock,
                ROLLUP_APP_ID,
                demand,
                txn(progress.and_then(|p| p.demand_expected)),
            )
            .await?;
        let denied: Vec<(String, Add)> = hours
            .iter()
            .map(|h| (hour_dir(&h.report.hour), h.denied.clone()))
            .collect();
        let version = DENIED_HOURLY
            .replace(
                &self.store,
                &self.clock,
                ROLLUP_APP_ID,
                denied,
                txn(progress.and_then(|p| p.denied_expected)),
            )
            .await?;
        Ok(hours
            .into_iter()
            .map(|h| {
                let mut r = h.report;
                r.version = Some(version);
                tracing::info!(
                    hour = %r.hour.partition_path(),
                    raw_version = r.raw_version,
                    source_files = r.source_files,
                    events = r.events,
                    rows = r.rows,
                    bytes = r.bytes,
                    demand_rows = r.demand_rows,
                    version,
                    "rollup committed"
                );
                r
            })
            .collect())
    }

    /// The rollup and the demand histogram of `files`, and the number of raw events read:
    /// [`crate::fold`], the aggregation written for the raw layout.
    pub async fn compute(
        &self,
        hour: HourPartition,
        files: &HourFiles,
    ) -> Result<crate::fold::Folded, RollupError> {
        let started = std::time::Instant::now();
        let out = crate::fold::rollup_files(&self.store, hour, &files.files, self.threads).await?;
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            files = files.files.len(),
            "rollup computed"
        );
        Ok(out)
    }

    /// The `denied_hourly` rows of [`Self::compute`], by DataFusion running [`ROLLUP_SQL`]:
    /// the rollup's definition, which the tests hold the aggregation to.
    pub async fn compute_sql(
        &self,
        hour: HourPartition,
        files: &HourFiles,
    ) -> Result<(RecordBatch, u64), RollupError> {
        let schema = denied_hourly_schema();
        if files.files.is_empty() {
            return Ok((RecordBatch::new_empty(schema), 0));
        }
        let paths: Vec<&Path> = files.files.iter().map(|f| &f.meta.location).collect();
        let ctx = self.session_over("raw", &paths, &raw_schema()).await?;
        let counted = ctx.sql("SELECT COUNT(*) FROM raw").await?.collect().await?;
        let events = counted
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
            })
            .map_or(0, |a| a.value(0).max(0) as u64);
        let batches = ctx.sql(ROLLUP_SQL).await?.collect().await?;
        let start = hour.start_ms();
        let batch = conform(&schema, &batches, |rows| {
            Arc::new(TimestampMillisecondArray::from(vec![start; rows]).with_timezone("UTC"))
        })?;
        Ok((batch, events))
    }

    /// A session of its own (sharing the runtime: the object store registry, memory pool
    /// and caches) in which `table` is exactly the Parquet objects `paths` of the store,
    /// read with `schema`. Listing is left to the caller, which picks the files a reader
    /// takes.
    pub async fn session_over(
        &self,
        table: &str,
        paths: &[&Path],
        schema: &SchemaRef,
    ) -> Result<SessionContext, RollupError> {
        let ctx =
            SessionContext::new_with_config_rt(self.ctx.copied_config(), self.ctx.runtime_env());
        let urls: Vec<String> = paths.iter().map(|p| format!("{STORE_URL}/{p}")).collect();
        let df = ctx
            .read_parquet(urls, ParquetReadOptions::default().schema(schema))
            .await?;
        ctx.register_table(table, df.into_view())?;
        Ok(ctx)
    }

    /// What `denied_hourly` holds for `hour` now; `None` when the hour has not been
    /// rolled up.
    pub async fn state(&self, hour: HourPartition) -> Result<Option<RollupState>, RollupError> {
        let table = DENIED_HOURLY.table(Arc::clone(&self.store));
        Ok(table
            .snapshot_if_any()
            .await?
            .and_then(|s| state_in(&s, &hour)))
    }
}

/// What `snapshot` (of `denied_hourly`) holds for `hour`.
pub fn state_in(snapshot: &Snapshot, hour: &HourPartition) -> Option<RollupState> {
    let dir = hour_dir(hour);
    let add = snapshot.files_under(&dir).next()?;
    let tag = |k: &str| -> Option<i64> {
        add.tags
            .as_ref()
            .and_then(|t| t.get(k).cloned().flatten())
            .and_then(|v| v.parse().ok())
    };
    Some(RollupState {
        raw_version: tag(TAG_RAW_VERSION).unwrap_or(-1),
        events: tag(TAG_EVENTS).map_or(0, |e| e.max(0).unsigned_abs()),
        rows: add
            .num_records()
            .map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)),
        bytes: u64::try_from(add.size).unwrap_or(0),
        path: add.path.clone(),
    })
}
