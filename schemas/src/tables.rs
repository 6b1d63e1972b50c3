//! The Arrow schemas of the tables (`raw`, `denied_hourly`) and the conversion of decision
//! events into a raw `RecordBatch`. Column names are constants so writers, jobs and queries
//! agree on them. Enum fields are stored as their wire codes (`u8`): the codes are the
//! contract (documented in `schemas/README.md`), names belong to the query layer.

use std::sync::{Arc, LazyLock};

use arrow::array::{
    ArrayRef, BooleanArray, BooleanBufferBuilder, FixedSizeBinaryArray, Int32Array, Int64Array,
    StringBuilder, TimestampMillisecondArray, UInt8Array, UInt16Array, UInt32Array,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

use crate::event::DecisionEvent;

/// The time zone of every timestamp column.
pub const UTC: &str = "UTC";

/// Column names of the raw table, in schema order.
pub mod raw {
    /// Decision time, UTC milliseconds.
    pub const EVENT_TIME: &str = "event_time";
    /// The 16-byte key id.
    pub const KEY_ID: &str = "key_id";
    /// Tier id (policy).
    pub const TIER: &str = "tier";
    /// Route class id (policy).
    pub const ROUTE_CLASS: &str = "route_class";
    /// Region id.
    pub const REGION: &str = "region";
    /// Gateway instance that decided.
    pub const GATEWAY_INSTANCE: &str = "gateway_instance";
    /// Verdict code: 0 allowed, 1 denied, 2 would-deny.
    pub const VERDICT: &str = "verdict";
    /// The token bucket refused.
    pub const DENIED_BY_BUCKET: &str = "denied_by_bucket";
    /// The hourly window refused.
    pub const DENIED_BY_WINDOW: &str = "denied_by_window";
    /// Source code: 0 counter store, 1 local fallback, 2 kill switch, 3 policy off.
    pub const SOURCE: &str = "source";
    /// Whole tokens left after the decision.
    pub const REMAINING_TOKENS: &str = "remaining_tokens";
    /// Requests left in the hourly window after the decision.
    pub const REMAINING_WINDOW: &str = "remaining_window";
    /// Retry-After given, milliseconds.
    pub const RETRY_AFTER_MS: &str = "retry_after_ms";
    /// The hourly quota in force.
    pub const WINDOW_QUOTA: &str = "window_quota";
    /// Policy version that decided (signed 64-bit, a Delta `long`, as every engine reads it).
    pub const POLICY_VERSION: &str = "policy_version";
    /// Hot-key sub-key index.
    pub const SUB_KEY: &str = "sub_key";
    /// Hot-key split count.
    pub const SUB_KEYS: &str = "sub_keys";
    /// The Kafka cluster the event was read from (the ingest worker's `--cluster`): each
    /// region's cluster has the same topic and partition numbers, so a row is identified by
    /// (`kafka_cluster`, `kafka_partition`, `kafka_offset`).
    pub const KAFKA_CLUSTER: &str = "kafka_cluster";
    /// Kafka partition the event was read from.
    pub const KAFKA_PARTITION: &str = "kafka_partition";
    /// Kafka offset the event was read from.
    pub const KAFKA_OFFSET: &str = "kafka_offset";
}

/// Column names of the `denied_hourly` rollup table, in schema order.
pub mod denied_hourly {
    /// Start of the hour, UTC.
    pub const HOUR: &str = "hour";
    /// The 16-byte key id.
    pub const KEY_ID: &str = "key_id";
    /// Tier id.
    pub const TIER: &str = "tier";
    /// Route class id.
    pub const ROUTE_CLASS: &str = "route_class";
    /// Region id.
    pub const REGION: &str = "region";
    /// Requests allowed in the hour.
    pub const ALLOWED: &str = "allowed";
    /// Requests refused with 429.
    pub const DENIED: &str = "denied";
    /// Requests shadow mode would have refused.
    pub const WOULD_DENY: &str = "would_deny";
    /// Refusals (real or would-be) in which the bucket refused.
    pub const DENIED_BY_BUCKET: &str = "denied_by_bucket";
    /// Refusals (real or would-be) in which the hourly window refused.
    pub const DENIED_BY_WINDOW: &str = "denied_by_window";
    /// Would-be refusals (shadow mode) in which the hourly window refused; the real ones
    /// are `denied_by_window - would_deny_by_window`.
    pub const WOULD_DENY_BY_WINDOW: &str = "would_deny_by_window";
    /// Decisions not made by the shared counters (fallback, kill switch, policy off).
    pub const DEGRADED: &str = "degraded";
    /// Smallest remaining token count seen.
    pub const MIN_REMAINING_TOKENS: &str = "min_remaining_tokens";
    /// Smallest remaining window quota seen.
    pub const MIN_REMAINING_WINDOW: &str = "min_remaining_window";
    /// First refusal (real or would-be) in the hour.
    pub const FIRST_DENIAL: &str = "first_denial";
    /// Last refusal (real or would-be) in the hour.
    pub const LAST_DENIAL: &str = "last_denial";
    /// Newest policy version seen.
    pub const POLICY_VERSION: &str = "policy_version";
    /// Largest hourly quota in force during the hour.
    pub const WINDOW_QUOTA: &str = "window_quota";
}

/// Column names of the `overage` table (the daily table pricing reads; its schema is a
/// contract: it changes only with a new version, `OVERAGE_SCHEMA_VERSION`).
pub mod overage {
    /// The UTC day.
    pub const DATE: &str = "date";
    /// The 16-byte key id.
    pub const KEY_ID: &str = "key_id";
    /// Tier id.
    pub const TIER: &str = "tier";
    /// Route class id (the hourly quota is per tier and route class).
    pub const ROUTE_CLASS: &str = "route_class";
    /// Requests refused with 429 because the hourly quota was spent.
    pub const QUOTA_DENIED: &str = "quota_denied";
    /// Requests shadow mode would have refused because the hourly quota was spent.
    pub const QUOTA_WOULD_DENY: &str = "quota_would_deny";
    /// The largest hourly quota in force that day.
    pub const WINDOW_QUOTA: &str = "window_quota";
    /// The newest policy version seen that day.
    pub const POLICY_VERSION: &str = "policy_version";
}

/// Column names of the `demand_hourly` table: per hour × tier × route class × region, how
/// many keys had each level of demand (requests in the hour over the quota they had), in
/// log-spaced buckets. Kept as long as the rollup, so a limit's demand can be judged over
/// years, not only over the raw table's week.
pub mod demand_hourly {
    /// Start of the hour, UTC.
    pub const HOUR: &str = "hour";
    /// Tier id.
    pub const TIER: &str = "tier";
    /// Route class id.
    pub const ROUTE_CLASS: &str = "route_class";
    /// Region id.
    pub const REGION: &str = "region";
    /// The demand bucket: a key with demand d (requests over quota) is in bucket
    /// ⌊4 · log2 d⌋, clamped to [`MIN_BUCKET`](super::DEMAND_MIN_BUCKET) …
    /// [`MAX_BUCKET`](super::DEMAND_MAX_BUCKET); its upper bound is 2^((bucket + 1) / 4).
    pub const BUCKET: &str = "bucket";
    /// Keys in the bucket.
    pub const KEYS: &str = "keys";
    /// Their requests.
    pub const REQUESTS: &str = "requests";
    /// The largest quota (per key, the whole of a split key) in force during the hour.
    pub const WINDOW_QUOTA: &str = "window_quota";
}

/// Column names of the `reconcile_rounds` table: one row per round of the regional reconcile
/// (`verdict jobs reconcile`), with the settings it ran with, so a what-if over a range knows
/// whether the regions' shares followed demand then (and how) or stayed at their static
/// weights (no rounds).
pub mod reconcile_rounds {
    /// The UTC day of the round (partition column).
    pub const DATE: &str = "date";
    /// When the round read the regions' counters, UTC.
    pub const ROUND_TIME: &str = "round_time";
    /// Between rounds, ms (also how far back a round looks for keys near their limit).
    pub const INTERVAL_MS: &str = "interval_ms";
    /// How long after its round a share that grows takes effect, ms.
    pub const INCREASE_DELAY_MS: &str = "increase_delay_ms";
    /// How long a share the job no longer rewrites stays in force, ms.
    pub const SHARE_TTL_MS: &str = "share_ttl_ms";
    /// Part of the static weight every region keeps when shares follow demand (0 to 1).
    pub const FLOOR: &str = "floor";
    /// Keys near their limit in some region, whose shares the round computed.
    pub const KEYS: &str = "keys";
    /// Share rows written.
    pub const SHARE_ROWS: &str = "share_rows";
    /// Regions whose Redis did not answer (they kept their last shares).
    pub const UNREACHABLE_REGIONS: &str = "unreachable_regions";
}

/// Demand buckets per doubling: each bucket spans a factor of 2^(1/4) ≈ 1.19.
pub const DEMAND_BUCKETS_PER_OCTAVE: i32 = 4;
/// The lowest bucket: demand up to 2^-10 (about 0.001) of the quota, and none.
pub const DEMAND_MIN_BUCKET: i16 = -40;
/// The highest bucket: demand of 2^6 = 64 times the quota and more.
pub const DEMAND_MAX_BUCKET: i16 = 24;

/// The bucket of a demand (requests over quota).
pub fn demand_bucket(demand: f64) -> i16 {
    if demand.is_nan() || demand <= 0.0 {
        return DEMAND_MIN_BUCKET;
    }
    let b = (f64::from(DEMAND_BUCKETS_PER_OCTAVE) * demand.log2()).floor();
    b.clamp(f64::from(DEMAND_MIN_BUCKET), f64::from(DEMAND_MAX_BUCKET)) as i16
}

/// The upper bound of a bucket's demand.
pub fn demand_bucket_upper(bucket: i16) -> f64 {
    2f64.powf(f64::from(i32::from(bucket) + 1) / f64::from(DEMAND_BUCKETS_PER_OCTAVE))
}

/// The version of the `overage` table's schema. Version 2 holds its counts and the policy
/// version as `Int64` (Delta's `long`: the protocol has no unsigned 64-bit type, and
/// engines refuse a `decimal(20,0)` where they expect an integer).
pub const OVERAGE_SCHEMA_VERSION: u32 = 2;

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some(UTC.into()))
}

