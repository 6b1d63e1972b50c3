//! The hourly histogram of per-key demand, `rollup/demand_hourly/date=…/hour=…/`: per
//! tier × route class × region, how many keys had each level of demand (requests in the hour
//! over the quota they had) in log-spaced buckets (see
//! [`verdict_schemas::tables::demand_bucket`]). The denied-only rollup keeps only the keys
//! that were refused, which cannot say that a limit is too high; this histogram, a few KB an
//! hour whatever the number of keys, can, over the rollup's five years.
//!
//! It is a Delta table of its own, partitioned by `date` like `denied_hourly`, and an
//! hour's file is written beside the denied rollup's whenever an hour is rolled up, from
//! the same raw files, and replaced in the same way (see [`crate::hour`]). [`DEMAND_SQL`]
//! defines it; [`crate::fold`] computes it in the pass that finds the refused keys.

use std::sync::Arc;

use arrow::array::{RecordBatch, TimestampMillisecondArray};
use object_store::path::Path;
use verdict_schemas::layout::HourPartition;
use verdict_schemas::tables::{demand_hourly_schema, raw_schema};

use crate::error::RollupError;
use crate::hour::Rollup;
use crate::output::conform;
use crate::sources::HourFiles;

/// The histogram of the table `raw` (one hour). Plain SQL; a split key's quota is the
/// whole of it (the per-sub-key quota times the split), and decisions of the kill switch
/// and of mode off are left out, as in the limit review.
pub const DEMAND_SQL: &str = "\
WITH k AS (
  SELECT tier, route_class, region, key_id, COUNT(*) AS requests,
    MAX(CAST(window_quota AS BIGINT) * sub_keys) AS quota
  FROM raw
  WHERE source IN (0, 1)
  GROUP BY tier, route_class, region, key_id
), b AS (
  SELECT tier, route_class, region, requests, quota,
    CAST(GREATEST(-40.0, LEAST(24.0, FLOOR(4.0 * LOG2(CAST(requests AS DOUBLE) / GREATEST(quota, 1))))) AS SMALLINT) AS bucket
  FROM k
)
SELECT tier, route_class, region, bucket, COUNT(*) AS keys, SUM(requests) AS requests,
  MAX(quota) AS window_quota
FROM b
GROUP BY tier, route_class, region, bucket
ORDER BY tier, route_class, region, bucket";

impl Rollup {
    /// The demand histogram of `files` (one hour's raw files a reader takes) as one batch
    /// in the `demand_hourly` schema, by DataFusion running [`DEMAND_SQL`]: the histogram's
    /// definition, which the tests hold [`crate::fold`] to.
    pub async fn compute_demand_sql(
        &self,
        hour: HourPartition,
        files: &HourFiles,
    ) -> Result<RecordBatch, RollupError> {
        let schema = demand_hourly_schema();
        if files.files.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let paths: Vec<&Path> = files.files.iter().map(|f| &f.meta.location).collect();
        let ctx = self.session_over("raw", &paths, &raw_schema()).await?;
        let batches = ctx.sql(DEMAND_SQL).await?.collect().await?;
        let start = hour.start_ms();
        conform(&schema, &batches, |rows| {
            Arc::new(TimestampMillisecondArray::from(vec![start; rows]).with_timezone("UTC"))
        })
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int16Array, Int64Array, UInt8Array, UInt16Array, UInt32Array};
    use verdict_schemas::tables::{DEMAND_MAX_BUCKET, DEMAND_MIN_BUCKET};

    use super::*;
    use verdict_lake::files::encode_rollup_parquet;

    /// The histogram's size at the design's scale: its rows do not grow with the keys, only
    /// with tiers × route classes × regions × buckets. The design has 4 tiers, 5 route
    /// classes and 3 regions; every one of the 65 buckets filled is the most an hour holds.
    #[test]
    fn a_day_of_full_histograms_at_the_designs_shape_is_under_a_megabyte() {
        let mut cols = (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for tier in 0..4u8 {
            for route in 0..5u8 {
                for region in 0..3u16 {
                    for bucket in DEMAND_MIN_BUCKET..=DEMAND_MAX_BUCKET {
                        // Key counts of 10 M callers spread over the buckets.
                        let keys = 50_000
                            + i64::from(tier) * 7_919
                            + ((i64::from(bucket) + 100) * 104_729) % 90_000;
                        cols.0.push(tier);
                        cols.1.push(route);
                        cols.2.push(region);
                        cols.3.push(bucket);
                        cols.4.push(keys);
                        cols.5.push(keys * 37 + i64::from(route));
                        cols.6.push(1_000 * (u32::from(tier) + 1));
                    }
                }
            }
        }
        let rows = cols.0.len();
        let start = 1_796_047_200_000i64;
        let batch = RecordBatch::try_new(
            demand_hourly_schema(),
            vec![
                Arc::new(TimestampMillisecondArray::from(vec![start; rows]).with_timezone("UTC")),
                Arc::new(UInt8Array::from(cols.0)),
                Arc::new(UInt8Array::from(cols.1)),
                Arc::new(UInt16Array::from(cols.2)),
                Arc::new(Int16Array::from(cols.3)),
                Arc::new(Int64Array::from(cols.4)),
                Arc::new(Int64Array::from(cols.5)),
                Arc::new(UInt32Array::from(cols.6)),
            ],
        )
        .unwrap();
        let bytes = encode_rollup_parquet(&batch).unwrap().len();
        let per_day = 24 * bytes;
        println!("demand histogram: {rows} rows, {bytes} bytes an hour, {per_day} bytes a day");
        assert_eq!(rows, 3_900);
        assert!(per_day <= 1_000_000, "{per_day} bytes a day");
    }
}
