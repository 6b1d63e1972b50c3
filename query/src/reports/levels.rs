//! The first levels of the reports over raw decisions, side by side: each one's rows (its
//! schema) and the SQL that makes them from the decisions, which the portable statements
//! run with filters over the whole range and the query service runs unfiltered over each
//! day, keeping the result (see [`crate::parts`]).
//!
//! The limit review's level (`review_parts`, each key's row) is the largest. Its levels,
//! each much smaller than the one before: decisions → per key × region × hour × bucket span
//! (a count and the quota only: the span level has the most groups, so it carries the
//! fewest columns) → per key × region × hour → per key × hour → per key. Refusals are
//! counted per key in a second read of the refused decisions alone (a few per cent of the
//! rows) and joined to the key's row: carried on the span level, they took the review over
//! the bench's 8.4 M rows past its 1 GiB per query. How a key's need and peak span are taken
//! against its region's share is described in [`super::wrong_limits`].

use crate::parts::{Fold, Level, Source, columns};
use crate::range::Range;
use crate::stored::level_table;

/// A level: its table function, its columns and its SQL, and its table in the lake under
/// `levels/<function>/` (see [`crate::stored`]).
macro_rules! level {
    ($function:literal, $columns:expr, $sql:expr) => {
        level!(@ $function, $columns, $sql, None)
    };
    ($function:literal, $columns:expr, $sql:expr, $fold:expr) => {
        level!(@ $function, $columns, $sql, Some($fold))
    };
    (@ $function:literal, $columns:expr, $sql:expr, $fold:expr) => {
        Level {
            function: $function,
            columns: $columns,
            sql: $sql,
            fold: $fold,
            source: Source::Decisions(level_table(
                $function,
                concat!("levels/", $function, "/"),
                || columns($columns),
            )),
        }
    };
}

/// Every first level over the decisions the reports keep in parts (and `verdict query
/// levels` stores).
pub const LEVELS: &[Level] = &[REVIEW, SHADOW, VERSIONS, DEGRADED, RATES];

/// Every first level over the rollup the reports keep in parts.
pub const ROLLUP_LEVELS: &[Level] = &[DEMAND, DENIED];

/// `demand-history`'s: each day's key-hours and requests per limit and bucket of demand,
/// from the hourly demand histogram. A report over a month reads 30 of these parts (a few
/// hundred rows each) instead of the month's files, 24 a day for the days the raw table
/// still holds (the rollup compacts a day into one file only once it is final).
pub const DEMAND: Level = Level {
    function: "demand_parts",
    columns: "date date, tier u8, route_class u8, bucket i32, keys i64, requests i64",
    sql: demand_part,
    fold: None,
    source: Source::Rollup("rollup/demand_hourly/"),
};

/// `top-denied`'s: each day's refusals, requests allowed and hours refused of every key
/// the rollup kept (the keys with refusals). A key's hours over several days are the sum
/// of its days' (an hour lies within one day).
pub const DENIED: Level = Level {
    function: "denied_parts",
    columns: "date date, key_id key, tier u8, route_class u8, denied i64, would_deny i64, \
              by_bucket i64, by_window i64, allowed i64, hours i64, first_denial time, \
              last_denial time",
    sql: denied_part,
    fold: None,
    source: Source::Rollup("rollup/denied_hourly/"),
};

/// [`DENIED`]'s rows over the hours of `range`.
fn denied_part(range: &Range, _: &Range) -> String {
    format!(
        "SELECT date, key_id, tier, route_class, SUM(denied) AS denied,
    SUM(would_deny) AS would_deny, SUM(denied_by_bucket) AS by_bucket,
    SUM(denied_by_window) AS by_window, SUM(allowed) AS allowed,
    verdict_count_distinct(hour) AS hours, MIN(first_denial) AS first_denial,
    MAX(last_denial) AS last_denial
  FROM denied_hourly
  WHERE {}
  GROUP BY date, key_id, tier, route_class",
        range.sql("hour", false)
    )
}

