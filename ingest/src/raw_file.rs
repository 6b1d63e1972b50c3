//! One raw Parquet file, built without I/O: the consumed events sorted by key id then time
//! (the order that makes key-id dictionary runs long and timestamps delta-friendly), turned
//! into a `RecordBatch` of the raw schema, and encoded with the raw table's writer settings.

use arrow::record_batch::RecordBatch;
use verdict_lake::files::{EncodeError, encode_raw_parquet};
use verdict_schemas::{DecisionEvent, HourPartition, RawBatchBuilder};

/// A decision event together with where it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumedEvent {
    /// The decoded event.
    pub event: DecisionEvent,
    /// The Kafka partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
}

#[cfg(test)]
impl ConsumedEvent {
    /// An allowed decision of key `[key; 16]` at `time`, read at `partition` / `offset`: the
    /// one event shape the crate's tests need.
    pub(crate) fn allowed(key: u8, time: i64, partition: i32, offset: i64) -> Self {
        use verdict_schemas::{
            DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
        };
        Self {
            event: DecisionEvent {
                event_time_ms: time,
                key_id: KeyId([key; 16]),
                route_class: RouteClassId(0),
                tier: TierId(0),
                region: RegionId(0),
                gateway_instance: 0,
                verdict: Verdict::Allowed,
                denied_by: DeniedBy::NONE,
                source: DecisionSource::CounterStore,
                remaining_tokens: 1,
                remaining_window: 1,
                retry_after_ms: 0,
                window_quota: 10,
                policy_version: 1,
                sub_key: 0,
                sub_keys: 1,
            },
            partition,
            offset,
        }
    }
}

impl ConsumedEvent {
    /// The raw table's row order: key id, then event time, then (to make the order total
    /// and the file a deterministic function of its rows) partition and offset.
    fn sort_key(&self) -> (&[u8; 16], i64, i32, i64) {
        (
            self.event.key_id.as_bytes(),
            self.event.event_time_ms,
            self.partition,
            self.offset,
        )
    }
}

/// One hour's raw file, built and not yet written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourFile {
    /// Its hour.
    pub hour: HourPartition,
    /// Its name inside the hour's folder.
    pub name: String,
    /// The encoded Parquet file.
    pub bytes: Vec<u8>,
    /// Rows it holds.
    pub rows: usize,
    /// Its statistics, as the Delta `add` carries them.
    pub stats: String,
}

impl HourFile {
    /// Its object path in the lake: `raw/date=…/hour=…/<name>`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.hour.raw_prefix(), self.name)
    }

    /// Its path relative to the raw table's root, as its `add` gives it.
    pub fn table_path(&self) -> String {
        format!("{}/{}", self.hour.partition_path(), self.name)
    }
}

/// Builds the raw file `name` of one hour's events read from Kafka cluster `cluster`: rows
/// sorted, encoded, their statistics taken. `None` for no events.
pub fn build_hour_file(
    cluster: &str,
    name: String,
    hour: HourPartition,
    mut events: Vec<ConsumedEvent>,
) -> Result<Option<HourFile>, EncodeError> {
    if events.is_empty() {
        return Ok(None);
    }
    let batch = sorted_raw_batch(&mut events, cluster)?;
    Ok(Some(HourFile {
        hour,
        name,
        stats: verdict_lake::stats::file_stats(std::slice::from_ref(&batch), &[]),
        bytes: encode_raw_parquet(std::slice::from_ref(&batch))?,
        rows: events.len(),
    }))
}

/// Sorts `events`, read from Kafka cluster `cluster`, into the raw table's row order and
/// converts them into one batch.
pub fn sorted_raw_batch(
    events: &mut [ConsumedEvent],
    cluster: &str,
) -> Result<RecordBatch, EncodeError> {
    events.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    let mut builder = RawBatchBuilder::with_capacity(events.len());
    for c in events.iter() {
        builder.push(&c.event, cluster, c.partition, c.offset);
    }
    Ok(builder.finish()?)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use verdict_schemas::{
        DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
    };

    use super::*;
    use verdict_schemas::raw_schema;

    fn consumed(key: u8, time: i64, offset: i64) -> ConsumedEvent {
        ConsumedEvent {
            event: DecisionEvent {
                event_time_ms: time,
                key_id: KeyId([key; 16]),
                route_class: RouteClassId(1),
                tier: TierId(2),
                region: RegionId(3),
                gateway_instance: 4,
                verdict: Verdict::Allowed,
                denied_by: DeniedBy::NONE,
                source: DecisionSource::CounterStore,
                remaining_tokens: 5,
                remaining_window: 6,
                retry_after_ms: 0,
                window_quota: 7,
                policy_version: 8,
                sub_key: 0,
                sub_keys: 1,
            },
            partition: 0,
            offset,
        }
    }

    #[test]
    fn rows_are_sorted_by_key_then_time_and_survive_parquet() {
        let mut events = vec![
            consumed(9, 100, 0),
            consumed(1, 300, 1),
            consumed(1, 200, 2),
            consumed(5, 100, 3),
        ];
        let batch = sorted_raw_batch(&mut events, "main").unwrap();
        let order: Vec<i64> = events.iter().map(|c| c.offset).collect();
        assert_eq!(order, [2, 1, 3, 0]);

        let bytes = Bytes::from(encode_raw_parquet(std::slice::from_ref(&batch)).unwrap());
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
            .unwrap()
            .build()
            .unwrap();
        let back: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(back, vec![batch]);

        let meta = SerializedFileReader::new(bytes).unwrap().metadata().clone();
        let rg = meta.row_group(0);
        assert_eq!(rg.num_rows(), 4);
        assert_eq!(rg.sorting_columns().map(|s| s.len()), Some(2));
        let key_col = raw_schema()
            .index_of(verdict_schemas::tables::raw::KEY_ID)
            .unwrap();
        assert!(
            rg.column(key_col).bloom_filter_offset().is_some(),
            "key_id has a bloom filter"
        );
        assert!(
            rg.column(key_col).statistics().is_some(),
            "key_id has statistics"
        );
        // The file records the codec, not its level.
        assert!(matches!(
            rg.column(key_col).compression(),
            parquet::basic::Compression::ZSTD(_)
        ));
    }
}
