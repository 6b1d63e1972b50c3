//! The reports' first levels stored in the lake: each level's part of each closed day, as a
//! Delta table of its own under `levels/` (`levels/review_parts/date=…/review_parts-<uuid>.parquet`
//! and so on, one file per day), written by `verdict query levels` and read by every query
//! service over the lake instead of computing the part from the day's decisions.
//!
//! A stored part is the rows its level's SQL gave over one day's raw files under one policy;
//! its `add` carries the fingerprint of the three (the tag [`SOURCE_TAG`], see
//! [`crate::answers::AnswerKey::fingerprint`]). A reader takes a stored part only when the
//! fingerprint is the one it would compute now: a late file into the day, a compaction or a
//! policy change makes the stored part stale, and the reader computes the part itself (and
//! keeps it in memory) until the next `verdict query levels` replaces it. So a stored part
//! is exact, never merely recent.
//!
//! Each day is replaced in one commit (the old file removed, the new one added), a day the
//! raw table no longer holds is removed, and removed files are vacuumed after the table's
//! `delta.deletedFileRetentionDuration` (an hour), far longer than a query reads them.
//! The stored parts are an optimisation: a table that cannot be read (another schema, a
//! protocol verdict does not read) is said in the log and passed over, never a report's
//! error; so is a stored part whose file is gone. A report's plan scans the stored parts'
//! files as it runs, a batch at a time, never holding a part whole in memory (a week of the
//! review's parts at 134 M decisions is 8 M rows).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use chrono::NaiveDate;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_lake::files::encode_level_parquet;
use verdict_lake::log::data_path;
use verdict_lake::snapshot::config;
use verdict_lake::stats::file_stats;
use verdict_lake::tables::{by_date, date_partition, uuid};
use verdict_lake::{Action, Add, Clock, Commit, LakeError, Snapshot, Table, TableDef};

/// The tag of a stored part's `add` holding the fingerprint of what it was computed from.
pub const SOURCE_TAG: &str = "verdict.source";

/// The application id of the levels' commits.
pub const LEVELS_APP_ID: &str = "verdict-levels";

/// The Delta table of a level's stored parts: `name` (the level's table function), at
/// `root` (under `levels/`), rows of `schema`, partitioned by day.
pub const fn level_table(
    name: &'static str,
    root: &'static str,
    schema: fn() -> SchemaRef,
) -> TableDef {
    TableDef {
        name,
        root,
        description: "a report's first level, one part per closed day (verdict query levels)",
        schema,
        partitions: by_date,
        properties: &[
            (config::CHECKPOINT_INTERVAL, "20"),
            (config::LOG_RETENTION, "interval 7 days"),
            (config::DELETED_FILE_RETENTION, "interval 1 hours"),
        ],
    }
}

/// A level's stored part of one day: its file in the lake and what it was computed from.
#[derive(Debug, Clone)]
pub struct StoredPart {
    /// The file, from the lake's root.
    pub path: Path,
    /// Its size in bytes.
    pub size: u64,
    /// The fingerprint of its SQL, raw files and policy.
    pub source: String,
}

/// The level tables' snapshots, kept between listings and brought up to date by each
/// (the commits since, one listing of each log), so that a report does not read every
/// level's log again.
#[derive(Debug, Default)]
pub struct StoredTables {
    snapshots: tokio::sync::Mutex<HashMap<&'static str, Snapshot>>,
}

impl StoredTables {
    /// Drops the kept snapshot of the table `name` (a stored part of it could not be read:
    /// the table may have been written anew), so that the next listing reads its log whole.
    pub async fn forget(&self, name: &str) {
        self.snapshots.lock().await.remove(name);
    }

    /// Every stored part in the level `tables` of `lake` now, by table name (the level's
    /// table function) and day. A table that cannot be read is said in the log and left
    /// out.
    pub async fn parts(
        &self,
        lake: &Arc<dyn ObjectStore>,
        tables: &[TableDef],
    ) -> HashMap<(&'static str, NaiveDate), StoredPart> {
        let mut kept = self.snapshots.lock().await;
        let mut out = HashMap::new();
        for def in tables {
            let table = Table::new(Arc::clone(lake), def.root);
            let updated = match kept.remove(def.name) {
                Some(mut s) => table.update(&mut s).await.map(|()| Some(s)),
                None => table.snapshot_if_any().await,
            };
            let snapshot = match updated {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(table = def.root, error = %e, "the stored parts of a level cannot be read; the reports compute them");
                    continue;
                }
            };
            if let Err(e) = def.check_schema(snapshot.metadata()) {
                tracing::warn!(table = def.root, error = %e, "the stored parts of a level are of another schema; the reports compute them");
                continue;
            }
            let root = Path::from(def.root);
            for add in snapshot.files() {
                let day = add
                    .partition_values
                    .get("date")
                    .and_then(|d| d.as_deref())
                    .and_then(|d| NaiveDate::parse_from_str(d, "%Y-%m-%d").ok());
                let source = add
                    .tags
                    .as_ref()
                    .and_then(|t| t.get(SOURCE_TAG).cloned().flatten());
                if let (Some(day), Some(source)) = (day, source) {
                    out.insert(
                        (def.name, day),
                        StoredPart {
                            path: data_path(&root, &add.path),
                            size: u64::try_from(add.size).unwrap_or(0),
                            source,
                        },
                    );
                }
            }
            kept.insert(def.name, snapshot);
        }
        out
    }
}

