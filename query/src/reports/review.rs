//! The limit review (`wrong-limits`): per tier × route class, and per key with an override,
//! the distribution of the active keys' demand against the limit, refusals split and
//! attributed, a verdict with its reason in words, and a recommended limit.
//!
//! It is SQL over `decisions` and `policies` that uses nothing but CTEs, window functions and
//! arithmetic: percentiles are nearest-rank, taken as the smallest value whose rank is at
//! least ⌈p·n⌉, rather than an engine's own percentile function.
//!
//! The levels, each much smaller than the one before: decisions → per key × region × hour ×
//! bucket span (a count and the quota only: the span level has the most groups, so it
//! carries the fewest columns) → per key × region × hour → per key × hour → per key → per
//! limit. Refusals are counted per key in a second read of the refused decisions alone (a
//! few per cent of the rows) and joined to the key's row: carried on the span level, they
//! took the review over the bench's 8.4 M rows past its 1 GiB per query.
//!
//! With several regions, a key's need (the global quota its busiest hour calls for) and its
//! peak span are taken against the share of the limit its region can hold, as the limiter
//! enforces shares over the range. On static shares (no round of the reconcile recorded in
//! the range, `reconcile_rounds`), each region holds its weight's share alone: the need is
//! the most any region's requests in the hour call for over its share. With the reconcile,
//! the regions pool the global quota (a round gives a key's quota to where its traffic is,
//! and keeps what a region already used there): the need is the key's requests in the hour
//! over all regions, over the most a round gives one region (all but the others' floor,
//! `1 - floor × (1 - share)`). A burst is one region's either way, over what its region can
//! hold.
//!
//! The levels up to the key are nearly all of the work (seconds over a week of raw
//! decisions), and they merge across midnights. So the query service reads each key's row
//! from `review_parts(from, to)` ([`crate::parts`]): the range cut at midnights, each piece's
//! rows computed by [`part_sql`] once and kept while the piece's files and the policy stay
//! the same. The statement that reads the decisions all the way ([`KeysFrom::Decisions`])
//! is the portable one, which the benchmark runs in DuckDB too, and gives the same rows.

use super::{Args, QueryError, Range, merged, version_counts};
use crate::parts::Level;

/// The review's thresholds, checked (see the report's parameters for their meaning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ReviewParams {
    percentile: f64,
    too_low_share: f64,
    too_high_use: f64,
    constrained_share: f64,
    engaged_use: f64,
    min_keys: i64,
    headroom: f64,
}

impl ReviewParams {
    pub(super) fn of(a: &Args<'_>) -> Result<Self, QueryError> {
        let share = |name: &str, lo: f64, hi: f64| -> Result<f64, QueryError> {
            let v = a.number(name)?;
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(QueryError::Invalid(format!(
                    "parameter {name}: {v} is out of range ({lo} to {hi})"
                )))
            }
        };
        let min_keys = a.integer("min_keys")?.unwrap_or(10);
        if !(1..=1_000_000).contains(&min_keys) {
            return Err(QueryError::Invalid(format!(
                "parameter min_keys: {min_keys} is out of range (1 to 1000000)"
            )));
        }
        Ok(Self {
            percentile: share("percentile", 0.01, 1.0)?,
            too_low_share: share("too_low_share", 0.0, 1.0)?,
            too_high_use: share("too_high_use", 0.0, 1.0)?,
            constrained_share: share("constrained_share", 0.0001, 1.0)?,
            engaged_use: share("engaged_use", 0.0, 10.0)?,
            min_keys,
            headroom: share("headroom", 1.0, 10.0)?,
        })
    }
}

/// A number rounded to two significant digits, as SQL over a positive `x` (at least 1).
fn two_digits(x: &str) -> String {
    format!(
        "GREATEST(1, CAST(ROUND(({x}) / POWER(10.0, FLOOR(LOG10(GREATEST(({x}), 1.0))) - 1)) \
         * POWER(10.0, FLOOR(LOG10(GREATEST(({x}), 1.0))) - 1) AS BIGINT))"
    )
}

/// `x` as text with two decimals at most, as SQL.
fn two_decimals(x: &str) -> String {
    format!("CAST(ROUND(({x}), 2) AS VARCHAR)")
}