static RAW_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use raw::*;
    Arc::new(Schema::new(vec![
        Field::new(EVENT_TIME, ts(), false),
        Field::new(KEY_ID, DataType::FixedSizeBinary(16), false),
        Field::new(TIER, DataType::UInt8, false),
        Field::new(ROUTE_CLASS, DataType::UInt8, false),
        Field::new(REGION, DataType::UInt16, false),
        Field::new(GATEWAY_INSTANCE, DataType::UInt32, false),
        Field::new(VERDICT, DataType::UInt8, false),
        Field::new(DENIED_BY_BUCKET, DataType::Boolean, false),
        Field::new(DENIED_BY_WINDOW, DataType::Boolean, false),
        Field::new(SOURCE, DataType::UInt8, false),
        Field::new(REMAINING_TOKENS, DataType::UInt32, false),
        Field::new(REMAINING_WINDOW, DataType::UInt32, false),
        Field::new(RETRY_AFTER_MS, DataType::UInt32, false),
        Field::new(WINDOW_QUOTA, DataType::UInt32, false),
        Field::new(POLICY_VERSION, DataType::Int64, false),
        Field::new(SUB_KEY, DataType::UInt8, false),
        Field::new(SUB_KEYS, DataType::UInt8, false),
        Field::new(KAFKA_CLUSTER, DataType::Utf8, false),
        Field::new(KAFKA_PARTITION, DataType::Int32, false),
        Field::new(KAFKA_OFFSET, DataType::Int64, false),
    ]))
});

