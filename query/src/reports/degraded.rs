//! `degraded`: decisions not made by the shared counters, per region per hour.

use chrono::{DateTime, Utc};

use super::levels::{DEGRADED, degraded_counts};
use super::params::{Args, FROM, ParamKind, ParamSpec, Report, TO};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "degraded",
        sql,
        description: "Decisions not made by the shared counters, per region per hour (`date`, \
            `hour` of event time, UTC): by the local fallback (Redis slow or gone) and by the kill switch, with their share of \
            the hour's decisions. Hours without any are left out.",
        tables: &["decisions"],
        params: vec![
            FROM,
            TO,
            ParamSpec {
                name: "region",
                kind: ParamKind::Integer,
                default: None,
                doc: "only this region id",
            },
        ],
    }
}

/// The SQL of `degraded`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let region = |alias: &str| -> Result<String, QueryError> {
        Ok(a.integer("region")?
            .map(|r| format!(" AND {alias}region = {r}"))
            .unwrap_or_default())
    };
    if a.portable {
        let counts = degraded_counts(
            &range.sql("event_time", true),
            &region("")?,
            ",
  CAST(SUM(CASE WHEN source IN (1, 2) THEN 1 ELSE 0 END) AS DOUBLE) / COUNT(*) AS degraded_share",
        );
        return Ok(format!(
            "{counts}
HAVING SUM(CASE WHEN source IN (1, 2) THEN 1 ELSE 0 END) > 0
ORDER BY date, hour, region"
        ));
    }
    // An hour lies within one part: the parts' rows are the hours already.
    Ok(format!(
        "SELECT date, hour, region, decisions, local_fallback, kill_switch,
  CAST(local_fallback + kill_switch AS DOUBLE) / decisions AS degraded_share
FROM {} k
WHERE local_fallback + kill_switch > 0{}
ORDER BY date, hour, region",
        DEGRADED.call(&range),
        region("k.")?
    ))
}