/// [`DEMAND`]'s rows over the hours of `range`.
fn demand_part(range: &Range, _: &Range) -> String {
    format!(
        "SELECT date, tier, route_class, CAST(bucket AS INT) AS bucket, SUM(keys) AS keys,
    SUM(requests) AS requests
  FROM demand_hourly
  WHERE {}
  GROUP BY date, tier, route_class, bucket",
        range.sql("hour", false)
    )
}

/// The columns of [`REVIEW`]'s rows.
const REVIEW_COLUMNS: &str = "tier u8, route_class u8, key_id key, requests i64, demand f64, peak_hour i64, \
              need f64, peak_span f64, quota_low f64, quota_high f64, quota_ceiling f64, \
              enforced u32, denied i64, would_deny i64, by_bucket i64, by_window i64, \
              home i64";

/// The limit review's (`wrong-limits`, `limit-outliers`): each key's requests, demand,
/// peaks, quotas and refusals.
pub const REVIEW: Level = level!("review_parts", REVIEW_COLUMNS, review_part, REVIEW_FOLD);

/// How [`REVIEW`]'s rows merge: a key's requests and refusals add up, its demand and peaks
/// are the largest, its lowest quota the smallest (see [`review_part`]).
pub const REVIEW_FOLD: Fold = Fold {
    group: "tier, route_class, key_id",
    aggregates: "SUM(requests) AS requests, MAX(demand) AS demand,
    MAX(peak_hour) AS peak_hour, MAX(need) AS need, MAX(peak_span) AS peak_span,
    MIN(quota_low) AS quota_low,
    MAX(quota_high) AS quota_high, MIN(quota_ceiling) AS quota_ceiling,
    MAX(enforced) AS enforced, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(by_bucket) AS by_bucket, SUM(by_window) AS by_window, MAX(home) AS home",
};

/// The columns of [`SHADOW`]'s rows.
const SHADOW_COLUMNS: &str = "tier u8, route_class u8, key_id key, requests i64, would_deny i64, \
              would_deny_by_bucket i64, would_deny_by_window i64";

/// `shadow-impact`'s: each key of a shadow limit, its requests and would-deny.
pub const SHADOW: Level = level!("shadow_parts", SHADOW_COLUMNS, shadow_part, SHADOW_FOLD);

/// How [`SHADOW`]'s rows merge: a key's counts add up.
pub const SHADOW_FOLD: Fold = Fold {
    group: "tier, route_class, key_id",
    aggregates: "SUM(requests) AS requests, SUM(would_deny) AS would_deny,
    SUM(would_deny_by_bucket) AS would_deny_by_bucket,
    SUM(would_deny_by_window) AS would_deny_by_window",
};

/// The columns of [`VERSIONS`]'s rows.
const VERSIONS_COLUMNS: &str = "tier u8, route_class u8, policy_version i64, requests i64, refused i64, \
              first_seen time, enforced u32";

/// `policy-changes`' (and the review's quota in force): each limit's requests, refusals,
/// first decision and largest regional quota per policy version.
pub const VERSIONS: Level = level!("version_parts", VERSIONS_COLUMNS, version_part);

/// The columns of [`DEGRADED`]'s rows.
const DEGRADED_COLUMNS: &str = "date date, hour i32, region u16, decisions i64, local_fallback i64, \
              kill_switch i64";

/// `degraded`'s: each hour and region's decisions, of the fallback and the kill switch.
pub const DEGRADED: Level = level!("degraded_parts", DEGRADED_COLUMNS, degraded_part);

/// The columns of [`RATES`]'s rows.
const RATES_COLUMNS: &str = "hour time, tier u8, route_class u8, requests i64, denied i64, would_deny i64, \
              policy_version i64";

/// `denial-rate`'s (over raw decisions, without a key): each limit's hourly counts.
pub const RATES: Level = level!("rate_parts", RATES_COLUMNS, rate_part);

/// [`SHADOW`]'s rows over the `decisions` of a block (what holds over the part is not read).
fn shadow_part(decisions: &Range, _: &Range) -> String {
    shadow_keys(&decisions.sql("event_time", true), "")
}

/// [`VERSIONS`]' rows over the `decisions` of a block.
fn version_part(decisions: &Range, _: &Range) -> String {
    version_counts(&decisions.sql("event_time", true), "")
}

