//! `denial-rate`, the denial rate over time: per hour × tier × route class, the limiter's
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

use super::levels::{RATES, hourly_counts};
use super::params::{Args, ParamKind, ParamSpec, Report, keyed, limit_join};
use crate::error::{QueryError, shown};

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "denial-rate",
        sql,
        description: "The denial rate over time: per hour (`hour`, its start, UTC) × tier × \
            route class, the limiter's decisions (`requests`: on Redis or the fallback; the \
            kill switch's and those of a limit turned off are left out), refused with 429 \
            (`denied`) and refused by shadow mode (`would_deny`), their rates, and the \
            newest policy version seen in the hour. Within the raw table's 7 days it reads \
            the decisions; a range starting earlier reads the hourly rollup (`source` says \
            which), where the policy version is known only for hours with refusals. With \
            `key`, one key's hourly history (from the rollup: only the hours it was \
            refused in). Hours without decisions are left out.",
        tables: &["decisions", "denied_hourly", "demand_hourly", "policies"],
        params: keyed([ParamSpec {
            name: "source",
            kind: ParamKind::Choice,
            default: Some("auto"),
            doc: "`raw` (the decisions), `rollup` (the hourly rollup) or `auto`: raw when the \
                  range starts within the raw table's 7 days, else the rollup",
        }]),
    }
}

/// How long the raw table keeps decisions (the retention job's window).
pub const RAW_DAYS: i64 = 7;

/// Where a range's series is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Raw,
    Rollup,
}

/// The SQL of `denial-rate`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, RAW_DAYS)?;
    let source = match a.raw("source").unwrap_or("auto") {
        "raw" => Source::Raw,
        "rollup" => Source::Rollup,
        "auto" if range.from >= now - Duration::days(RAW_DAYS) => Source::Raw,
        "auto" => Source::Rollup,
        other => {
            return Err(QueryError::Invalid(format!(
                "parameter source: {} is not one of auto, raw, rollup",
                shown(other)
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
            RATES.call(&range),
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