static DENIED_HOURLY_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use denied_hourly::*;
    Arc::new(Schema::new(vec![
        Field::new(HOUR, ts(), false),
        Field::new(KEY_ID, DataType::FixedSizeBinary(16), false),
        Field::new(TIER, DataType::UInt8, false),
        Field::new(ROUTE_CLASS, DataType::UInt8, false),
        Field::new(REGION, DataType::UInt16, false),
        Field::new(ALLOWED, DataType::Int64, false),
        Field::new(DENIED, DataType::Int64, false),
        Field::new(WOULD_DENY, DataType::Int64, false),
        Field::new(DENIED_BY_BUCKET, DataType::Int64, false),
        Field::new(DENIED_BY_WINDOW, DataType::Int64, false),
        Field::new(WOULD_DENY_BY_WINDOW, DataType::Int64, false),
        Field::new(DEGRADED, DataType::Int64, false),
        Field::new(MIN_REMAINING_TOKENS, DataType::UInt32, false),
        Field::new(MIN_REMAINING_WINDOW, DataType::UInt32, false),
        Field::new(FIRST_DENIAL, ts(), false),
        Field::new(LAST_DENIAL, ts(), false),
        Field::new(POLICY_VERSION, DataType::Int64, false),
        Field::new(WINDOW_QUOTA, DataType::UInt32, false),
    ]))
});

static OVERAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use overage::*;
    Arc::new(Schema::new(vec![
        Field::new(DATE, DataType::Date32, false),
        Field::new(KEY_ID, DataType::FixedSizeBinary(16), false),
        Field::new(TIER, DataType::UInt8, false),
        Field::new(ROUTE_CLASS, DataType::UInt8, false),
        Field::new(QUOTA_DENIED, DataType::Int64, false),
        Field::new(QUOTA_WOULD_DENY, DataType::Int64, false),
        Field::new(WINDOW_QUOTA, DataType::UInt32, false),
        Field::new(POLICY_VERSION, DataType::Int64, false),
    ]))
});