/// [`DEGRADED`]'s rows over the `decisions` of a block.
fn degraded_part(decisions: &Range, _: &Range) -> String {
    degraded_counts(&decisions.sql("event_time", true), "", "")
}

/// [`RATES`]' rows over the `decisions` of a block.
fn rate_part(decisions: &Range, _: &Range) -> String {
    hourly_counts(&decisions.sql("event_time", true), "", "")
}

/// `level`'s kept parts of `range` merged: `aggregates` over them (`k`, with `AND k.…`
/// `filters`) grouped by `group`, a report's first level as its portable statement has it.
pub(super) fn merged(
    level: &Level,
    range: &Range,
    group: &str,
    aggregates: &str,
    filters: &str,
) -> String {
    format!(
        "SELECT {group}, {aggregates}
  FROM {} k
  WHERE TRUE{filters}
  GROUP BY {group}",
        level.call(range)
    )
}

/// 1 for a refused decision (denied or would-deny), else 0.
const REFUSED: &str = "CASE WHEN verdict <> 0 THEN 1 ELSE 0 END";

/// A key's home region is the region that sent its busiest hour: per hour the most
/// requests of one region times this plus the region's id, the largest over the hours,
/// modulo this. A maximum, so it merges over parts as the peaks do.
pub(super) const HOME_BASE: i64 = 65_536;

/// The `lim` CTE: each limit of the policy in force, and its bucket's time scale.
pub(super) const LIM: &str = "lim AS (
  SELECT tier_id, route_class_id, capacity, refill_per_s, hourly_quota, mode,
    GREATEST(1.0, CAST(capacity AS DOUBLE) / GREATEST(refill_per_s, 0.001)) AS span_s
  FROM policies
  WHERE kind = 'limit'
)";

