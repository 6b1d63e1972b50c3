//! The named reports: documented queries with parameters, answering "which limits were
//! wrong?". Each renders to plain SQL over the four tables (the same SQL runs in DuckDB for
//! the benchmark), with parameters checked and rendered as literals: names are looked up in
//! the policy in force and become ids, a key must be 32 hex digits, times must parse.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};
use serde::Serialize;

use crate::engine::QueryError;

/// The type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A UTC time: RFC 3339 (`2026-11-30T14:00:00Z`), `YYYY-MM-DDTHH:MM`, or a date
    /// (`2026-11-30`, midnight UTC).
    Time,
    /// A tier name from the policy in force.
    Tier,
    /// A route class name from the policy in force.
    RouteClass,
    /// A key id, 32 hex digits.
    Key,
    /// A number.
    Number,
    /// A whole number.
    Integer,
}

/// One parameter of a report.
#[derive(Debug, Clone, Serialize)]
pub struct ParamSpec {
    /// Its name in the query string.
    pub name: &'static str,
    /// Its type.
    pub kind: ParamKind,
    /// Its default, as text (`null`: no filter).
    pub default: Option<&'static str>,
    /// What it does.
    pub doc: &'static str,
}

/// One named report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Its name in `/v1/reports/{name}`.
    pub name: &'static str,
    /// What question it answers and how to read its rows.
    pub description: &'static str,
    /// Which tables it reads.
    pub tables: &'static [&'static str],
    /// Its parameters.
    pub params: Vec<ParamSpec>,
}

const FROM: ParamSpec = ParamSpec {
    name: "from",
    kind: ParamKind::Time,
    default: None,
    doc: "start of the time range, inclusive (default: `to` minus 7 days)",
};
const TO: ParamSpec = ParamSpec {
    name: "to",
    kind: ParamKind::Time,
    default: None,
    doc: "end of the time range, exclusive (default: now, rounded up to the hour)",
};
const TIER: ParamSpec = ParamSpec {
    name: "tier",
    kind: ParamKind::Tier,
    default: None,
    doc: "only this tier (a name from the policy)",
};
const ROUTE: ParamSpec = ParamSpec {
    name: "route_class",
    kind: ParamKind::RouteClass,
    default: None,
    doc: "only this route class (a name from the policy)",
};
const KEY: ParamSpec = ParamSpec {
    name: "key",
    kind: ParamKind::Key,
    default: None,
    doc: "only this key id (32 hex digits)",
};

/// Every report, in the order `GET /v1/reports` lists them.
pub fn catalog() -> Vec<Report> {
    vec![
        Report {
            name: "wrong-limits",
            description: "For each tier × route class: how many keys were refused at least once, \
                the share of requests refused (denied or would-deny), and how close the busiest \
                key came to its hourly quota (1.0 = spent it). Verdict: `too low` when at least \
                `too_low_share` of the keys were refused (the limit, not the callers, is the \
                problem); `too high` when the busiest key used less than `too_high_use` of the \
                quota and nobody was refused; else `fine`. Decisions of the kill switch and of \
                mode off count nothing and are left out.",
            tables: &["decisions", "policies"],
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
                ParamSpec {
                    name: "too_low_share",
                    kind: ParamKind::Number,
                    default: Some("0.1"),
                    doc: "share of keys refused at or above which the limit is too low",
                },
                ParamSpec {
                    name: "too_high_use",
                    kind: ParamKind::Number,
                    default: Some("0.5"),
                    doc: "share of the hourly quota under which the busiest key's use makes the limit too high",
                },
            ],
        },
        Report {
            name: "shadow-impact",
            description: "For each tier × route class in shadow mode: what enforcing it would do. \
                Requests, would-deny requests (each would have got a 429) and their rate, keys, \
                and keys that would have been refused at least once; split by bucket and window.",
            tables: &["decisions", "policies"],
            params: vec![FROM, TO, TIER, ROUTE],
        },
        Report {
            name: "top-denied",
            description: "The keys with the most refusals (denied plus would-deny) from the hourly \
                rollup, with tier, route class, the tier's quota and the key's override if it has one.",
            tables: &["denied_hourly", "policies"],
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
                KEY,
                ParamSpec {
                    name: "limit",
                    kind: ParamKind::Integer,
                    default: Some("20"),
                    doc: "how many keys",
                },
            ],
        },
        Report {
            name: "overage",
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
        },
        Report {
            name: "policy-changes",
            description: "Denial rate before and after each policy version, per tier × route class. \
                `jumped` is true when the rate after is at least `jump` times the rate before and \
                rose by at least `min_rise`: a limit set too low by that change.",
            tables: &["decisions", "policies"],
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
                ParamSpec {
                    name: "jump",
                    kind: ParamKind::Number,
                    default: Some("2.0"),
                    doc: "ratio of the rates that flags a change",
                },
                ParamSpec {
                    name: "min_rise",
                    kind: ParamKind::Number,
                    default: Some("0.01"),
                    doc: "smallest rise of the rate that flags a change",
                },
            ],
        },
        Report {
            name: "degraded",
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
        },
    ]
}