static RECONCILE_ROUNDS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use reconcile_rounds::*;
    Arc::new(Schema::new(vec![
        Field::new(DATE, DataType::Date32, false),
        Field::new(ROUND_TIME, ts(), false),
        Field::new(INTERVAL_MS, DataType::Int64, false),
        Field::new(INCREASE_DELAY_MS, DataType::Int64, false),
        Field::new(SHARE_TTL_MS, DataType::Int64, false),
        Field::new(FLOOR, DataType::Float64, false),
        Field::new(KEYS, DataType::UInt32, false),
        Field::new(SHARE_ROWS, DataType::UInt32, false),
        Field::new(UNREACHABLE_REGIONS, DataType::UInt16, false),
    ]))
});

static DEMAND_HOURLY_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use demand_hourly::*;
    Arc::new(Schema::new(vec![
        Field::new(HOUR, ts(), false),
        Field::new(TIER, DataType::UInt8, false),
        Field::new(ROUTE_CLASS, DataType::UInt8, false),
        Field::new(REGION, DataType::UInt16, false),
        Field::new(BUCKET, DataType::Int16, false),
        Field::new(KEYS, DataType::Int64, false),
        Field::new(REQUESTS, DataType::Int64, false),
        Field::new(WINDOW_QUOTA, DataType::UInt32, false),
    ]))
});

/// The schema of the `demand_hourly` table's Parquet files.
pub fn demand_hourly_schema() -> SchemaRef {
    Arc::clone(&DEMAND_HOURLY_SCHEMA)
}

/// The schema of the `overage` table's Parquet files (version `OVERAGE_SCHEMA_VERSION`).
pub fn overage_schema() -> SchemaRef {
    Arc::clone(&OVERAGE_SCHEMA)
}

/// The schema of the `reconcile_rounds` table's Parquet files (`date` is also a column of the
/// files, as in `overage`).
pub fn reconcile_rounds_schema() -> SchemaRef {
    Arc::clone(&RECONCILE_ROUNDS_SCHEMA)
}

/// The schema of the raw table's Parquet files (partition columns `date`/`hour` come from
/// the path, not the file).
pub fn raw_schema() -> SchemaRef {
    Arc::clone(&RAW_SCHEMA)
}

/// The schema of the `denied_hourly` rollup's Parquet files.
pub fn denied_hourly_schema() -> SchemaRef {
    Arc::clone(&DENIED_HOURLY_SCHEMA)
}

/// Collects events column by column and turns them into one raw `RecordBatch`.
///
/// Each column is a plain `Vec` grown in place and handed to Arrow without a copy, so a row
/// costs a few stores and no allocation once the capacity is reserved.
#[derive(Debug)]
pub struct RawBatchBuilder {
    event_time: Vec<i64>,
    key_id: Vec<u8>,
    tier: Vec<u8>,
    route_class: Vec<u8>,
    region: Vec<u16>,
    gateway_instance: Vec<u32>,
    verdict: Vec<u8>,
    denied_by_bucket: BooleanBufferBuilder,
    denied_by_window: BooleanBufferBuilder,
    source: Vec<u8>,
    remaining_tokens: Vec<u32>,
    remaining_window: Vec<u32>,
    retry_after_ms: Vec<u32>,
    window_quota: Vec<u32>,
    policy_version: Vec<i64>,
    sub_key: Vec<u8>,
    sub_keys: Vec<u8>,
    kafka_cluster: StringBuilder,
    kafka_partition: Vec<i32>,
    kafka_offset: Vec<i64>,
}

