//! What the limit review's two reports share (`wrong-limits` and `limit-outliers`): their
//! thresholds, where each key's row is read from, and the levels above the key, up to each
//! key flagged engaged or constrained and ranked within its limit.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::levels::{
    self, LIM, REVIEW, REVIEW_FOLD, merged, per_key_from_decisions, version_counts,
};
use super::params::{Args, Names, ParamSpec};
use crate::error::QueryError;
use crate::range::Range;

/// The review's thresholds, as parameters (see `wrong-limits`' documentation for their
/// meaning): `limit-outliers` takes them at their defaults, so that the keys it names are
/// those the review counts as constrained.
pub(super) fn thresholds() -> Vec<ParamSpec> {
    vec![
        ParamSpec::number(
            "percentile",
            "0.9",
            "which engaged key is the typical one: its demand above 1.0 makes the limit too low",
        ),
        ParamSpec::number(
            "too_low_share",
            "0.1",
            "share of the keys constrained at or above which a limit whose typical engaged key needs more than it is too low",
        ),
        ParamSpec::number(
            "too_high_use",
            "0.5",
            "demand and burst under which the p99 key makes the limit too high (with no key constrained)",
        ),
        ParamSpec::number(
            "constrained_share",
            "0.01",
            "share of its requests refused at or above which a key is constrained",
        ),
        ParamSpec::number(
            "engaged_use",
            "0.2",
            "demand or burst at or above which a key is engaged",
        ),
        ParamSpec::integer(
            "min_keys",
            "10",
            "active keys a tier × route class needs to be judged",
        ),
        ParamSpec::number(
            "headroom",
            "1.1",
            "factor on the p99 engaged key's demand in the recommendation",
        ),
    ]
}

/// The review's thresholds, checked (see the report's parameters for their meaning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ReviewParams {
    pub(super) percentile: f64,
    pub(super) too_low_share: f64,
    pub(super) too_high_use: f64,
    pub(super) constrained_share: f64,
    pub(super) engaged_use: f64,
    pub(super) min_keys: i64,
    pub(super) headroom: f64,
}

impl ReviewParams {
    /// The thresholds at their defaults.
    pub(super) fn defaults(names: &Names, portable: bool) -> Result<Self, QueryError> {
        Self::of(&Args {
            params: &thresholds(),
            given: &BTreeMap::new(),
            names,
            portable,
        })
    }

