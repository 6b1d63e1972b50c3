//! `top-denied`: the keys with the most refusals, from the hourly rollup.

use chrono::{DateTime, Utc};

use super::levels::{DENIED, merged};
use super::params::{Args, ParamSpec, Report, keyed, limit_join};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "top-denied",
        sql,
        description: "The keys with the most refusals (denied plus would-deny) from the hourly \
            rollup, with tier, route class, the tier's quota and the key's override if it has one.",
        tables: &["denied_hourly", "policies"],
        params: keyed([ParamSpec::integer("limit", "20", "how many keys")]),
    }
}

/// The SQL of `top-denied`. The query service reads each day's keys from kept parts
/// ([`DENIED`]); the portable statement sums the rollup's rows.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let limit = a.integer("limit")?.unwrap_or(20);
    if !(1..=100_000).contains(&limit) {
        return Err(QueryError::Invalid(format!(
            "parameter limit: {limit} is out of range (1 to 100000)"
        )));
    }
    let per_key = if a.portable {
        format!(
            "SELECT key_id, tier, route_class, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(denied_by_bucket) AS by_bucket, SUM(denied_by_window) AS by_window,
    SUM(allowed) AS allowed, COUNT(DISTINCT hour) AS hours,
    MIN(first_denial) AS first_denial, MAX(last_denial) AS last_denial
  FROM denied_hourly
  WHERE {}{}
  GROUP BY key_id, tier, route_class",
            range.sql("hour", false),
            a.filters("")?
        )
    } else {
        merged(
            &DENIED,
            &range,
            "key_id, tier, route_class",
            "SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(by_bucket) AS by_bucket, SUM(by_window) AS by_window, SUM(allowed) AS allowed,
    SUM(hours) AS hours, MIN(first_denial) AS first_denial, MAX(last_denial) AS last_denial",
            &a.filters("k.")?,
        )
    };
    Ok(format!(
        "WITH k AS (
  {per_key}
)
SELECT k.key_id, k.tier AS tier_id, p.tier, k.route_class AS route_class_id, p.route_class,
  k.denied, k.would_deny, k.by_bucket, k.by_window, k.allowed, k.hours,
  k.first_denial, k.last_denial, p.hourly_quota AS tier_quota,
  o.hourly_quota AS override_quota, o.capacity AS override_capacity
FROM k
{join}
LEFT JOIN policies o ON o.kind = 'override' AND o.key_id = k.key_id
  AND o.route_class_id = k.route_class
ORDER BY k.denied + k.would_deny DESC, k.key_id, k.route_class
LIMIT {limit}",
        join = limit_join("k")
    ))
}
