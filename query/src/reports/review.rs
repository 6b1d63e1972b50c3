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

/// Where the limit review reads each key's row from: the kept parts of its range, or (when
/// portable) the decisions.
pub(super) fn review_keys(a: &Args<'_>, now: DateTime<Utc>) -> Result<KeysFrom, QueryError> {
    let range = a.range(now, 7)?;
    Ok(if a.portable {
        KeysFrom::Decisions {
            range,
            filters: a.filters("x.")?,
        }
    } else {
        KeysFrom::Parts {
            range,
            filters: a.filters("k.")?,
        }
    })
}

/// The `per_key` CTE over the review's kept parts of `range`, with `filters` (`AND k.…`
/// conditions).
fn per_key_from_parts(range: &Range, filters: &str) -> String {
    let merged = merged(
        &REVIEW,
        range,
        REVIEW_FOLD.group,
        REVIEW_FOLD.aggregates,
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
            Self::Parts { range, filters } => per_key_from_parts(range, filters),
        }
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
        home_base = levels::HOME_BASE,
    )
}

/// The review's common part, up to each key ranked within its limit: `WITH lim AS (…), …,
/// ranked AS (…` (the last CTE left open, for the caller to close).
pub(super) fn keyed(keys: &KeysFrom, p: &ReviewParams) -> String {
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

/// A limit's identity in the review: its tier × route class, and the key of an override.
pub(super) const LIMIT: &str = "tier, route_class, override_key";