    /// The thresholds of one call, checked.
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

/// Keys of a tier × route class the review's percentiles are taken from, by default: past
/// it, a sample of the keys (see [`per_key_from_parts`]).
pub const SAMPLE_KEYS: i64 = 32_768;

/// The review's sample, as a parameter.
pub(super) fn sample_param() -> ParamSpec {
    ParamSpec::integer(
        "sample_keys",
        "32768",
        "keys of a tier × route class the demand and burst percentiles are taken from: past it, a sample of them chosen by key (`sampled_keys`, `percentile_bound`); refusals, constrained keys and outliers stay exact",
    )
}

/// Where the limit review reads each key's row from: the kept parts of its range, or (when
/// portable) the decisions.
pub(super) fn review_keys(a: &Args<'_>, now: DateTime<Utc>) -> Result<KeysFrom, QueryError> {
    let range = a.range(now, 7)?;
    let sample = a.integer("sample_keys")?.unwrap_or(SAMPLE_KEYS);
    if !(2..=1_000_000_000).contains(&sample) {
        return Err(QueryError::Invalid(format!(
            "parameter sample_keys: {sample} is out of range (2 to 1000000000)"
        )));
    }
    Ok(if a.portable {
        KeysFrom::Decisions {
            range,
            filters: a.filters("x.")?,
        }
    } else {
        KeysFrom::Parts {
            range,
            filters: a.filters("k.")?,
            sample,
        }
    })
}

/// The CTEs over the review's kept parts of `range`, with `filters` (`AND k.…` conditions),
/// up to `per_key`, each key's row:
///
/// - `totals`: per tier × route class, over the rows of its keys without an override, what
///   the review says of all of them (the requests, the largest demand and span, the
///   quotas: [`LIMIT_TOTALS`]) and `rate`, the part of the range of `verdict_key_hash` its
///   sample takes: `sample` keys over its keys (estimated, `approx_distinct`), 1 when it
///   has no more;
/// - `refusing`: every key refused at least once in the range;
/// - `per_key`: the rows of the keys in the sample, of the keys refused and of the keys
///   with an override, merged, each with its limit's totals; `sampled` says which are in
///   the sample, `weight` how many keys each sampled one stands for ([`STANDS_FOR`]).
///
/// So the refusals, the constrained keys and the outliers are exact (every refused key is
/// read whole), the percentiles are those of the sample, and the rows merged are the
/// sample's and the refused keys', not every key's: the memory and the sorts are bounded
/// by the sample, whatever the keys. A key is in the sample on every day of the range or
/// on none, since its hash is its own.
///
/// The level is read three times: for `totals`, for the keys refused, and for the rows
/// chosen. `totals` is referenced once (a CTE referenced twice is planned, and its scans
/// read, twice), so its figures ride on the rows to `per_key` rather than being joined to
/// the limits again; a limit of one key with an override needs none, its totals being its
/// row's.
fn per_key_from_parts(range: &Range, filters: &str, sample: i64) -> String {
    let parts = REVIEW.call(range);
    // The parts are never a join's build side (DataFusion builds a hash join's left input,
    // and knows no sizes here to swap them by): the small tables are on the left of RIGHT
    // JOINs, and the parts' rows stream through them.
    let in_sample = "d.override_key IS NOT NULL \
        OR verdict_key_hash(d.key_id) < d.rate * 4294967296.0";
    format!(
        "{LIM}, overrides AS (
  SELECT key_id AS o_key, route_class_id AS o_route_class
  FROM policies
  WHERE kind = 'override'
), marked AS (
  SELECT k.*, o.o_key AS override_key
  FROM overrides o
  RIGHT JOIN {parts} k ON o.o_key = k.key_id AND o.o_route_class = k.route_class
  WHERE TRUE{filters}
), totals AS (
  SELECT tier AS c_tier, route_class AS c_route_class,
    LEAST(1.0, {sample}.0 / GREATEST(CAST(approx_distinct(verdict_key_hash(key_id)) AS DOUBLE), 1.0)) AS rate,
    {of_every_key}
  FROM marked
  WHERE override_key IS NULL
  GROUP BY tier, route_class
), refusing AS (
  SELECT DISTINCT k.tier AS r_tier, k.route_class AS r_route_class, k.key_id AS r_key
  FROM {parts} k
  WHERE k.denied + k.would_deny > 0{filters}
), rated AS (
  SELECT m.*, COALESCE(t.rate, 1.0) AS rate, {totals}
  FROM totals t
  RIGHT JOIN marked m ON t.c_tier = m.tier AND t.c_route_class = m.route_class
    AND m.override_key IS NULL
), chosen AS (
  SELECT d.*, CASE WHEN {in_sample} THEN 1 ELSE 0 END AS in_sample,
    CASE WHEN d.override_key IS NOT NULL THEN 1.0 ELSE 1.0 / d.rate END AS key_weight
  FROM refusing r
  RIGHT JOIN rated d ON r.r_tier = d.tier AND r.r_route_class = d.route_class
    AND r.r_key = d.key_id
  WHERE {in_sample} OR r.r_key IS NOT NULL
), per_key AS (
  SELECT {group}, {aggregates},
    MAX(in_sample) = 1 AS sampled, MAX(key_weight) AS weight, {limit_maxima}
  FROM chosen
  GROUP BY {group}
)",
        group = REVIEW_FOLD.group,
        aggregates = REVIEW_FOLD.aggregates,
        of_every_key = LIMIT_TOTALS
            .map(|(f, own, total)| format!("{f}({own}) AS {total}"))
            .join(", "),
        totals = LIMIT_TOTALS.map(|(_, _, c)| format!("t.{c}")).join(", "),
        limit_maxima = LIMIT_TOTALS
            .map(|(_, _, c)| format!("MAX({c}) AS {c}"))
            .join(", "),
    )
}

/// What `totals` says of every key of a limit without an override, carried on each of its
/// keys' rows (see [`per_key_from_parts`]): each as the aggregate over the keys' rows of a
/// column of theirs, and its name.
const LIMIT_TOTALS: [(&str, &str, &str); 7] = [
    ("SUM", "requests", "limit_requests"),
    ("MAX", "demand", "limit_demand_max"),
    ("MAX", "peak_span", "limit_span_max"),
    ("MIN", "quota_low", "limit_quota_low"),
    ("MAX", "quota_high", "limit_quota_high"),
    ("MIN", "quota_ceiling", "limit_quota_ceiling"),
    ("MAX", "enforced", "limit_enforced"),
];