/// Writes `batches`, a level's part of `day` computed from what `source` fingerprints, as
/// the day's one file in the level's `table` (one commit replacing the day's file); the
/// file's path.
pub async fn write_part(
    lake: &Arc<dyn ObjectStore>,
    clock: &Clock,
    table: &TableDef,
    day: NaiveDate,
    source: &str,
    batches: &[RecordBatch],
) -> Result<Path, StoredError> {
    let schema = (table.schema)();
    let body = encode_level_parquet(&schema, &by_key(&schema, batches)?)?;
    let dir = format!("date={}/", day.format("%Y-%m-%d"));
    let name = format!("{dir}{}-{}.parquet", table.name, uuid());
    let path = data_path(&Path::from(table.root), &name);
    let size = i64::try_from(body.len()).unwrap_or(i64::MAX);
    lake.put(&path, PutPayload::from(body)).await?;
    let add = Add {
        path: name,
        partition_values: date_partition(day),
        size,
        modification_time: clock.now_ms(),
        data_change: true,
        stats: Some(file_stats(batches, &table.partition_names())),
        tags: Some(BTreeMap::from([(
            SOURCE_TAG.to_owned(),
            Some(source.to_owned()),
        )])),
    };
    table
        .replace(lake, clock, LEVELS_APP_ID, vec![(dir, add)], None)
        .await?;
    Ok(path)
}

/// `batches` as one batch sorted by key id, then tier and route class, for a level with a
/// key id (the others as they are): a random 16-byte id does not compress, but beside the
/// same key's other rows it takes half the bytes (a review level of 294,221 rows, 80,000
/// keys: 2.0 MB sorted against 4.8 MB).
fn by_key(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, StoredError> {
    let Ok(key) = schema.index_of("key_id") else {
        return Ok(batches.to_vec());
    };
    let all = arrow::compute::concat_batches(schema, batches)?;
    let order: Vec<arrow::compute::SortColumn> = std::iter::once(key)
        .chain(
            ["tier", "route_class"]
                .iter()
                .filter_map(|c| schema.index_of(c).ok()),
        )
        .map(|i| arrow::compute::SortColumn {
            values: Arc::clone(all.column(i)),
            options: None,
        })
        .collect();
    let indices = arrow::compute::lexsort_to_indices(&order, None)?;
    Ok(vec![arrow::compute::take_record_batch(&all, &indices)?])
}

/// Removes `days` from a level's table `def` in one commit (days the raw table no longer
/// holds), then deletes the files removed longer ago than the table keeps them; how many
/// days were removed and files deleted.
pub async fn remove_days(
    lake: &Arc<dyn ObjectStore>,
    clock: &Clock,
    def: &TableDef,
    days: &[NaiveDate],
) -> Result<(usize, usize), StoredError> {
    let table = def.table_at(Arc::clone(lake), Arc::clone(clock));
    let Some(mut snapshot) = table.snapshot_if_any().await? else {
        return Ok((0, 0));
    };
    let now_ms = table.now_ms();
    let removes: Vec<Action> = days
        .iter()
        .flat_map(|day| {
            snapshot
                .files_in(&date_partition(*day))
                .map(|old| Action::Remove(old.remove(now_ms, true)))
                .collect::<Vec<_>>()
        })
        .collect();
    if !removes.is_empty() {
        let commit = Commit::new("DELETE", removes)
            .with_parameter("predicate", "the raw table no longer holds the day")
            .reading(days.iter().map(|d| date_partition(*d)).collect());
        table.commit(&mut snapshot, commit).await?;
    }
    let plan = verdict_lake::vacuum::plan(&table, &snapshot, None, now_ms).await?;
    let deleted = verdict_lake::vacuum::run(&table, &plan).await?;
    Ok((days.len(), deleted))
}

/// Why a stored part could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoredError {
    /// The lake refused.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The table's log refused.
    #[error("{0}")]
    Lake(#[from] LakeError),
    /// The rows could not be written as Parquet.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused the rows.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The rows could not be encoded.
    #[error("encoding: {0}")]
    Encode(#[from] verdict_lake::files::EncodeError),
}
