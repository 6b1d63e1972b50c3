//! verdict's five tables: where each lives, how it is partitioned, its properties.
//!
//! | table | root | partition columns | the log keeps |
//! | --- | --- | --- | --- |
//! | `raw` | `raw/` | `date`, `hour` (files in `date=…/hour=…/`) | 7 days, the table's own window |
//! | `denied_hourly` | `rollup/denied_hourly/` | `date` (files in `date=…/hour=…/`; the hour is the `hour` column; a day past the raw window, final, compacted into one file in `date=…/`) | 30 days |
//! | `demand_hourly` | `rollup/demand_hourly/` | `date` (likewise) | 30 days |
//! | `overage` | `overage/` | `date` (also a column of the files) | 30 days |
//! | `reconcile_rounds` | `reconcile_rounds/` | `date` (also a column of the files) | 30 days |
//!
//! A removed file's bytes stay an hour (`delta.deletedFileRetentionDuration`): far longer
//! than the query service lets a query run, so a query planned before a compaction or a
//! rollup's replacement finishes on the files it planned with.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, SchemaRef};
use object_store::ObjectStore;
use rand::RngCore;
use verdict_schemas::layout::{
    DEMAND_HOURLY_PREFIX, DENIED_HOURLY_PREFIX, OVERAGE_PREFIX, RAW_PREFIX, RECONCILE_ROUNDS_PREFIX,
};
use verdict_schemas::tables::{
    demand_hourly_schema, denied_hourly_schema, overage_schema, raw_schema, reconcile_rounds_schema,
};

use verdict_schemas::HourPartition;

use crate::action::{Action, Add, Metadata, PartitionValues};
use crate::schema::{delta_type, schema_string};
use crate::snapshot::{Snapshot, config};
use crate::table::{Clock, Commit, LakeError, Table};