/// Finds a report by name.
pub fn find(name: &str) -> Result<Report, QueryError> {
    catalog()
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = catalog().iter().map(|r| r.name).collect();
            QueryError::NotFound(format!(
                "no report named {name:?}; the reports are: {}",
                names.join(", ")
            ))
        })
}

/// Tier and route class names of the policy in force, with their ids.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// Tier name → id.
    pub tiers: BTreeMap<String, u8>,
    /// Route class name → id.
    pub route_classes: BTreeMap<String, u8>,
}

impl Names {
    /// The names of a policy document.
    pub fn of(doc: &verdict_limiter::PolicyDocument) -> Self {
        Self {
            tiers: doc.tiers.iter().map(|t| (t.name.clone(), t.id)).collect(),
            route_classes: doc
                .route_classes
                .iter()
                .map(|r| (r.name.clone(), r.id))
                .collect(),
        }
    }
}

/// A UTC time range `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Start, inclusive.
    pub from: DateTime<Utc>,
    /// End, exclusive.
    pub to: DateTime<Utc>,
}

impl Range {
    fn ts(t: DateTime<Utc>) -> String {
        format!("TIMESTAMP '{}'", t.format("%Y-%m-%d %H:%M:%S%.3f"))
    }

    fn date(d: NaiveDate) -> String {
        format!("DATE '{}'", d.format("%Y-%m-%d"))
    }

    /// The SQL condition on a table with a `date` partition column and a time column.
    ///
    /// When the range falls on whole days (or, with an `hour` partition column, whole
    /// hours), the partition columns say it all: the condition is on them only, so it
    /// prunes folders and costs nothing per row. Otherwise the time column bounds it too.
    fn sql(&self, time_column: &str, hour_partitions: bool) -> String {
        let whole = |t: DateTime<Utc>| {
            t.timestamp_subsec_nanos() == 0
                && t.second() == 0
                && t.minute() == 0
                && (hour_partitions || t.hour() == 0)
        };
        if whole(self.from) && whole(self.to) {
            let bound = |t: DateTime<Utc>, after: bool| {
                let d = Self::date(t.date_naive());
                match (t.hour(), after) {
                    (0, true) => format!("date >= {d}"),
                    (0, false) => format!("date < {d}"),
                    (h, true) => format!("(date > {d} OR (date = {d} AND hour >= {h}))"),
                    (h, false) => format!("(date < {d} OR (date = {d} AND hour < {h}))"),
                }
            };
            return format!("{} AND {}", bound(self.from, true), bound(self.to, false));
        }
        let last = self.to - Duration::milliseconds(1);
        format!(
            "date >= {} AND date <= {} AND {time_column} >= {} AND {time_column} < {}",
            Self::date(self.from.date_naive()),
            Self::date(last.date_naive()),
            Self::ts(self.from),
            Self::ts(self.to),
        )
    }
}

/// Parses a time parameter.
pub fn parse_time(name: &str, text: &str) -> Result<DateTime<Utc>, QueryError> {
    let t = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(t) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(t, format) {
            return Ok(Utc.from_utc_datetime(&t));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists")));
    }
    Err(QueryError::Invalid(format!(
        "parameter {name}: {text:?} is not a time; use RFC 3339 (2026-11-30T14:00:00Z), \
         2026-11-30T14:00 (UTC) or a date (2026-11-30)"
    )))
}

/// The parameters of one call, checked.
struct Args<'a> {
    report: &'a Report,
    given: &'a BTreeMap<String, String>,
    names: &'a Names,
}

