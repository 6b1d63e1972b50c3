//! Rolling up one hour: the raw files a reader takes (see [`crate::sources`]) are grouped
//! as [`ROLLUP_SQL`] defines (by [`crate::fold`], an aggregation written for the raw
//! layout that gives the same rows), and the result becomes one Parquet object,
//! `rollup/denied_hourly/date=…/hour=…/denied_hourly.parquet`.
//!
//! One object per hour is what makes a re-run safe: a PUT replaces an object whole, so a
//! reader sees the old rollup or the new one, never half of one or both. The rows are
//! ordered by the group key, and the file records in its footer which raw files it was
//! computed from (a fingerprint of their names and sizes), so the late-data job can tell
//! when the hour has changed since.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, TimestampMillisecondArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use datafusion::datasource::file_format::options::ParquetReadOptions;
use datafusion::error::DataFusionError;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::{SessionConfig, SessionContext};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{KeyValue, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::tables::{denied_hourly_schema, raw_schema};

use crate::sources::{HourFiles, hour_files};

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

/// The rollup object's name inside its hour folder.
pub const ROLLUP_FILE: &str = "denied_hourly.parquet";

/// Footer key: the fingerprint of the raw files the rollup was computed from.
pub const META_SOURCE_FINGERPRINT: &str = "verdict.rollup.source_fingerprint";
/// Footer key: how many raw files it was computed from.
pub const META_SOURCE_FILES: &str = "verdict.rollup.source_files";
/// Footer key: how many raw events it summarises.
pub const META_EVENTS: &str = "verdict.rollup.events";

/// Why a rollup failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RollupError {
    /// Listing, reading or writing the store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The raw table's log could not be read.
    #[error(transparent)]
    Lake(#[from] verdict_lake::LakeError),
    /// The query failed (an unreadable raw file, for example).
    #[error("query: {0}")]
    Query(#[from] DataFusionError),
    /// The result did not fit the rollup schema.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Encoding the rollup file, or reading an existing one's footer, failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A raw file could not be read, or lacks a column of the raw table.
    #[error("raw file {path}: {reason}")]
    RawFile {
        /// The object path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// A task reading raw files panicked or was cancelled.
    #[error("rollup task: {0}")]
    Task(String),
}

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
    /// Bytes of the rollup object.
    pub bytes: usize,
    /// Where it was written.
    pub path: Path,
    /// The fingerprint of the raw files read.
    pub fingerprint: String,
    /// Rows of the demand histogram written beside it (see [`crate::demand`]).
    pub demand_rows: usize,
    /// Bytes of the demand histogram object.
    pub demand_bytes: usize,
}

/// What an existing rollup object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupState {
    /// The fingerprint of the raw files it was computed from.
    pub fingerprint: String,
    /// Raw events it summarises.
    pub events: u64,
    /// Its rows.
    pub rows: i64,
    /// Its bytes.
    pub bytes: u64,
}

/// The URL under which the store is known to DataFusion.
const STORE_URL: &str = "verdict://lake";

/// Rolls hours up from one object store (the lake: `raw/` and `rollup/` side by side).
#[derive(Clone)]
pub struct Rollup {
    ctx: SessionContext,
    store: Arc<dyn ObjectStore>,
    threads: usize,
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
        }
    }

    /// The store it reads and writes.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Rolls `hour` up from the files a reader takes now and replaces its rollup object.
    pub async fn run_hour(&self, hour: HourPartition) -> Result<RollupReport, RollupError> {
        let files = hour_files(&self.store, &hour).await?;
        // The fold checks every raw file (one of another schema is refused by column), so
        // it runs first; the demand histogram is written before the denied rollup, so a
        // denied rollup that is there (what the late-data job looks at) has its histogram.
        let (batch, events) = self.compute(hour, &files).await?;
        let demand = self.compute_demand(hour, &files).await?;
        let demand_body = encode_parquet(&demand, &[])?;
        let demand_bytes = demand_body.len();
        self.store
            .put(
                &crate::demand::demand_path(&hour),
                PutPayload::from(demand_body),
            )
            .await?;
        let fingerprint = files.fingerprint();
        let body = encode(&batch, &fingerprint, files.files.len(), events)?;
        let path = rollup_path(&hour);
        let bytes = body.len();
        self.store.put(&path, PutPayload::from(body)).await?;
        let report = RollupReport {
            hour,
            source_files: files.files.len(),
            source_bytes: files.bytes(),
            raw_version: files.version,
            events,
            rows: batch.num_rows(),
            bytes,
            path,
            fingerprint,
            demand_rows: demand.num_rows(),
            demand_bytes,
        };
        tracing::info!(
            hour = %hour.partition_path(),
            source_files = report.source_files,
            events = report.events,
            rows = report.rows,
            bytes = report.bytes,
            demand_rows = report.demand_rows,
            "rollup written"
        );
        Ok(report)
    }

    /// The rollup of `files` as one batch in the `denied_hourly` schema, and the number of
    /// raw events read: [`crate::fold`], the aggregation written for the raw layout.
    pub async fn compute(
        &self,
        hour: HourPartition,
        files: &HourFiles,
    ) -> Result<(RecordBatch, u64), RollupError> {
        let started = std::time::Instant::now();
        let out = crate::fold::rollup_files(&self.store, hour, &files.files, self.threads).await?;
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            files = files.files.len(),
            "rollup computed"
        );
        Ok(out)
    }

    /// The same as [`Self::compute`], by DataFusion running [`ROLLUP_SQL`]: the rollup's
    /// definition, which the tests hold the aggregation to.
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

    /// Reads what the rollup object of `hour` says about itself; `None` when the hour has
    /// not been rolled up.
    pub async fn state(&self, hour: HourPartition) -> Result<Option<RollupState>, RollupError> {
        let Some(f) = read_footer(self.store.as_ref(), &rollup_path(&hour)).await? else {
            return Ok(None);
        };
        let get = |key: &str| f.meta.get(key).cloned().unwrap_or_default();
        Ok(Some(RollupState {
            fingerprint: get(META_SOURCE_FINGERPRINT),
            events: get(META_EVENTS).parse().unwrap_or(0),
            rows: f.rows,
            bytes: f.bytes,
        }))
    }
}

