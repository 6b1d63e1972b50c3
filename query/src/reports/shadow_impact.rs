//! `shadow-impact`: for each limit in shadow mode, what enforcing it would do.

use chrono::{DateTime, Utc};

use super::levels::{SHADOW, SHADOW_FOLD, merged, shadow_keys};
use super::params::{Args, FROM, ROUTE, Report, TIER, TO};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "shadow-impact",
        sql,
        description: "For each tier × route class in shadow mode: what enforcing it would do. \
            Requests, would-deny requests (each would have got a 429) and their rate, keys, \
            and keys that would have been refused at least once; split by bucket and window.",
        tables: &["decisions", "policies"],
        params: vec![FROM, TO, TIER, ROUTE],
    }
}

/// The SQL of `shadow-impact`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let per_key = if a.portable {
        shadow_keys(&range.sql("event_time", true), &a.filters("")?)
    } else {
        merged(
            &SHADOW,
            &range,
            SHADOW_FOLD.group,
            SHADOW_FOLD.aggregates,
            &a.filters("k.")?,
        )
    };
    Ok(format!(
        "WITH per_key AS (
  {per_key}
), per_limit AS (
  SELECT tier, route_class, SUM(requests) AS requests, SUM(would_deny) AS would_deny,
    SUM(would_deny_by_bucket) AS would_deny_by_bucket,
    SUM(would_deny_by_window) AS would_deny_by_window,
    COUNT(*) AS keys, SUM(CASE WHEN would_deny > 0 THEN 1 ELSE 0 END) AS keys_would_deny
  FROM per_key
  GROUP BY tier, route_class
)
SELECT l.tier AS tier_id, p.tier, l.route_class AS route_class_id, p.route_class,
  p.hourly_quota, l.requests, l.would_deny,
  CAST(l.would_deny AS DOUBLE) / l.requests AS would_deny_rate,
  l.would_deny_by_bucket, l.would_deny_by_window, l.keys, l.keys_would_deny
FROM per_limit l
JOIN policies p ON p.kind = 'limit' AND p.mode = 'shadow' AND p.tier_id = l.tier
  AND p.route_class_id = l.route_class
ORDER BY l.tier, l.route_class"
    ))
}
