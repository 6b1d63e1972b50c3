//! `limit-outliers`: the keys behind a limit's refusals, per limit of the review.

use chrono::{DateTime, Utc};

use super::params::{Args, FROM, ROUTE, Report, TIER, TO};
use super::review::{LIMIT, ReviewParams, keyed, review_keys, sample_param};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "limit-outliers",
        sql,
        description: "The keys behind a limit's refusals: per limit of the review \
            (`wrong-limits`), the top 1 % of its keys by refusals (at least one, refused \
            at least once), with their refusals, their share of the limit's refusals, \
            their demand and burst. They are override or abuse candidates, not evidence \
            against the limit.",
        tables: &["decisions", "policies", "regions"],
        params: vec![FROM, TO, TIER, ROUTE, sample_param()],
    }
}

/// The SQL of `limit-outliers`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let keys = review_keys(a, now)?;
    // The review's own thresholds, at their defaults: the same keys are constrained here.
    Ok(outliers_sql(
        &keys,
        &ReviewParams::defaults(a.names, a.portable)?,
    ))
}

/// The SQL of `limit-outliers`: per limit, the top 1 % of its keys by refusals (at least
/// one, and only keys that were refused), with their demand and burst.
fn outliers_sql(keys: &super::review::KeysFrom, p: &ReviewParams) -> String {
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