impl Args<'_> {
    fn raw(&self, name: &str) -> Option<&str> {
        self.given
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .or_else(|| {
                self.report
                    .params
                    .iter()
                    .find(|p| p.name == name)
                    .and_then(|p| p.default)
            })
    }

    fn number(&self, name: &str) -> Result<f64, QueryError> {
        let text = self.raw(name).unwrap_or("0");
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                QueryError::Invalid(format!("parameter {name}: {text:?} is not a number"))
            })
    }

    fn integer(&self, name: &str) -> Result<Option<i64>, QueryError> {
        self.raw(name)
            .map(|text| {
                text.parse::<i64>().map_err(|_| {
                    QueryError::Invalid(format!("parameter {name}: {text:?} is not a whole number"))
                })
            })
            .transpose()
    }

    fn range(&self, now: DateTime<Utc>, default_days: i64) -> Result<Range, QueryError> {
        let to = match self.raw("to") {
            Some(t) => parse_time("to", t)?,
            None => {
                let hour = now
                    .with_minute(0)
                    .and_then(|t| t.with_second(0))
                    .and_then(|t| t.with_nanosecond(0))
                    .unwrap_or(now);
                hour + Duration::hours(1)
            }
        };
        let from = match self.raw("from") {
            Some(t) => parse_time("from", t)?,
            None => to - Duration::days(default_days),
        };
        if from >= to {
            return Err(QueryError::Invalid(format!(
                "parameters from/to: the range is empty ({from} is not before {to})"
            )));
        }
        Ok(Range { from, to })
    }

    fn name_id(&self, param: &str, of: &BTreeMap<String, u8>) -> Result<Option<u8>, QueryError> {
        let Some(name) = self.raw(param) else {
            return Ok(None);
        };
        of.get(name).copied().map(Some).ok_or_else(|| {
            let known: Vec<&str> = of.keys().map(String::as_str).collect();
            QueryError::Invalid(format!(
                "parameter {param}: {name:?} is not in the policy in force; it has: {}",
                known.join(", ")
            ))
        })
    }

    /// `AND tier = …` / `AND route_class = …` / `AND key_id = …` for the given filters.
    fn filters(&self, alias: &str) -> Result<String, QueryError> {
        let mut sql = String::new();
        if let Some(t) = self.name_id("tier", &self.names.tiers)? {
            sql.push_str(&format!(" AND {alias}tier = {t}"));
        }
        if let Some(r) = self.name_id("route_class", &self.names.route_classes)? {
            sql.push_str(&format!(" AND {alias}route_class = {r}"));
        }
        // `render` refuses a parameter its report does not take, so a key is only ever
        // given to the reports that filter on one.
        if let Some(key) = self.raw("key") {
            let ok = key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit());
            if !ok {
                return Err(QueryError::Invalid(format!(
                    "parameter key: {key:?} is not a key id (32 hex digits)"
                )));
            }
            sql.push_str(&format!(
                " AND {alias}key_id = X'{}'",
                key.to_ascii_lowercase()
            ));
        }
        Ok(sql)
    }
}

const REFUSED: &str = "CASE WHEN verdict <> 0 THEN 1 ELSE 0 END";