/// A partition column: its name and Arrow type (`Date32` or `Int32`).
pub type PartitionColumn = (&'static str, DataType);

/// One of verdict's tables.
#[derive(Debug, Clone, Copy)]
pub struct TableDef {
    /// Its name in SQL and in the log's metadata.
    pub name: &'static str,
    /// Its root in the lake.
    pub root: &'static str,
    /// What it holds.
    pub description: &'static str,
    /// The schema of its files.
    pub schema: fn() -> SchemaRef,
    /// Its partition columns.
    pub partitions: fn() -> Vec<PartitionColumn>,
    /// Table properties.
    pub properties: &'static [(&'static str, &'static str)],
}

fn date_hour() -> Vec<PartitionColumn> {
    vec![("date", DataType::Date32), ("hour", DataType::Int32)]
}

/// A file directly in the partition folder `dir` is inside of (`date=…/` for
/// `date=…/hour=…/`), which holds the whole partition: what compaction makes of a final day.
fn partition_file_above(snapshot: &Snapshot, dir: &str) -> Option<String> {
    let inner = dir.strip_suffix('/').unwrap_or(dir);
    let (partition, _) = inner.split_once('/')?;
    // `dir` up to and with the partition's `/`.
    let partition = &dir[..=partition.len()];
    snapshot
        .files_under(partition)
        .find(|a| !a.path[partition.len()..].contains('/'))
        .map(|a| a.path.clone())
}

/// The partitions of a table partitioned by day: `date`.
pub fn by_date() -> Vec<PartitionColumn> {
    vec![("date", DataType::Date32)]
}

/// The raw decisions, one row per decision, 7 days. The ingest commits about once a
/// second per worker, so it checkpoints every 100 commits.
pub const RAW: TableDef = TableDef {
    name: "raw",
    root: RAW_PREFIX,
    description: "verdict decisions, one row per rate-limit decision (7 days)",
    schema: raw_schema,
    partitions: date_hour,
    properties: &[
        (config::CHECKPOINT_INTERVAL, "100"),
        (config::LOG_RETENTION, "interval 7 days"),
        (config::DELETED_FILE_RETENTION, "interval 1 hours"),
    ],
};

/// The hourly rollup of the keys that were refused, 5 years.
pub const DENIED_HOURLY: TableDef = TableDef {
    name: "denied_hourly",
    root: DENIED_HOURLY_PREFIX,
    description: "per hour x key x tier x route class x region with a refusal (5 years)",
    schema: denied_hourly_schema,
    partitions: by_date,
    properties: &[
        (config::CHECKPOINT_INTERVAL, "24"),
        (config::LOG_RETENTION, "interval 30 days"),
        (config::DELETED_FILE_RETENTION, "interval 1 hours"),
    ],
};

/// The hourly histogram of per-key demand, 5 years.
pub const DEMAND_HOURLY: TableDef = TableDef {
    name: "demand_hourly",
    root: DEMAND_HOURLY_PREFIX,
    description: "per hour x tier x route class x region, keys by level of demand (5 years)",
    schema: demand_hourly_schema,
    partitions: by_date,
    properties: DENIED_HOURLY.properties,
};

/// Per key per day, requests over the hourly quota, for pricing.
pub const OVERAGE: TableDef = TableDef {
    name: "overage",
    root: OVERAGE_PREFIX,
    description: "per key per day, requests refused over the hourly quota (pricing)",
    schema: overage_schema,
    partitions: by_date,
    properties: &[
        (config::CHECKPOINT_INTERVAL, "10"),
        (config::LOG_RETENTION, "interval 30 days"),
        (config::DELETED_FILE_RETENTION, "interval 1 hours"),
    ],
};

/// The regional reconcile's rounds, one row each with the settings it ran with (a few
/// thousand rows a day, appended a few rounds at a time).
pub const RECONCILE_ROUNDS: TableDef = TableDef {
    name: "reconcile_rounds",
    root: RECONCILE_ROUNDS_PREFIX,
    description: "one row per round of the regional reconcile, with its settings",
    schema: reconcile_rounds_schema,
    partitions: by_date,
    properties: &[
        (config::CHECKPOINT_INTERVAL, "100"),
        (config::LOG_RETENTION, "interval 30 days"),
        (config::DELETED_FILE_RETENTION, "interval 1 hours"),
    ],
};

/// Every table, in the order the query service lists them.
pub const ALL: [&TableDef; 5] = [
    &RAW,
    &DENIED_HOURLY,
    &DEMAND_HOURLY,
    &OVERAGE,
    &RECONCILE_ROUNDS,
];

/// The partition values of an hour in the raw table: `date`, `hour`.
pub fn hour_partition(hour: &HourPartition) -> PartitionValues {
    [
        (
            "date".to_string(),
            Some(hour.date().format("%Y-%m-%d").to_string()),
        ),
        ("hour".to_string(), Some(hour.hour().to_string())),
    ]
    .into()
}

/// The partition values of a day in the tables partitioned by `date`.
pub fn date_partition(date: chrono::NaiveDate) -> PartitionValues {
    [(
        "date".to_string(),
        Some(date.format("%Y-%m-%d").to_string()),
    )]
    .into()
}

/// A random (version 4) UUID, as text: a table's id, or a data file's unique name.
pub fn uuid() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl TableDef {
    /// The partition columns' names.
    pub fn partition_names(&self) -> Vec<&'static str> {
        (self.partitions)().into_iter().map(|(n, _)| n).collect()
    }

    /// The `metaData` of a new table of this kind, created at `created_ms` (UTC ms).
    pub fn metadata(&self, created_ms: i64) -> Metadata {
        let partitions: Vec<Field> = (self.partitions)()
            .into_iter()
            .map(|(n, t)| Field::new(n, t, false))
            .collect();
        Metadata {
            id: uuid(),
            name: Some(self.name.to_owned()),
            description: Some(self.description.to_owned()),
            format: Default::default(),
            schema_string: schema_string(&(self.schema)(), &partitions)
                .expect("verdict's schemas have Delta types"),
            partition_columns: partitions.iter().map(|f| f.name().clone()).collect(),
            configuration: self
                .properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some((*v).to_owned())))
                .collect(),
            created_time: Some(created_ms),
        }
    }

    /// The table in `store`, reading the system's clock.
    pub fn table(&self, store: Arc<dyn ObjectStore>) -> Table {
        Table::new(store, self.root)
    }

    /// The table in `store`, reading the time from `clock`.
    pub fn table_at(&self, store: Arc<dyn ObjectStore>, clock: Clock) -> Table {
        Table::new(store, self.root).with_clock(clock)
    }

    /// The table's latest snapshot, creating it if it has no log yet (writers): refused
    /// when verdict may not write it ([`Table::check_writable`]) or its schema is not this
    /// table's ([`TableDef::check_schema`]).
    pub async fn open(&self, store: Arc<dyn ObjectStore>) -> Result<(Table, Snapshot), LakeError> {
        self.open_table(self.table(store)).await
    }

    /// [`TableDef::open`] of `table` (this table, with the clock it was given).
    pub async fn open_table(&self, table: Table) -> Result<(Table, Snapshot), LakeError> {
        let snapshot = table.open_or_create(self.metadata(table.now_ms())).await?;
        self.check_schema(snapshot.metadata())?;
        Ok((table, snapshot))
    }

    /// One commit to this table in `store` replacing, for each `(dir, add)`, the files
    /// under `dir` (one hour's or one day's folder) by `add`; with `txn` (`expected`,
    /// `version`), carrying `app_id`'s progress. The days it writes are what it read, so a
    /// concurrent writer adding to one of them makes it fail rather than leave an hour with
    /// two files. The removes, the progress and the commit are stamped by `clock`.
    pub async fn replace(
        &self,
        store: &Arc<dyn ObjectStore>,
        clock: &Clock,
        app_id: &str,
        files: Vec<(String, Add)>,
        txn: Option<(Option<i64>, i64)>,
    ) -> Result<i64, LakeError> {
        let (handle, mut snapshot) = self
            .open_table(self.table_at(Arc::clone(store), Arc::clone(clock)))
            .await?;
        let now_ms = handle.now_ms();
        let mut actions = Vec::new();
        let mut days = Vec::new();
        let replaced = files.len();
        for (dir, add) in files {
            if let Some(whole) = partition_file_above(&snapshot, &dir) {
                return Err(LakeError::Compacted {
                    table: self.root.to_owned(),
                    dir,
                    path: whole,
                });
            }
            actions.extend(
                snapshot
                    .files_under(&dir)
                    .map(|old| Action::Remove(old.remove(now_ms, true))),
            );
            if !days.contains(&add.partition_values) {
                days.push(add.partition_values.clone());
            }
            actions.push(Action::Add(add));
        }
        let mut commit = Commit::new("WRITE", actions)
            .with_parameter("mode", "Overwrite")
            .with_parameter("partitions replaced", replaced)
            .reading(days);
        if let Some((expected, version)) = txn {
            commit = commit.with_txn(app_id, expected, version, now_ms);
        }
        handle.commit(&mut snapshot, commit).await
    }

    /// Whether a table's `metadata` (another writer's, or an older verdict's) holds every
    /// column of this table with the Delta type verdict reads and writes, and the same
    /// partition columns; the first column that does not is named. Columns verdict does
    /// not know are left alone (a reader does not read them; a writer leaves them null).
    pub fn check_schema(&self, metadata: &Metadata) -> Result<(), LakeError> {
        let refused = |reason: String| LakeError::Schema {
            table: self.root.to_owned(),
            reason,
        };
        let schema: serde_json::Value = serde_json::from_str(&metadata.schema_string)
            .map_err(|e| refused(format!("the table's schema does not parse: {e}")))?;
        // A primitive type is its name; a nested one is JSON, shown as it is.
        let found: Vec<(&str, String)> = schema["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| {
                let t = &f["type"];
                let t = t.as_str().map_or_else(|| t.to_string(), str::to_owned);
                Some((f["name"].as_str()?, t))
            })
            .collect();
        let wanted = (self.schema)()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .chain(
                (self.partitions)()
                    .into_iter()
                    .map(|(n, t)| (n.to_owned(), t)),
            )
            .collect::<Vec<_>>();
        for (name, data_type) in &wanted {
            let delta = delta_type(data_type).unwrap_or("?");
            match found.iter().find(|(n, _)| n == name) {
                None => {
                    return Err(refused(format!(
                        "column {name} ({delta}) is missing from the table's schema"
                    )));
                }
                Some((_, t)) if t != delta => {
                    return Err(refused(format!(
                        "column {name} is {t} in the table's schema; verdict reads and writes it \
                         as {delta}"
                    )));
                }
                Some(_) => {}
            }
        }
        let partitions = self.partition_names();
        if metadata.partition_columns != partitions {
            return Err(refused(format!(
                "the table is partitioned by [{}]; verdict reads and writes it partitioned by \
                 [{}]",
                metadata.partition_columns.join(", "),
                partitions.join(", ")
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_a_delta_schema_with_its_partition_columns() {
        for t in ALL {
            let m = t.metadata(0);
            let schema: serde_json::Value = serde_json::from_str(&m.schema_string).unwrap();
            let names: Vec<&str> = schema["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap())
                .collect();
            for p in &m.partition_columns {
                assert_eq!(
                    names.iter().filter(|n| **n == p.as_str()).count(),
                    1,
                    "{}: {p}",
                    t.name
                );
            }
            assert_eq!(m.id.len(), 36);
            assert_eq!(&m.id[14..15], "4");
        }
        assert_eq!(RAW.partition_names(), ["date", "hour"]);
    }

    /// The metadata of the raw table with its schema's fields passed through `edit`.
    fn raw_with(edit: impl FnOnce(&mut Vec<serde_json::Value>)) -> Metadata {
        let mut m = RAW.metadata(0);
        let mut schema: serde_json::Value = serde_json::from_str(&m.schema_string).unwrap();
        edit(schema["fields"].as_array_mut().unwrap());
        m.schema_string = schema.to_string();
        m
    }

    #[test]
    fn a_schema_that_is_not_the_tables_is_refused_naming_the_column() {
        RAW.check_schema(&RAW.metadata(0)).unwrap();
        // A column another engine added is left alone.
        let extra = raw_with(|f| {
            f.push(serde_json::json!({"name": "note", "type": "string", "nullable": true, "metadata": {}}))
        });
        RAW.check_schema(&extra).unwrap();
        let missing = raw_with(|f| f.retain(|c| c["name"] != "kafka_cluster"));
        assert_eq!(
            RAW.check_schema(&missing).unwrap_err().to_string(),
            "raw: column kafka_cluster (string) is missing from the table's schema"
        );
        let mistyped = raw_with(|f| {
            for c in f.iter_mut().filter(|c| c["name"] == "window_quota") {
                c["type"] = "string".into();
            }
        });
        assert_eq!(
            RAW.check_schema(&mistyped).unwrap_err().to_string(),
            "raw: column window_quota is string in the table's schema; verdict reads and writes it as long"
        );
        let mut repartitioned = RAW.metadata(0);
        repartitioned.partition_columns = vec!["date".into()];
        assert_eq!(
            RAW.check_schema(&repartitioned).unwrap_err().to_string(),
            "raw: the table is partitioned by [date]; verdict reads and writes it partitioned by [date, hour]"
        );
    }
}
