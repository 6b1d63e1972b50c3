//! The denial rate over time (`denial-rate`): per hour × tier × route class, the limiter's
//! decisions, its refusals and shadow mode's would-deny, with the policy version in force.
//! The analysts' page draws it; a key filter makes it one key's hourly history.
//!
//! The raw table keeps 7 days; beyond them the answer comes from the rollup, which has
//! every key's requests per hour in the demand histogram (`demand_hourly`) and the
//! refusals of the refused keys (`denied_hourly`). Both count the same decisions: the
//! limiter's own, on Redis or the fallback (sources 0 and 1), not the kill switch's or
//! those of a limit turned off. A key's history from the rollup has only the hours the key
//! was refused in, since the demand histogram does not name keys.

use chrono::{DateTime, Duration, Utc};

use super::{Args, QueryError, Range, limit_join};
use crate::parts::Level;

/// How long the raw table keeps decisions (the retention job's window).
pub const RAW_DAYS: i64 = 7;

/// Each limit's hourly counts over the decisions within `range` (a condition on them) with
/// `filters`, and `columns` after the counts (`, …`).
fn hourly_counts(range: &str, filters: &str, columns: &str) -> String {
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

/// The kept part of `denial-rate` over the decisions within `range` (see [`crate::parts`]):
/// each limit's hourly counts.
pub fn rates_part_sql(range: &Range) -> String {
    hourly_counts(&range.sql("event_time", true), "", "")
}

/// Where a range's series is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Raw,
    Rollup,
}

/// The SQL of `denial-rate`.
pub(super) fn denial_rate_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, RAW_DAYS)?;
    let source = match a.raw("source").unwrap_or("auto") {
        "raw" => Source::Raw,
        "rollup" => Source::Rollup,
        "auto" if range.from >= now - Duration::days(RAW_DAYS) => Source::Raw,
        "auto" => Source::Rollup,
        other => {
            return Err(QueryError::Invalid(format!(
                "parameter source: {} is not one of auto, raw, rollup",
                super::shown(other)
            )));
        }
    };
    let filters = a.filters("")?;
    let by_key = a.raw("key").is_some();
    let counts = match source {
        // A key's history is the key's decisions alone; the kept parts count every key.
        Source::Raw if a.portable || by_key => hourly_counts(
            &range.sql("event_time", true),
            &filters,
            ", 'raw' AS source",
        ),
        // An hour lies within one part: the parts' rows are the hours already.
        Source::Raw => format!(
            "SELECT hour, tier, route_class, requests, denied, would_deny, policy_version,
    'raw' AS source
  FROM {} k
  WHERE TRUE{}",
            Level::Rates.call(&range),
            a.filters("k.")?
        ),
        Source::Rollup if by_key => format!(
            "SELECT hour, tier, route_class,
    SUM(allowed + denied + would_deny) AS requests, SUM(denied) AS denied,
    SUM(would_deny) AS would_deny, MAX(policy_version) AS policy_version,
    'rollup' AS source
  FROM denied_hourly
  WHERE {range}{filters}
  GROUP BY hour, tier, route_class",
            range = range.sql("hour", false)
        ),
        Source::Rollup => format!(
            "SELECT r.hour, r.tier, r.route_class, r.requests,
    COALESCE(d.denied, 0) AS denied, COALESCE(d.would_deny, 0) AS would_deny,
    d.policy_version, 'rollup' AS source
  FROM (
    SELECT hour, tier, route_class, SUM(requests) AS requests
    FROM demand_hourly
    WHERE {range}{filters}
    GROUP BY hour, tier, route_class
  ) r
  LEFT JOIN (
    SELECT hour, tier, route_class, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
      MAX(policy_version) AS policy_version
    FROM denied_hourly
    WHERE {range}{filters}
    GROUP BY hour, tier, route_class
  ) d ON d.hour = r.hour AND d.tier = r.tier AND d.route_class = r.route_class",
            range = range.sql("hour", false)
        ),
    };
    Ok(format!(
        "WITH h AS (
  {counts}
)
SELECT h.hour, h.tier AS tier_id, p.tier, h.route_class AS route_class_id, p.route_class,
  p.mode, p.hourly_quota, h.requests, h.denied, h.would_deny,
  CAST(h.denied AS DOUBLE) / h.requests AS denial_rate,
  CAST(h.would_deny AS DOUBLE) / h.requests AS would_deny_rate,
  h.policy_version, h.source
FROM h
{join}
WHERE h.requests > 0
ORDER BY h.hour, h.tier, h.route_class",
        join = limit_join("h")
    ))
}