/// A key row's [`LIMIT_TOTALS`] as `keyed` selects them from `per_key k`: a key with an
/// override is a limit of its own, whose totals are its row's.
fn limit_totals() -> String {
    LIMIT_TOTALS
        .iter()
        .map(|(_, own, total)| format!(", COALESCE(k.{total}, k.{own}) AS {total}"))
        .collect()
}

/// Where the review reads each key's row from.
#[derive(Debug, Clone)]
pub(super) enum KeysFrom {
    /// The decisions within a range with `AND x.…` filters: one statement, portable to
    /// DuckDB.
    Decisions { range: Range, filters: String },
    /// The query service's kept parts of a range, with `AND k.…` filters; the percentiles
    /// of a tier × route class with more than `sample` keys from a sample of them.
    Parts {
        range: Range,
        filters: String,
        sample: i64,
    },
}

impl KeysFrom {
    /// Each limit's largest regional quota under each policy version in the range
    /// (`policy-changes`' level): `tier, route_class, policy_version, enforced`, …
    pub(super) fn versions(&self) -> String {
        match self {
            Self::Decisions { range, .. } => version_counts(&range.sql("x.event_time", true), ""),
            Self::Parts { range, .. } => merged(
                &levels::VERSIONS,
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
            Self::Parts {
                range,
                filters,
                sample,
            } => per_key_from_parts(range, filters, *sample),
        }
    }

    /// Whether the keys' rows are a sample with `totals` beside them (the kept parts), not
    /// every key's (the decisions).
    pub(super) fn sampled(&self) -> bool {
        matches!(self, Self::Parts { .. })
    }
}

/// The review's common part, up to each key flagged engaged or constrained: `WITH lim AS
/// (…), …, flagged AS (…)`.
pub(super) fn flagged(keys: &KeysFrom, p: &ReviewParams) -> String {
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
    k.home % {home_base} AS home_region,
    COALESCE(o.capacity, l.capacity) AS capacity,
    COALESCE(o.refill_per_s, l.refill_per_s) AS refill_per_s,
    COALESCE(o.hourly_quota, l.hourly_quota) AS hourly_quota,
    COALESCE(o.mode, l.mode) AS mode,
    k.peak_span / GREATEST(1, COALESCE(o.capacity, l.capacity)) AS burst{sample}
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
        home_base = levels::HOME_BASE,
        sample = if keys.sampled() {
            format!(", k.sampled, k.weight{}", limit_totals())
        } else {
            String::new()
        },
    )
}

/// The review's common part, up to each key ranked within its limit: `WITH lim AS (…), …,
/// ranked AS (…` (the last CTE left open, for the caller to close).
pub(super) fn keyed(keys: &KeysFrom, p: &ReviewParams) -> String {
    let limit = LIMIT;
    let over = format!(" OVER (PARTITION BY {limit})");
    let (n, n_engaged) = if keys.sampled() {
        (estimated("TRUE", &over), estimated("engaged", &over))
    } else {
        (
            format!("COUNT(*){over}"),
            format!("SUM(CASE WHEN engaged THEN 1 ELSE 0 END){over}"),
        )
    };
    format!(
        "{flagged}, ranked AS (
  SELECT *,
    {n} AS n,
    {n_engaged} AS n_engaged,
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

/// How many of a limit's keys a key's row stands for when the rows are a sample's and the
/// refused keys' (see `per_key_from_parts`): a refused key itself (every one is read), a
/// key of the sample `weight` keys (its refused ones counted apart), another none. So the
/// keys are estimated from the sample where they were never refused and counted where they
/// were, and a share of constrained keys is never above the whole.
pub(super) const STANDS_FOR: &str =
    "CASE WHEN refused > 0 THEN 1.0 WHEN sampled THEN weight ELSE 0.0 END";

/// The keys of the limit where `condition` holds ([`STANDS_FOR`]), rounded: an aggregate,
/// or a window with `over` (` OVER (…)`, or empty).
pub(super) fn estimated(condition: &str, over: &str) -> String {
    format!(
        "CAST(ROUND(SUM(CASE WHEN {condition} THEN {STANDS_FOR} ELSE 0.0 END){over}) AS BIGINT)"
    )
}

/// A limit's identity in the review: its tier × route class, and the key of an override.
pub(super) const LIMIT: &str = "tier, route_class, override_key";
