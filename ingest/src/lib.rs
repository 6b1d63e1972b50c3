//! Ingest: decision events, read from Kafka (or the in-process queue of the embedded
//! default), become the raw table: Hive-partitioned Parquet files on an `object_store`,
//! each named by the Kafka offsets it holds, rows sorted by key id then time.
//!
//! This crate holds the pure parts first: how consumed records are ordered and encoded
//! ([`raw_file`]); the I/O that puts a file in the store is [`store`].

pub mod raw_file;
pub mod store;

pub use raw_file::{ConsumedEvent, RawFileError, encode_raw_parquet, raw_writer_properties};