/// `x` (a share) as a whole percentage, as SQL.
fn percent(x: &str) -> String {
    format!("CAST(CAST(ROUND(100.0 * ({x})) AS BIGINT) AS VARCHAR)")
}

/// A key's home region is the region that sent its busiest hour: per hour the most
/// requests of one region times this plus the region's id, the largest over the hours,
/// modulo this. A maximum, so it merges over parts as the peaks do.
const HOME_BASE: i64 = 65_536;

/// How much larger a region's part of a limit's constrained keys must be than its part of
/// the limit's keys, at least, for the reason of a limit too low to name it (it must also
/// hold half of the constrained keys at least).
pub const DRIVING_RATIO: f64 = 1.5;

/// The `lim` CTE: each limit of the policy in force, and its bucket's time scale.
const LIM: &str = "lim AS (
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
fn per_key_from_decisions(range: &str, rounds: &str, filters: &str) -> String {
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
/// Parts merge: a key's row over a range split at midnights is the sum of its requests and
/// refusals and the maximum of its demand and peaks (the minimum of its lowest quota) over
/// the parts, because every level below the key (the hour, the bucket's span) lies within
/// one part. See [`crate::parts`], which keeps each day's part.
pub fn part_sql(range: &Range) -> String {
    format!(
        "WITH {}\nSELECT tier, route_class, key_id, requests, demand, peak_hour, need, peak_span, \
         quota_low, quota_high, quota_ceiling, enforced, denied, would_deny, by_bucket, \
         by_window, home FROM per_key",
        per_key_from_decisions(
            &range.sql("x.event_time", true),
            &range.sql("round_time", false),
            ""
        )
    )
}

/// The `per_key` CTE over the review's kept parts of `range`, with `filters` (`AND k.…`
/// conditions).
fn per_key_from_parts(range: &Range, filters: &str) -> String {
    let merged = merged(
        Level::Review,
        range,
        "tier, route_class, key_id",
        "SUM(requests) AS requests, MAX(demand) AS demand,
    MAX(peak_hour) AS peak_hour, MAX(need) AS need, MAX(peak_span) AS peak_span,
    MIN(quota_low) AS quota_low,
    MAX(quota_high) AS quota_high, MIN(quota_ceiling) AS quota_ceiling,
    MAX(enforced) AS enforced, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(by_bucket) AS by_bucket, SUM(by_window) AS by_window, MAX(home) AS home",
        filters,
    );
    format!("{LIM}, per_key AS (\n  {merged}\n)")
}

/// Where the review reads each key's row from.
#[derive(Debug, Clone)]
pub(super) enum KeysFrom {
    /// The decisions within a range with `AND x.…` filters: one statement, portable to
    /// DuckDB.
    Decisions { range: Range, filters: String },
    /// The query service's kept parts of a range, with `AND k.…` filters.
    Parts { range: Range, filters: String },
}

impl KeysFrom {
    /// Each limit's largest regional quota under each policy version in the range
    /// (`policy-changes`' level): `tier, route_class, policy_version, enforced`, …
    fn versions(&self) -> String {
        match self {
            Self::Decisions { range, .. } => version_counts(&range.sql("x.event_time", true), ""),
            Self::Parts { range, .. } => merged(
                Level::Versions,
                range,
                "tier, route_class, policy_version",
                "MAX(enforced) AS enforced",
                "",
            ),
        }
    }

    fn ctes(&self) -> String {
        match self {
            Self::Decisions { range, filters } => per_key_from_decisions(
                &range.sql("x.event_time", true),
                &range.sql("round_time", false),
                filters,
            ),
            Self::Parts { range, filters } => per_key_from_parts(range, filters),
        }
    }
}

/// The review's common part, up to each key flagged engaged or constrained: `WITH lim AS
/// (…), …, flagged AS (…)`.
fn flagged(keys: &KeysFrom, p: &ReviewParams) -> String {
    let ReviewParams {
        constrained_share,
        engaged_use,
        ..
    } = *p;
    format!(
        "WITH {ctes}, keyed AS (
  SELECT k.tier, k.route_class, o.key_id AS override_key, k.key_id, k.requests,
    k.denied, k.would_deny, k.by_bucket, k.by_window, k.denied + k.would_deny AS refused,
    k.demand, k.peak_hour, k.need, k.quota_low, k.quota_high, k.quota_ceiling, k.enforced, l.span_s,
    k.home % {HOME_BASE} AS home_region,
    COALESCE(o.capacity, l.capacity) AS capacity,
    COALESCE(o.refill_per_s, l.refill_per_s) AS refill_per_s,
    COALESCE(o.hourly_quota, l.hourly_quota) AS hourly_quota,
    COALESCE(o.mode, l.mode) AS mode,
    k.peak_span / GREATEST(1, COALESCE(o.capacity, l.capacity)) AS burst
  FROM per_key k
  JOIN lim l ON l.tier_id = k.tier AND l.route_class_id = k.route_class
  LEFT JOIN policies o ON o.kind = 'override' AND o.key_id = k.key_id
    AND o.route_class_id = k.route_class
), flagged AS (
  SELECT *,
    (demand >= {engaged_use} OR burst >= {engaged_use}) AS engaged,
    (refused > 0 AND refused >= {constrained_share} * requests) AS constrained
  FROM keyed
)",
        ctes = keys.ctes(),
    )
}

