//! `demand-history`: whether a limit is too high, over any range of the rollup's five years,
//! from the hourly demand histogram.

use chrono::{DateTime, Utc};

use super::levels::{DEMAND, merged};
use super::params::{Args, FROM, ParamSpec, ROUTE, Report, TIER, TO, limit_join};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "demand-history",
        sql,
        description: "Whether a limit is too high, over any range of the rollup's five \
            years: per tier × route class, the distribution of key-hours by demand (requests \
            in the hour over the quota the key had) from the hourly demand histogram, \
            `demand_p50` … `demand_max` (each the upper bound of its log-spaced bucket, \
            within a factor of 1.19). Verdict: `too high` when even the p99 key-hour uses \
            less than `too_high_use` of the quota, `not enough data` below `min_key_hours` \
            key-hours, else `not too high` (the `wrong-limits` review over the raw table's \
            seven days says whether it is too low or fine).",
        tables: &["demand_hourly", "policies"],
        params: vec![
            ParamSpec {
                doc: "start, inclusive (default: `to` minus 30 days)",
                ..FROM
            },
            TO,
            TIER,
            ROUTE,
            ParamSpec::number(
                "too_high_use",
                "0.5",
                "demand under which the p99 key-hour makes the limit too high",
            ),
            ParamSpec::integer(
                "min_key_hours",
                "100",
                "key-hours a limit needs to be judged",
            ),
        ],
    }
}

/// The SQL of `demand-history`: nearest-rank percentiles over the histogram's buckets, each
/// the upper bound of the first bucket whose running count of key-hours reaches the rank.
/// The query service reads each day's key-hours per bucket from kept parts
/// ([`DEMAND`]); the portable statement sums the histogram's rows.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 30)?;
    let per_bucket = if a.portable {
        format!(
            "SELECT tier, route_class, bucket, SUM(keys) AS keys, SUM(requests) AS requests
  FROM demand_hourly
  WHERE {}{}
  GROUP BY tier, route_class, bucket",
            range.sql("hour", false),
            a.filters("")?
        )
    } else {
        merged(
            &DEMAND,
            &range,
            "tier, route_class, bucket",
            "SUM(keys) AS keys, SUM(requests) AS requests",
            &a.filters("k.")?,
        )
    };
    let too_high = a.number("too_high_use")?;
    let min_key_hours = a.integer("min_key_hours")?.unwrap_or(100).max(1);
    let upper = |b: &str| format!("POWER(2.0, CAST({b} + 1 AS DOUBLE) / 4.0)");
    let rank = |q: f64| format!("MIN(CASE WHEN cum >= CEIL({q} * total) THEN bucket END)");
    Ok(format!(
        "WITH b AS (
  {per_bucket}
), c AS (
  SELECT tier, route_class, bucket, keys, requests,
    SUM(keys) OVER (PARTITION BY tier, route_class ORDER BY bucket
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
    SUM(keys) OVER (PARTITION BY tier, route_class) AS total
  FROM b
), l AS (
  SELECT tier, route_class, MAX(total) AS key_hours, SUM(requests) AS requests,
    {b50} AS b50, {b90} AS b90, {b99} AS b99, MAX(bucket) AS bmax
  FROM c
  GROUP BY tier, route_class
)
SELECT l.tier AS tier_id, p.tier, l.route_class AS route_class_id, p.route_class, p.mode,
  p.hourly_quota, l.key_hours, l.requests,
  {p50} AS demand_p50, {p90} AS demand_p90, {p99} AS demand_p99, {pmax} AS demand_max,
  CASE WHEN l.key_hours < {min_key_hours} THEN 'not enough data'
       WHEN {p99} < {too_high} THEN 'too high'
       ELSE 'not too high' END AS verdict
FROM l
{join}
ORDER BY l.tier, l.route_class",
        b50 = rank(0.5),
        b90 = rank(0.9),
        b99 = rank(0.99),
        p50 = upper("l.b50"),
        p90 = upper("l.b90"),
        p99 = upper("l.b99"),
        pmax = upper("l.bmax"),
        join = limit_join("l"),
    ))
}