/// The SQL of `report` with `given` parameters; `now` sets the default range.
pub fn render(
    report: &Report,
    given: &BTreeMap<String, String>,
    names: &Names,
    now: DateTime<Utc>,
) -> Result<String, QueryError> {
    for name in given.keys() {
        if name != "format" && !report.params.iter().any(|p| p.name == name) {
            let known: Vec<&str> = report.params.iter().map(|p| p.name).collect();
            return Err(QueryError::Invalid(format!(
                "report {} has no parameter {name:?}; it takes: {}",
                report.name,
                known.join(", ")
            )));
        }
    }
    let a = Args {
        report,
        given,
        names,
    };
    let limit_join = |alias: &str| {
        format!(
            "LEFT JOIN policies p ON p.kind = 'limit' AND p.tier_id = {alias}.tier \
             AND p.route_class_id = {alias}.route_class"
        )
    };
    let sql = match report.name {
        "wrong-limits" => {
            let range = a.range(now, 7)?.sql("event_time", true);
            let filters = a.filters("")?;
            let too_low = a.number("too_low_share")?;
            let too_high = a.number("too_high_use")?;
            // A key's use is the most of its hourly quota it had used at any decision, each
            // decision measured against the quota in force then (a policy change or an
            // override in the range changes it).
            format!(
                "WITH per_key AS (
  SELECT tier, route_class, key_id, COUNT(*) AS requests, SUM({REFUSED}) AS refused,
    MAX(CASE WHEN window_quota > 0 THEN 1.0 - CAST(remaining_window AS DOUBLE) / window_quota ELSE 0.0 END) AS use
  FROM decisions
  WHERE {range} AND source IN (0, 1){filters}
  GROUP BY tier, route_class, key_id
), per_limit AS (
  SELECT tier, route_class, COUNT(*) AS keys,
    SUM(CASE WHEN refused > 0 THEN 1 ELSE 0 END) AS keys_refused,
    SUM(requests) AS requests, SUM(refused) AS refused,
    MAX(use) AS busiest_use
  FROM per_key
  GROUP BY tier, route_class
)
SELECT l.tier AS tier_id, p.tier, l.route_class AS route_class_id, p.route_class, p.mode,
  p.hourly_quota, l.keys, l.keys_refused,
  CAST(l.keys_refused AS DOUBLE) / l.keys AS share_keys_refused,
  l.requests, l.refused,
  CAST(l.refused AS DOUBLE) / l.requests AS refusal_rate,
  l.busiest_use,
  CASE WHEN CAST(l.keys_refused AS DOUBLE) / l.keys >= {too_low} THEN 'too low'
       WHEN l.keys_refused = 0 AND l.busiest_use < {too_high} THEN 'too high'
       ELSE 'fine' END AS verdict
FROM per_limit l
{join}
ORDER BY l.tier, l.route_class",
                join = limit_join("l")
            )
        }
        "shadow-impact" => {
            let range = a.range(now, 7)?.sql("event_time", true);
            let filters = a.filters("")?;
            // Only the decisions of shadow limits are grouped by key: the semi-join drops the
            // others before the per-key aggregation, the report's main cost (about a fifth
            // less time in `verdict bench query`; the final join alone gives the same rows).
            format!(
                "WITH per_key AS (
  SELECT tier, route_class, key_id, COUNT(*) AS requests,
    SUM(CASE WHEN verdict = 2 THEN 1 ELSE 0 END) AS would_deny,
    SUM(CASE WHEN verdict = 2 AND denied_by_bucket THEN 1 ELSE 0 END) AS would_deny_by_bucket,
    SUM(CASE WHEN verdict = 2 AND denied_by_window THEN 1 ELSE 0 END) AS would_deny_by_window
  FROM decisions
  WHERE EXISTS (SELECT 1 FROM policies s WHERE s.kind = 'limit' AND s.mode = 'shadow'
      AND s.tier_id = decisions.tier AND s.route_class_id = decisions.route_class)
    AND {range}{filters}
  GROUP BY tier, route_class, key_id
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
            )
        }
        "top-denied" => {
            let range = a.range(now, 7)?.sql("hour", false);
            let filters = a.filters("")?;
            let limit = a.integer("limit")?.unwrap_or(20);
            if !(1..=100_000).contains(&limit) {
                return Err(QueryError::Invalid(format!(
                    "parameter limit: {limit} is out of range (1 to 100000)"
                )));
            }
            format!(
                "WITH k AS (
  SELECT key_id, tier, route_class, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(denied_by_bucket) AS by_bucket, SUM(denied_by_window) AS by_window,
    SUM(allowed) AS allowed, COUNT(DISTINCT hour) AS hours,
    MIN(first_denial) AS first_denial, MAX(last_denial) AS last_denial
  FROM denied_hourly
  WHERE {range}{filters}
  GROUP BY key_id, tier, route_class
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
            )
        }
        "overage" => {
            let range = a.range(now, 30)?;
            let first = range.from.date_naive();
            let last = (range.to - Duration::milliseconds(1)).date_naive();
            let filters = a.filters("o.")?;
            format!(
                "SELECT o.date, o.key_id, o.tier AS tier_id, p.tier, o.route_class AS route_class_id,
  p.route_class, o.quota_denied, o.quota_would_deny, o.window_quota, o.policy_version
FROM overage o
{join}
WHERE o.date >= {} AND o.date <= {}{filters}
ORDER BY o.date, o.quota_denied + o.quota_would_deny DESC, o.key_id, o.route_class",
                Range::date(first),
                Range::date(last),
                join = limit_join("o")
            )
        }
        "policy-changes" => {
            let range = a.range(now, 7)?.sql("event_time", true);
            let filters = a.filters("")?;
            let jump = a.number("jump")?;
            let min_rise = a.number("min_rise")?;
            format!(
                "WITH v AS (
  SELECT tier, route_class, policy_version, COUNT(*) AS requests, SUM({REFUSED}) AS refused,
    MIN(event_time) AS first_seen
  FROM decisions
  WHERE {range} AND source IN (0, 1){filters}
  GROUP BY tier, route_class, policy_version
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
            )
        }
        "degraded" => {
            let range = a.range(now, 7)?.sql("event_time", true);
            let region = a
                .integer("region")?
                .map(|r| format!(" AND region = {r}"))
                .unwrap_or_default();
            format!(
                "SELECT date, hour, region, COUNT(*) AS decisions,
  SUM(CASE WHEN source = 1 THEN 1 ELSE 0 END) AS local_fallback,
  SUM(CASE WHEN source = 2 THEN 1 ELSE 0 END) AS kill_switch,
  CAST(SUM(CASE WHEN source IN (1, 2) THEN 1 ELSE 0 END) AS DOUBLE) / COUNT(*) AS degraded_share
FROM decisions
WHERE {range}{region}
GROUP BY date, hour, region
HAVING SUM(CASE WHEN source IN (1, 2) THEN 1 ELSE 0 END) > 0
ORDER BY date, hour, region"
            )
        }
        other => return Err(QueryError::NotFound(format!("no report named {other:?}"))),
    };
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            tiers: [("free".to_string(), 0), ("pro".to_string(), 2)].into(),
            route_classes: [("read".to_string(), 0)].into(),
        }
    }

    fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn now() -> DateTime<Utc> {
        parse_time("now", "2026-11-30T14:20:00Z").unwrap()
    }

    #[test]
    fn every_report_renders_with_its_defaults() {
        for report in catalog() {
            let sql = render(&report, &BTreeMap::new(), &names(), now()).unwrap();
            assert!(sql.contains("SELECT"), "{}", report.name);
        }
    }

    #[test]
    fn the_default_range_is_the_last_seven_days_to_the_next_hour() {
        let sql = render(
            &find("degraded").unwrap(),
            &BTreeMap::new(),
            &names(),
            now(),
        )
        .unwrap();
        // Whole hours: the partition columns alone bound it.
        let expected = "(date > DATE '2026-11-23' OR (date = DATE '2026-11-23' AND hour >= 15)) \
                        AND (date < DATE '2026-11-30' OR (date = DATE '2026-11-30' AND hour < 15))";
        assert!(sql.contains(expected), "{sql}");
        assert!(!sql.contains("event_time"), "{sql}");
    }

    #[test]
    fn a_range_off_the_hour_bounds_the_time_column_too() {
        let sql = render(
            &find("degraded").unwrap(),
            &args(&[("from", "2026-11-30T10:30:00Z"), ("to", "2026-12-01")]),
            &names(),
            now(),
        )
        .unwrap();
        let expected = "date >= DATE '2026-11-30' AND date <= DATE '2026-11-30' \
                        AND event_time >= TIMESTAMP '2026-11-30 10:30:00.000' \
                        AND event_time < TIMESTAMP '2026-12-01 00:00:00.000'";
        assert!(sql.contains(expected), "{sql}");
        // The rollup has only a date partition column: whole days suffice there.
        let sql = render(
            &find("top-denied").unwrap(),
            &args(&[("from", "2026-11-01"), ("to", "2026-12-01")]),
            &names(),
            now(),
        )
        .unwrap();
        assert!(
            sql.contains("WHERE date >= DATE '2026-11-01' AND date < DATE '2026-12-01'"),
            "{sql}"
        );
    }

    #[test]
    fn names_become_ids_and_keys_hex_literals() {
        let sql = render(
            &find("top-denied").unwrap(),
            &args(&[
                ("tier", "pro"),
                ("route_class", "read"),
                ("key", "00112233445566778899AABBCCDDEEFF"),
            ]),
            &names(),
            now(),
        )
        .unwrap();
        assert!(
            sql.contains(
                "AND tier = 2 AND route_class = 0 AND key_id = X'00112233445566778899aabbccddeeff'"
            ),
            "{sql}"
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let report = find("top-denied").unwrap();
        let bad = |pairs: &[(&str, &str)]| {
            render(&report, &args(pairs), &names(), now())
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad(&[("tier", "gold")]).contains(
                "parameter tier: \"gold\" is not in the policy in force; it has: free, pro"
            )
        );
        assert!(bad(&[("key", "xyz")]).contains("parameter key"));
        assert!(bad(&[("from", "yesterday")]).contains("parameter from"));
        assert!(bad(&[("limit", "0")]).contains("parameter limit"));
        assert!(bad(&[("colour", "red")]).contains("no parameter \"colour\""));
        assert!(bad(&[("from", "2026-11-30"), ("to", "2026-11-29")]).contains("range is empty"));
        assert!(
            find("nope")
                .unwrap_err()
                .to_string()
                .contains("wrong-limits")
        );
    }
}
