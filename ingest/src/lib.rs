//! Ingest: decision events, read from Kafka (or the in-process queue of the embedded
//! default), become the raw table: a Delta table of Parquet files on an `object_store`,
//! partitioned by the events' hour, rows sorted by key id then time.
//!
//! The pure part, how consumed records are ordered and encoded, is [`raw_file`]; splitting a
//! chunk by hour, naming its files and committing them is [`raw_table`]; one flush of a
//! partition, committed with the partition's progress (exactly once by the Delta log), and
//! where a partition resumes are [`flush`]; the consumer-group member is [`worker`], and
//! what it exports to Prometheus is [`metrics`].

pub mod flush;
pub mod metrics;
pub mod raw_file;
pub mod raw_table;
pub mod worker;

pub use metrics::IngestMetrics;
pub use raw_file::ConsumedEvent;
pub use raw_table::{HourSplit, KafkaSource, RawTable, raw_add, split_by_hour};
pub use worker::{IngestConfig, IngestError, IngestStats, IngestWorker};