/// The review's levels from the decisions within `range` (a condition on `x`, the decisions)
/// and `filters` (`AND x.…` conditions) up to one row per key: `lim AS (…), …, per_key AS
/// (…)`, with the key's requests, demand, peaks, quotas and refusals. `rounds` is the same
/// range as a condition on `reconcile_rounds`: whether the reconcile ran in it decides how
/// a key's need is counted (see the module's documentation).
pub(super) fn per_key_from_decisions(range: &str, rounds: &str, filters: &str) -> String {
    // In `shared`, the one-row tables come first: a cross join holds its left side in
    // memory, and DataFusion counts the aggregates' sliced batches at their buffers' size.
    format!(
        "{LIM}, d AS (
  SELECT x.tier, x.route_class, x.key_id, x.region, x.date, x.hour, x.window_quota,
    CAST(FLOOR(date_part('epoch', x.event_time) / l.span_s) AS BIGINT) AS span
  FROM decisions x
  JOIN lim l ON l.tier_id = x.tier AND l.route_class_id = x.route_class
  WHERE {range} AND x.source IN (0, 1){filters}
), refused AS (
  SELECT x.tier, x.route_class, x.key_id,
    SUM(CASE WHEN x.verdict = 1 THEN 1 ELSE 0 END) AS denied,
    SUM(CASE WHEN x.verdict = 2 THEN 1 ELSE 0 END) AS would_deny,
    SUM(CASE WHEN x.denied_by_bucket THEN 1 ELSE 0 END) AS by_bucket,
    SUM(CASE WHEN x.denied_by_window THEN 1 ELSE 0 END) AS by_window
  FROM decisions x
  WHERE {range} AND x.source IN (0, 1) AND x.verdict <> 0{filters}
  GROUP BY x.tier, x.route_class, x.key_id
), per_span AS (
  SELECT tier, route_class, key_id, region, date, hour, span, COUNT(*) AS requests,
    MAX(window_quota) AS quota
  FROM d
  GROUP BY tier, route_class, key_id, region, date, hour, span
), per_region_hour AS (
  SELECT tier, route_class, key_id, region, date, hour, SUM(requests) AS requests,
    MAX(requests) AS peak_span, MAX(quota) AS quota
  FROM per_span
  GROUP BY tier, route_class, key_id, region, date, hour
), reconciled AS (
  SELECT CASE WHEN COUNT(*) > 0 THEN 1 ELSE 0 END AS pooled, COALESCE(MAX(floor), 0.0) AS floor
  FROM reconcile_rounds
  WHERE {rounds}
), shared AS (
  SELECT h.*, COALESCE(g.share, u.share) AS static_share, r.pooled,
    CASE WHEN r.pooled = 1 THEN 1.0 - r.floor * (1.0 - COALESCE(g.share, u.share))
      ELSE COALESCE(g.share, u.share) END AS share
  FROM (SELECT share FROM regions WHERE region IS NULL) u
  CROSS JOIN reconciled r
  CROSS JOIN per_region_hour h
  LEFT JOIN regions g ON g.region = h.region
), per_hour AS (
  SELECT tier, route_class, key_id, date, hour, SUM(requests) AS requests,
    MAX(CAST(requests AS DOUBLE) / GREATEST(quota, 1)) AS demand,
    CASE WHEN MAX(pooled) = 1 THEN CAST(SUM(requests) AS DOUBLE) / MAX(share)
      ELSE MAX(CAST(requests AS DOUBLE) / share) END AS need,
    MAX(CAST(peak_span AS DOUBLE) / share) AS peak_span,
    MIN(CAST(quota AS DOUBLE) / static_share) AS quota_low,
    MAX(CAST(quota AS DOUBLE) / static_share) AS quota_high,
    MIN(CAST(quota + 1 AS DOUBLE) / static_share) AS quota_ceiling,
    MAX(quota) AS enforced,
    MAX(CAST(requests AS BIGINT) * {HOME_BASE} + CAST(region AS BIGINT)) AS home
  FROM shared
  GROUP BY tier, route_class, key_id, date, hour
), per_key_hours AS (
  SELECT h.tier, h.route_class, h.key_id, SUM(h.requests) AS requests,
    MAX(h.demand) AS demand, MAX(h.requests) AS peak_hour, MAX(h.need) AS need,
    MAX(h.peak_span) AS peak_span, MIN(h.quota_low) AS quota_low, MAX(h.quota_high) AS quota_high,
    MIN(h.quota_ceiling) AS quota_ceiling, MAX(h.enforced) AS enforced, MAX(h.home) AS home
  FROM per_hour h
  GROUP BY h.tier, h.route_class, h.key_id
), per_key AS (
  SELECT k.tier, k.route_class, k.key_id, k.requests, k.demand, k.peak_hour, k.need,
    k.peak_span, k.quota_low, k.quota_high, k.quota_ceiling, k.enforced, k.home,
    COALESCE(r.denied, 0) AS denied, COALESCE(r.would_deny, 0) AS would_deny,
    COALESCE(r.by_bucket, 0) AS by_bucket, COALESCE(r.by_window, 0) AS by_window
  FROM per_key_hours k
  LEFT JOIN refused r ON r.tier = k.tier AND r.route_class = k.route_class
    AND r.key_id = k.key_id
)"
    )
}

/// The SQL of one part of the review: every key's row over the decisions within `range` (a
/// condition on `x`, the decisions), unfiltered, so that one part serves every filter.
///
/// Parts merge ([`REVIEW_FOLD`]): a key's row over a range split at midnights is the sum of
/// its requests and refusals and the maximum of its demand and peaks (the minimum of its
/// lowest quota) over the parts, because every level below the key (the hour, the bucket's
/// span) lies within one part; a day's part is so folded from its hours' rows. Whether the
/// reconcile ran is read over the whole `part`, so an hour's rows are the day's part's.
/// [`crate::parts`] keeps each day's part.
fn review_part(decisions: &Range, part: &Range) -> String {
    format!(
        "WITH {}\nSELECT tier, route_class, key_id, requests, demand, peak_hour, need, peak_span, \
         quota_low, quota_high, quota_ceiling, enforced, denied, would_deny, by_bucket, \
         by_window, home FROM per_key",
        per_key_from_decisions(
            &decisions.sql("x.event_time", true),
            &part.sql("round_time", false),
            ""
        )
    )
}

