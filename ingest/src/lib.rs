//! Ingest: decision events, read from Kafka (or the in-process queue of the embedded
//! default), become the raw table: Hive-partitioned Parquet files on an `object_store`,
//! each named by the Kafka offsets it holds, rows sorted by key id then time.
//!
//! The pure part, how consumed records are ordered and encoded, is [`raw_file`]; splitting a
//! chunk by hour and putting each file in the store is [`store`]; the exactly-once
//! bookkeeping (flush intents, completion markers, recovery) is [`progress`], the flush
//! and recovery against the store are [`flush`], the consumer-group member is [`worker`],
//! and what it exports to Prometheus is [`metrics`].

pub mod flush;
pub mod metrics;
pub mod open;
pub mod prefixed;
pub mod progress;
pub mod raw_file;
pub mod store;
pub mod worker;

pub use metrics::IngestMetrics;
pub use open::{OpenError, S3Options, folder_of, open_folder, open_store};
pub use prefixed::Prefixed;
pub use raw_file::{ConsumedEvent, RawFileError, encode_raw_parquet, raw_writer_properties};
pub use store::{HourSplit, WriteError, WrittenFile, split_by_hour, write_hour_file};
pub use worker::{IngestConfig, IngestError, IngestStats, IngestWorker};