impl RawBatchBuilder {
    /// A builder with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            event_time: Vec::with_capacity(rows),
            key_id: Vec::with_capacity(rows * 16),
            tier: Vec::with_capacity(rows),
            route_class: Vec::with_capacity(rows),
            region: Vec::with_capacity(rows),
            gateway_instance: Vec::with_capacity(rows),
            verdict: Vec::with_capacity(rows),
            denied_by_bucket: BooleanBufferBuilder::new(rows),
            denied_by_window: BooleanBufferBuilder::new(rows),
            source: Vec::with_capacity(rows),
            remaining_tokens: Vec::with_capacity(rows),
            remaining_window: Vec::with_capacity(rows),
            retry_after_ms: Vec::with_capacity(rows),
            window_quota: Vec::with_capacity(rows),
            policy_version: Vec::with_capacity(rows),
            sub_key: Vec::with_capacity(rows),
            sub_keys: Vec::with_capacity(rows),
            kafka_cluster: StringBuilder::with_capacity(rows, rows * 8),
            kafka_partition: Vec::with_capacity(rows),
            kafka_offset: Vec::with_capacity(rows),
        }
    }

    /// An empty builder.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Rows pushed so far.
    pub fn len(&self) -> usize {
        self.event_time.len()
    }

    /// True if no row was pushed.
    pub fn is_empty(&self) -> bool {
        self.event_time.is_empty()
    }

    /// Appends one event read from partition `kafka_partition` of Kafka cluster
    /// `kafka_cluster` at `kafka_offset`.
    pub fn push(
        &mut self,
        e: &DecisionEvent,
        kafka_cluster: &str,
        kafka_partition: i32,
        kafka_offset: i64,
    ) {
        self.event_time.push(e.event_time_ms);
        self.key_id.extend_from_slice(&e.key_id.0);
        self.tier.push(e.tier.0);
        self.route_class.push(e.route_class.0);
        self.region.push(e.region.0);
        self.gateway_instance.push(e.gateway_instance);
        self.verdict.push(e.verdict.code());
        self.denied_by_bucket.append(e.denied_by.bucket);
        self.denied_by_window.append(e.denied_by.window);
        self.source.push(e.source.code());
        self.remaining_tokens.push(e.remaining_tokens);
        self.remaining_window.push(e.remaining_window);
        self.retry_after_ms.push(e.retry_after_ms);
        self.window_quota.push(e.window_quota);
        // A Delta `long`: policy versions are PostgreSQL bigints. The ingest worker
        // quarantines an event whose version is past i64::MAX before it gets here
        // (`policy_version_out_of_range`); for other writers such a version is i64::MAX.
        self.policy_version
            .push(i64::try_from(e.policy_version).unwrap_or(i64::MAX));
        self.sub_key.push(e.sub_key);
        self.sub_keys.push(e.sub_keys);
        self.kafka_cluster.append_value(kafka_cluster);
        self.kafka_partition.push(kafka_partition);
        self.kafka_offset.push(kafka_offset);
    }

    /// The rows as a `RecordBatch` of [`raw_schema`].
    pub fn finish(mut self) -> Result<RecordBatch, ArrowError> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(TimestampMillisecondArray::from(self.event_time).with_timezone(UTC)),
            Arc::new(FixedSizeBinaryArray::try_new(
                16,
                Buffer::from_vec(self.key_id),
                None,
            )?),
            Arc::new(UInt8Array::from(self.tier)),
            Arc::new(UInt8Array::from(self.route_class)),
            Arc::new(UInt16Array::from(self.region)),
            Arc::new(UInt32Array::from(self.gateway_instance)),
            Arc::new(UInt8Array::from(self.verdict)),
            Arc::new(BooleanArray::new(self.denied_by_bucket.finish(), None)),
            Arc::new(BooleanArray::new(self.denied_by_window.finish(), None)),
            Arc::new(UInt8Array::from(self.source)),
            Arc::new(UInt32Array::from(self.remaining_tokens)),
            Arc::new(UInt32Array::from(self.remaining_window)),
            Arc::new(UInt32Array::from(self.retry_after_ms)),
            Arc::new(UInt32Array::from(self.window_quota)),
            Arc::new(Int64Array::from(self.policy_version)),
            Arc::new(UInt8Array::from(self.sub_key)),
            Arc::new(UInt8Array::from(self.sub_keys)),
            Arc::new(self.kafka_cluster.finish()),
            Arc::new(Int32Array::from(self.kafka_partition)),
            Arc::new(Int64Array::from(self.kafka_offset)),
        ];
        RecordBatch::try_new(raw_schema(), columns)
    }
}

impl Default for RawBatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// Converts events read from one partition of Kafka cluster `kafka_cluster` (with their
/// offsets, in the same order) into a raw `RecordBatch`.
///
/// # Errors
/// When `offsets` is not as long as `events`, or Arrow refuses the arrays.
pub fn raw_batch(
    events: &[DecisionEvent],
    kafka_cluster: &str,
    kafka_partition: i32,
    offsets: &[i64],
) -> Result<RecordBatch, ArrowError> {
    if events.len() != offsets.len() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} events but {} offsets",
            events.len(),
            offsets.len()
        )));
    }
    let mut b = RawBatchBuilder::with_capacity(events.len());
    for (e, &o) in events.iter().zip(offsets) {
        b.push(e, kafka_cluster, kafka_partition, o);
    }
    b.finish()
}