/// The per-key level of `shadow-impact` over the decisions within `range` (a condition on
/// the decisions) with `filters`: each key of a shadow limit, its requests and would-deny.
pub(super) fn shadow_keys(range: &str, filters: &str) -> String {
    // Only the decisions of shadow limits are grouped by key: the semi-join drops the
    // others before the per-key aggregation, the report's main cost (about a fifth
    // less time in `verdict-bench query`; the final join alone gives the same rows).
    format!(
        "SELECT tier, route_class, key_id, COUNT(*) AS requests,
    SUM(CASE WHEN verdict = 2 THEN 1 ELSE 0 END) AS would_deny,
    SUM(CASE WHEN verdict = 2 AND denied_by_bucket THEN 1 ELSE 0 END) AS would_deny_by_bucket,
    SUM(CASE WHEN verdict = 2 AND denied_by_window THEN 1 ELSE 0 END) AS would_deny_by_window
  FROM decisions
  WHERE EXISTS (SELECT 1 FROM policies s WHERE s.kind = 'limit' AND s.mode = 'shadow'
      AND s.tier_id = decisions.tier AND s.route_class_id = decisions.route_class)
    AND {range}{filters}
  GROUP BY tier, route_class, key_id"
    )
}

/// The per-version level of `policy-changes` over the decisions (`x`) within `range` with
/// `filters`: each limit's requests, refusals, first decision and largest regional quota
/// under each policy version.
pub(super) fn version_counts(range: &str, filters: &str) -> String {
    format!(
        "SELECT tier, route_class, policy_version, COUNT(*) AS requests, SUM({REFUSED}) AS refused,
    MIN(event_time) AS first_seen, MAX(window_quota) AS enforced
  FROM decisions x
  WHERE {range} AND source IN (0, 1){filters}
  GROUP BY tier, route_class, policy_version"
    )
}

/// Each hour and region's decisions, and those of the fallback and the kill switch, over the
/// decisions within `range` (a condition on them) with `filters`, and `columns` after the
/// counts (`, …`).
pub(super) fn degraded_counts(range: &str, filters: &str, columns: &str) -> String {
    format!(
        "SELECT date, hour, region, COUNT(*) AS decisions,
  SUM(CASE WHEN source = 1 THEN 1 ELSE 0 END) AS local_fallback,
  SUM(CASE WHEN source = 2 THEN 1 ELSE 0 END) AS kill_switch{columns}
FROM decisions
WHERE {range}{filters}
GROUP BY date, hour, region"
    )
}

/// Each limit's hourly counts over the decisions within `range` (a condition on them) with
/// `filters`, and `columns` after the counts (`, …`).
pub(super) fn hourly_counts(range: &str, filters: &str, columns: &str) -> String {
    format!(
        "SELECT date_trunc('hour', event_time) AS hour, tier, route_class,
    COUNT(*) AS requests,
    SUM(CASE WHEN verdict = 1 THEN 1 ELSE 0 END) AS denied,
    SUM(CASE WHEN verdict = 2 THEN 1 ELSE 0 END) AS would_deny,
    MAX(policy_version) AS policy_version{columns}
  FROM decisions
  WHERE {range} AND source IN (0, 1){filters}
  GROUP BY date_trunc('hour', event_time), tier, route_class"
    )
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, TimeUnit};

    use super::*;

    #[test]
    fn every_level_spells_its_columns_and_their_types() {
        let types = |level: &Level| -> Vec<(String, DataType)> {
            let schema = level.schema();
            let fields = schema.fields().iter();
            fields
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect()
        };
        let review = types(&REVIEW);
        assert_eq!(review.len(), 17);
        assert_eq!(review[2], ("key_id".into(), DataType::FixedSizeBinary(16)));
        assert_eq!(review[16], ("home".into(), DataType::Int64));
        let utc_ms = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        assert_eq!(types(&VERSIONS)[5], ("first_seen".into(), utc_ms));
        assert_eq!(types(&DEGRADED)[0], ("date".into(), DataType::Date32));
        for level in LEVELS {
            assert!(types(level).iter().all(|(name, _)| !name.contains(' ')));
        }
    }
}