/// The review's common part, up to each key ranked within its limit: `WITH lim AS (…), …,
/// ranked AS (…` (the last CTE left open, for the caller to close).
fn keyed(keys: &KeysFrom, p: &ReviewParams) -> String {
    let limit = LIMIT;
    format!(
        "{flagged}, ranked AS (
  SELECT *,
    COUNT(*) OVER (PARTITION BY {limit}) AS n,
    SUM(CASE WHEN engaged THEN 1 ELSE 0 END) OVER (PARTITION BY {limit}) AS n_engaged,
    ROW_NUMBER() OVER (PARTITION BY {limit} ORDER BY demand, key_id) AS rn_demand,
    ROW_NUMBER() OVER (PARTITION BY {limit} ORDER BY burst, key_id) AS rn_burst,
    ROW_NUMBER() OVER (PARTITION BY {limit}, engaged ORDER BY demand, key_id) AS rn_e_demand,
    ROW_NUMBER() OVER (PARTITION BY {limit}, engaged ORDER BY burst, key_id) AS rn_e_burst,
    ROW_NUMBER() OVER (PARTITION BY {limit}, engaged ORDER BY need, key_id) AS rn_e_need,
    ROW_NUMBER() OVER (PARTITION BY {limit} ORDER BY need, key_id) AS rn_need,
    ROW_NUMBER() OVER (PARTITION BY {limit} ORDER BY refused DESC, key_id) AS rn_refused
  FROM flagged",
        flagged = flagged(keys, p),
    )
}

/// How far apart (as a ratio) the largest regional quotas of two policy versions must be
/// for the review to say the quota in force changed (see `review_sql`).
pub const VERSION_QUOTA_RATIO: f64 = 1.1;

/// A limit's identity in the review: its tier × route class, and the key of an override.
const LIMIT: &str = "tier, route_class, override_key";

/// The SQL of `limit-outliers`: per limit, the top 1 % of its keys by refusals (at least
/// one, and only keys that were refused), with their demand and burst.
pub(super) fn outliers_sql(keys: &KeysFrom, p: &ReviewParams) -> String {
    format!(
        "{ctes}
)
SELECT r.tier AS tier_id, pl.tier, r.route_class AS route_class_id, pl.route_class,
  r.override_key, r.key_id, r.requests, r.denied, r.would_deny, r.by_bucket AS refused_by_bucket,
  r.by_window AS refused_by_window,
  CAST(r.refused AS DOUBLE) / r.requests AS refusal_rate,
  CAST(r.refused AS DOUBLE) / r.limit_refused AS share_of_refusals,
  r.demand, r.burst, r.peak_hour, r.hourly_quota, r.capacity, r.n AS keys_in_limit
FROM (SELECT *, SUM(refused) OVER (PARTITION BY {LIMIT}) AS limit_refused FROM ranked) r
LEFT JOIN policies pl ON pl.kind = 'limit' AND pl.tier_id = r.tier AND pl.route_class_id = r.route_class
WHERE r.refused > 0 AND r.rn_refused <= GREATEST(1, CEIL(0.01 * r.n))
ORDER BY r.tier, r.route_class, r.override_key NULLS FIRST, r.refused DESC, r.key_id",
        ctes = keyed(keys, p),
    )
}

