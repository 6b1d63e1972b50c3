//! `policy-changes`: the denial rate before and after each policy version.

use chrono::{DateTime, Utc};

use super::levels::{VERSIONS, merged, version_counts};
use super::params::{Args, FROM, ParamSpec, ROUTE, Report, TIER, TO, limit_join};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "policy-changes",
        sql,
        description: "Denial rate before and after each policy version, per tier × route class. \
            `jumped` is true when the rate after is at least `jump` times the rate before and \
            rose by at least `min_rise`: a limit set too low by that change.",
        tables: &["decisions", "policies"],
        params: vec![
            FROM,
            TO,
            TIER,
            ROUTE,
            ParamSpec::number("jump", "2.0", "ratio of the rates that flags a change"),
            ParamSpec::number(
                "min_rise",
                "0.01",
                "smallest rise of the rate that flags a change",
            ),
        ],
    }
}

/// The SQL of `policy-changes`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let jump = a.number("jump")?;
    let min_rise = a.number("min_rise")?;
    let v = if a.portable {
        version_counts(&range.sql("event_time", true), &a.filters("")?)
    } else {
        merged(
            &VERSIONS,
            &range,
            "tier, route_class, policy_version",
            "SUM(requests) AS requests, SUM(refused) AS refused, MIN(first_seen) AS first_seen",
            &a.filters("k.")?,
        )
    };
    Ok(format!(
        "WITH v AS (
  {v}
), r AS (
  SELECT tier, route_class, policy_version, requests, first_seen,
    CAST(refused AS DOUBLE) / requests AS rate,
    LAG(CAST(refused AS DOUBLE) / requests) OVER (PARTITION BY tier, route_class ORDER BY policy_version) AS rate_before,
    LAG(policy_version) OVER (PARTITION BY tier, route_class ORDER BY policy_version) AS version_before
  FROM v
)
SELECT r.tier AS tier_id, p.tier, r.route_class AS route_class_id, p.route_class,
  r.version_before, r.policy_version AS version, r.first_seen AS in_force_from,
  r.rate_before, r.rate AS rate_after, r.requests AS requests_after,
  (r.rate >= {jump} * r.rate_before AND r.rate - r.rate_before >= {min_rise}) AS jumped
FROM r
{join}
WHERE r.version_before IS NOT NULL
ORDER BY r.tier, r.route_class, r.policy_version",
        join = limit_join("r")
    ))
}
