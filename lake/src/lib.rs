//! The lake's tables as Delta Lake tables: every engine that reads Delta (Spark, Trino,
//! Databricks, DuckDB, Polars through delta-rs) reads them as verdict does, through the
//! transaction log in each table's `_delta_log/` folder.
//!
//! This crate is the part of the Delta protocol verdict needs, over `object_store`, with
//! the Arrow and Parquet already in the build: the actions ([`action`]), the log's files
//! ([`log`]), the replay into a snapshot ([`snapshot`]), commits with optimistic
//! concurrency and `txn` fencing ([`table`]), checkpoints and log cleanup
//! ([`checkpoint`]), file statistics ([`stats`]), the schema ([`schema`]) and vacuum
//! ([`vacuum`]). Tables are reader version 1, writer version 2: no deletion vectors, no
//! column mapping, no table features (`README.md` says what of the protocol it reads and
//! writes). [`tables`] defines verdict's tables (schema, partitions, properties, their
//! schema check) and [`files`] how their files are encoded; [`open`] opens a lake by URL (a
//! folder or S3) and [`prefixed`] puts one under a prefix; [`observed`] is the one
//! `ObjectStore` wrapper its users build theirs from.

pub mod action;
pub mod checkpoint;
pub mod files;
pub mod log;
pub mod observed;
pub mod open;
pub mod prefixed;
pub mod schema;
pub mod snapshot;
pub mod stats;
pub mod table;
pub mod tables;
pub mod vacuum;

pub use action::{Action, Add, Metadata, PartitionValues, Remove, Txn};
pub use observed::{Observed, Observer};
pub use open::{OpenError, S3Options, folder_of, open_folder, open_store};
pub use prefixed::Prefixed;
pub use snapshot::Snapshot;
pub use table::{Clock, Commit, Conflict, LakeError, Reads, Table};
pub use tables::TableDef;