/// The nearest-rank percentile `q` of `v` among a limit's keys (only the engaged ones when
/// `engaged`): the smallest value ranked at least ⌈q·n⌉, by the window functions' ranks
/// (`rn_…` of `ranked`) or by `verdict_nearest_rank` (see `crate::ranks`).
fn nearest_rank(windows: bool, v: &str, q: f64, engaged: bool) -> String {
    if windows {
        let (cond, rn, n) = if engaged {
            ("engaged AND ", format!("rn_e_{v}"), "n_engaged")
        } else {
            ("", format!("rn_{v}"), "n")
        };
        return format!("MIN(CASE WHEN {cond}{rn} >= CEIL({q} * {n}) THEN {v} END)");
    }
    let x = if engaged {
        format!("CASE WHEN engaged THEN CAST({v} AS DOUBLE) END")
    } else {
        format!("CAST({v} AS DOUBLE)")
    };
    format!("verdict_nearest_rank({x}, {q})")
}

/// The review's SQL over each key's row from `keys`.
pub(super) fn review_sql(keys: &KeysFrom, p: &ReviewParams) -> String {
    let ReviewParams {
        percentile,
        too_low_share,
        too_high_use,
        min_keys,
        headroom,
        ..
    } = *p;
    let pct_name = format!("p{}", (percentile * 100.0).round() as i64);
    let limit = LIMIT;
    // Keys read from the decisions are ranked with window functions (the portable
    // statement); keys read from kept parts with the service's own aggregates, which give
    // the same values (see `crate::ranks`).
    let windows = matches!(keys, KeysFrom::Decisions { .. });
    let nearest = |v: &str, q: f64, engaged: bool| nearest_rank(windows, v, q, engaged);
    let mut dist = String::new();
    for v in ["demand", "burst"] {
        for (suffix, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            dist += &format!(",\n    {} AS {v}_{suffix}", nearest(v, q, false));
        }
        dist += &format!(",\n    MAX({v}) AS {v}_max");
    }
    let typical_demand = nearest("demand", percentile, true);
    let typical_burst = nearest("burst", percentile, true);
    let need_p99 = nearest("need", 0.99, true);
    let peak_burst_p99 = nearest("burst", 0.99, true);
    let all_need_p99 = nearest("need", 0.99, false);
    let (ctes, source, outlier_keys, outlier_refused) = if windows {
        (
            format!("{}\n)", keyed(keys, p)),
            "ranked",
            "CAST(MAX(GREATEST(1, CEIL(0.01 * n))) AS BIGINT)",
            "SUM(CASE WHEN rn_refused <= GREATEST(1, CEIL(0.01 * n)) THEN refused ELSE 0 END)",
        )
    } else {
        (
            flagged(keys, p),
            "flagged",
            "CAST(GREATEST(1, CEIL(0.01 * COUNT(*))) AS BIGINT)",
            "CAST(verdict_top_sum(CAST(refused AS DOUBLE), 0.01) AS BIGINT)",
        )
    };
    let verdict = format!(
        "CASE WHEN l.override_key IS NULL AND l.keys < {min_keys} THEN 'not enough data'
       WHEN (l.typical_demand > 1.0 OR l.typical_burst > 1.0)
         AND l.constrained_keys >= {too_low_share} * l.keys THEN 'too low'
       WHEN l.demand_p99 < {too_high_use} AND l.burst_p99 < {too_high_use}
         AND l.constrained_keys = 0 THEN 'too high'
       ELSE 'fine' END"
    );
    let needs = format!(
        "'{pct_name} engaged key needs ' || {} || '× the hourly quota and ' || {} || '× the bucket'",
        two_decimals("COALESCE(l.typical_demand, 0.0)"),
        two_decimals("COALESCE(l.typical_burst, 0.0)"),
    );
    let constrained = format!(
        "{} || ' % of keys constrained'",
        percent("CAST(l.constrained_keys AS DOUBLE) / l.keys")
    );
    let outliers = format!(
        "CASE WHEN l.refused > 0 THEN '; the top 1 % of keys (' || CAST(l.outlier_keys AS VARCHAR) \
         || ') made ' || {} || ' % of the refusals' ELSE '' END",
        percent("CAST(l.outlier_refused AS DOUBLE) / l.refused")
    );
    // The quota in force changed only where the policy did (two versions in the range) and
    // where the regions' quotas say so twice: over their static shares they disagree (a
    // region's quota is its share of the global one rounded down, so q / share lies within
    // 1 / share below the global quota, and those ranges do not meet), and the largest
    // regional quota of one version is more than a tenth off another's. The reconcile moves
    // a key's regional quota between rounds, which the first test alone takes for a
    // change; under it, the largest regional quota of each version is its global quota
    // times the largest share any key's region was given (which stays near the whole while
    // some key's traffic is in one region), so a change of less than a tenth is not named.
    let changed = format!(
        "CASE WHEN l.versions > 1 AND l.quota_high > l.quota_ceiling \
           AND l.enforced_high > {VERSION_QUOTA_RATIO} * l.enforced_low \
         THEN '; the quota in force changed in the range (policy versions with regional quotas up to ' \
         || CAST(l.enforced_low AS VARCHAR) || ' and up to ' \
         || CAST(l.enforced_high AS VARCHAR) || ')' ELSE '' END"
    );
    // A region drives a verdict of too low when it holds most of the constrained keys and
    // clearly fewer of the keys: its keys meet the limit where the others' do not (its
    // share is too small for them, or its keys send more). The region holding the most
    // constrained keys is found with window functions over the keys already ranked, so
    // that the keys' levels are computed once (a second reference to them is a second
    // scan of the decisions).
    let driving = format!(
        "CASE WHEN l.constrained_keys > 0 \
           AND l.region_constrained >= 0.5 * l.constrained_keys \
           AND CAST(l.region_constrained AS DOUBLE) / l.constrained_keys \
             >= {DRIVING_RATIO} * CAST(l.region_keys AS DOUBLE) / l.keys \
         THEN '; ' || COALESCE(l.region_name, 'region ' || CAST(l.home_region AS VARCHAR)) \
           || '''s keys are ' || {} || ' % of those constrained and ' || {} || ' % of the keys' \
         ELSE '' END",
        percent("CAST(l.region_constrained AS DOUBLE) / l.constrained_keys"),
        percent("CAST(l.region_keys AS DOUBLE) / l.keys"),
    );
    let reason = format!(
        "CASE WHEN l.override_key IS NULL AND l.keys < {min_keys} THEN CAST(l.keys AS VARCHAR) \
           || ' active keys, fewer than the ' || CAST({min_keys} AS VARCHAR) || ' needed to judge'
       WHEN (l.typical_demand > 1.0 OR l.typical_burst > 1.0)
         AND l.constrained_keys >= {too_low_share} * l.keys THEN {needs} || '; ' || {constrained} \
           || {driving} || {changed}
       WHEN l.demand_p99 < {too_high_use} AND l.burst_p99 < {too_high_use}
         AND l.constrained_keys = 0 THEN 'p99 key uses ' || {p99d} || '× the hourly quota and ' \
           || {p99b} || '× the bucket; no key constrained'
       ELSE {needs} || '; ' || {constrained} || {outliers} || {changed} END",
        p99d = two_decimals("l.demand_p99"),
        p99b = two_decimals("l.burst_p99"),
    );
    let versions = keys.versions();
    let judged = "v.verdict IN ('too low', 'too high')";
    // Scaling capacity and refill by the same factor keeps the bucket's time scale, and scales
    // what it admits in one span by that factor: the burst (a share of that) says how much.
    let rec_quota = two_digits(&format!(
        "COALESCE(v.need_p99, v.all_need_p99) * {headroom}"
    ));
    let rec_capacity = two_digits(&format!(
        "COALESCE(v.peak_burst_p99, v.burst_p99) * {headroom} * v.capacity"
    ));
    format!(
        "{ctes}, regional AS (
  SELECT *,
    COUNT(*) OVER (PARTITION BY {limit}, home_region) AS in_region,
    SUM(CASE WHEN constrained THEN 1 ELSE 0 END) OVER (PARTITION BY {limit}, home_region)
      AS constrained_in_region
  FROM {source}
), driven AS (
  SELECT *,
    FIRST_VALUE(home_region) OVER (PARTITION BY {limit}
      ORDER BY constrained_in_region DESC, home_region) AS top_region,
    FIRST_VALUE(constrained_in_region) OVER (PARTITION BY {limit}
      ORDER BY constrained_in_region DESC, home_region) AS top_constrained,
    FIRST_VALUE(in_region) OVER (PARTITION BY {limit}
      ORDER BY constrained_in_region DESC, home_region) AS top_keys
  FROM regional
), per_limit AS (
  SELECT {limit}, MAX(mode) AS mode, MAX(capacity) AS capacity,
    MAX(refill_per_s) AS refill_per_s, MAX(hourly_quota) AS hourly_quota, MAX(span_s) AS span_s,
    MIN(quota_low) AS quota_low, MAX(quota_high) AS quota_high,
    MIN(quota_ceiling) AS quota_ceiling, MAX(enforced) AS enforced,
    COUNT(*) AS keys, SUM(CASE WHEN engaged THEN 1 ELSE 0 END) AS engaged_keys,
    SUM(CASE WHEN constrained THEN 1 ELSE 0 END) AS constrained_keys,
    SUM(requests) AS requests, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(by_bucket) AS refused_by_bucket, SUM(by_window) AS refused_by_window,
    SUM(refused) AS refused,
    {outlier_keys} AS outlier_keys,
    {outlier_refused} AS outlier_refused{dist},
    {typical_demand} AS typical_demand,
    {typical_burst} AS typical_burst,
    {need_p99} AS need_p99,
    {peak_burst_p99} AS peak_burst_p99,
    {all_need_p99} AS all_need_p99,
    MAX(top_region) AS home_region, MAX(top_constrained) AS region_constrained,
    MAX(top_keys) AS region_keys
  FROM driven
  GROUP BY {limit}
), version_quotas AS (
  SELECT tier, route_class, COUNT(*) AS versions, MIN(enforced) AS enforced_low,
    MAX(enforced) AS enforced_high
  FROM ({versions}) v
  GROUP BY tier, route_class
), judged AS (
  SELECT l.*, {verdict} AS verdict, {reason} AS reason
  FROM (SELECT p.*, q.versions, q.enforced_low, q.enforced_high, g.name AS region_name
    FROM per_limit p
    LEFT JOIN version_quotas q ON q.tier = p.tier AND q.route_class = p.route_class
    LEFT JOIN regions g ON g.region = p.home_region) l
)
SELECT v.tier AS tier_id, p.tier, v.route_class AS route_class_id, p.route_class,
  v.override_key, v.mode, v.hourly_quota, v.enforced AS enforced_quota, v.capacity,
  v.refill_per_s, v.keys, v.engaged_keys, v.constrained_keys,
  CAST(v.constrained_keys AS DOUBLE) / v.keys AS share_keys_constrained,
  v.requests, v.denied, v.would_deny, v.refused_by_bucket, v.refused_by_window,
  CAST(v.refused AS DOUBLE) / v.requests AS refusal_rate,
  v.outlier_keys,
  CASE WHEN v.refused > 0 THEN CAST(v.outlier_refused AS DOUBLE) / v.refused ELSE 0.0 END AS outlier_refusal_share,
  v.demand_p50, v.demand_p90, v.demand_p99, v.demand_max,
  v.burst_p50, v.burst_p90, v.burst_p99, v.burst_max,
  v.verdict, v.reason,
  CASE WHEN {judged} THEN {rec_quota} ELSE v.hourly_quota END AS recommended_quota,
  CASE WHEN {judged} THEN {rec_capacity} ELSE v.capacity END AS recommended_capacity,
  CASE WHEN {judged} THEN v.refill_per_s * {rec_capacity} / GREATEST(v.capacity, 1)
       ELSE v.refill_per_s END AS recommended_refill_per_s
FROM judged v
LEFT JOIN policies p ON p.kind = 'limit' AND p.tier_id = v.tier AND p.route_class_id = v.route_class
ORDER BY v.tier, v.route_class, v.override_key NULLS FIRST"
    )
}