/// Where the rollup of `hour` lives.
pub fn rollup_path(hour: &HourPartition) -> Path {
    Path::from(format!("{}/{ROLLUP_FILE}", hour.denied_hourly_prefix()))
}

/// The writer settings of rollup files: zstd, statistics per page, rows sorted by key.
pub fn writer_properties(meta: Vec<KeyValue>) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_key_value_metadata(Some(meta))
        .build()
}

fn encode(
    batch: &RecordBatch,
    fingerprint: &str,
    files: usize,
    events: u64,
) -> Result<Bytes, RollupError> {
    encode_parquet(
        batch,
        &[
            (META_SOURCE_FINGERPRINT, fingerprint.to_owned()),
            (META_SOURCE_FILES, files.to_string()),
            (META_EVENTS, events.to_string()),
        ],
    )
}

/// One Parquet object holding `batch`, with `meta` in its footer, written with
/// [`writer_properties`].
pub fn encode_parquet(batch: &RecordBatch, meta: &[(&str, String)]) -> Result<Bytes, RollupError> {
    let meta = meta
        .iter()
        .map(|(k, v)| KeyValue::new((*k).to_owned(), v.clone()))
        .collect();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(writer_properties(meta)))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(out))
}

/// What a Parquet object's footer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// Its key-value metadata.
    pub meta: BTreeMap<String, String>,
    /// Its rows.
    pub rows: i64,
    /// The object's size.
    pub bytes: u64,
}

/// Reads the footer of the Parquet object at `path`; `None` when there is no such object.
/// (Rollup and overage objects are small: the whole object is read.)
pub async fn read_footer(
    store: &dyn ObjectStore,
    path: &Path,
) -> Result<Option<Footer>, RollupError> {
    let body = match store.get(path).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let parsed = ParquetMetaDataReader::new().parse_and_finish(&body)?;
    let file = parsed.file_metadata();
    let meta = file
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter_map(|e| Some((e.key.clone(), e.value.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(Footer {
        meta,
        rows: file.num_rows(),
        bytes: body.len() as u64,
    }))
}

/// The result of a query as one batch of `schema`: its first column made by `lead` (a
/// constant, given the row count), the others the query's columns in order, cast to the
/// schema's types.
pub fn conform(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    lead: impl FnOnce(usize) -> ArrayRef,
) -> Result<RecordBatch, RollupError> {
    let Some(first) = batches.first() else {
        return Ok(RecordBatch::new_empty(Arc::clone(schema)));
    };
    let grouped = concat_batches(&first.schema(), batches)?;
    let mut columns = vec![lead(grouped.num_rows())];
    for (field, column) in schema.fields().iter().skip(1).zip(grouped.columns()) {
        columns.push(cast(column, field.data_type())?);
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}
