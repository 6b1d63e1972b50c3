//! `overage`: requests over the hourly quota per key per day, for pricing.

use chrono::{DateTime, Duration, Utc};

use super::params::{Args, FROM, KEY, ParamSpec, ROUTE, Report, TIER, TO, limit_join};
use crate::error::QueryError;
use crate::range::Range;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "overage",
        sql,
        description: "For pricing: requests over the hourly quota per key per day, enforced \
            (`quota_denied`) and would-be in shadow mode (`quota_would_deny`), with the quota \
            in force. From the jobs' `overage` table; ask for format=csv or parquet to export.",
        tables: &["overage", "policies"],
        params: vec![
            ParamSpec {
                doc: "first day, inclusive (default: `to` minus 30 days)",
                ..FROM
            },
            ParamSpec {
                doc: "end, exclusive: days before it (default: tomorrow)",
                ..TO
            },
            TIER,
            ROUTE,
            KEY,
        ],
    }
}

/// The SQL of `overage`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 30)?;
    let first = range.from.date_naive();
    let last = (range.to - Duration::milliseconds(1)).date_naive();
    let filters = a.filters("o.")?;
    Ok(format!(
        "SELECT o.date, o.key_id, o.tier AS tier_id, p.tier, o.route_class AS route_class_id,
  p.route_class, o.quota_denied, o.quota_would_deny, o.window_quota, o.policy_version
FROM overage o
{join}
WHERE o.date >= {} AND o.date <= {}{filters}
ORDER BY o.date, o.quota_denied + o.quota_would_deny DESC, o.key_id, o.route_class",
        Range::date(first),
        Range::date(last),
        join = limit_join("o")
    ))
}
