//! The named reports: documented queries with parameters, answering "which limits were
//! wrong?". Each renders to plain SQL over the four tables (the same SQL runs in DuckDB for
//! the benchmark), with parameters checked and rendered as literals: names are looked up in
//! the policy in force and become ids, a key must be 32 hex digits, times must parse.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};
use serde::Serialize;

use crate::error::QueryError;

mod rates;
mod review;

use crate::parts::Level;
pub use rates::RAW_DAYS;
use rates::denial_rate_sql;
pub use rates::rates_part_sql;
pub use review::part_sql;
use review::{KeysFrom, ReviewParams, outliers_sql, review_sql};

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
    /// One of the words its documentation lists.
    Choice,
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

impl ParamSpec {
    /// A filter or range bound with no default (`null`: no filter).
    const fn filter(name: &'static str, kind: ParamKind, doc: &'static str) -> Self {
        Self {
            name,
            kind,
            default: None,
            doc,
        }
    }

    /// A number with its default.
    const fn number(name: &'static str, default: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ParamKind::Number,
            default: Some(default),
            doc,
        }
    }

    /// A whole number with its default.
    const fn integer(name: &'static str, default: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ParamKind::Integer,
            default: Some(default),
            doc,
        }
    }
}

/// Builds a report's SQL from its checked parameters and the time now (for default ranges).
type SqlBuilder = fn(&Args<'_>, DateTime<Utc>) -> Result<String, QueryError>;

/// One named report: its name, documentation, parameters and the SQL it runs, together.
#[derive(Clone, Serialize)]
pub struct Report {
    /// Its name in `/v1/reports/{name}`.
    pub name: &'static str,
    /// What question it answers and how to read its rows.
    pub description: &'static str,
    /// Which tables it reads.
    pub tables: &'static [&'static str],
    /// Its parameters.
    pub params: Vec<ParamSpec>,
    #[serde(skip)]
    sql: SqlBuilder,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish()
    }
}

impl Report {
    /// Its SQL with `given` parameters (each checked, names looked up in `names`); `now`
    /// sets the default range.
    pub fn render(
        &self,
        given: &BTreeMap<String, String>,
        names: &Names,
        now: DateTime<Utc>,
    ) -> Result<String, QueryError> {
        self.render_as(given, names, now, false)
    }

    fn render_as(
        &self,
        given: &BTreeMap<String, String>,
        names: &Names,
        now: DateTime<Utc>,
        portable: bool,
    ) -> Result<String, QueryError> {
        for name in given.keys() {
            if name != "format" && !self.params.iter().any(|p| p.name == name) {
                let known: Vec<&str> = self.params.iter().map(|p| p.name).collect();
                return Err(QueryError::Invalid(format!(
                    "report {} has no parameter {}; it takes: {}",
                    self.name,
                    shown(name),
                    known.join(", ")
                )));
            }
        }
        let args = Args {
            report: self,
            given,
            names,
            portable,
        };
        (self.sql)(&args, now)
    }
}

const FROM: ParamSpec = ParamSpec::filter(
    "from",
    ParamKind::Time,
    "start of the time range, inclusive (default: `to` minus 7 days)",
);
const TO: ParamSpec = ParamSpec::filter(
    "to",
    ParamKind::Time,
    "end of the time range, exclusive (default: now, rounded up to the hour)",
);
const TIER: ParamSpec = ParamSpec::filter(
    "tier",
    ParamKind::Tier,
    "only this tier (a name from the policy)",
);
const ROUTE: ParamSpec = ParamSpec::filter(
    "route_class",
    ParamKind::RouteClass,
    "only this route class (a name from the policy)",
);
const KEY: ParamSpec = ParamSpec::filter("key", ParamKind::Key, "only this key id (32 hex digits)");

/// Every report, in the order `GET /v1/reports` lists them.
pub fn catalog() -> Vec<Report> {
    vec![
        Report {
            name: "wrong-limits",
            sql: wrong_limits_sql,
            description: "The limit review. For each tier × route class, and for each key with an \
                override: the demand of its active keys, not only their refusals. A key's hourly \
                demand is the most requests it made in one clock hour (allowed, refused and \
                would-deny alike) over the hourly quota it had there (`demand_*`, 1.0 = all of \
                it); its burst is the most it made in one span of the bucket's own time scale \
                (capacity / refill seconds, spans counted from the Unix epoch) as a multiple of \
                the capacity (`burst_*`; a steady caller at the refill rate is at 1.0, and no \
                bucket admits more than 2.0 in a span). `demand_p50` … \
                `demand_max` and `burst_p50` … `burst_max` are their distributions over the \
                active keys (nearest rank). Refusals are split: enforced and would-deny, by \
                bucket and by window; a key is constrained when at least `constrained_share` \
                of its requests were refused; the top 1 % of keys by refusals (at least one) \
                are outliers, override or abuse candidates, and `outlier_refusal_share` is \
                their part of the refusals. A key is engaged when its demand or its burst is at \
                least `engaged_use`. Verdict: `not enough data` below `min_keys` active keys \
                (a tier row; an override row is its one key); `too low` when the \
                `percentile` engaged key needs more than the quota or the bucket and at least \
                `too_low_share` of the keys are constrained (refusals spread over many keys, \
                not a few abusers or intended bursts); `too high` when even the p99 key uses \
                less than `too_high_use` of both and no key is constrained; else `fine`. \
                `reason` says why in words. Shadow limits are judged on their would-deny the \
                same way. `recommended_quota` is the p99 engaged key's need (its busiest \
                hour in a region over that region's share) times `headroom`, and `recommended_capacity` / `recommended_refill_per_s` \
                scale the bucket so the p99 engaged key's busiest span fits with the same \
                headroom, each rounded to two significant digits; a `fine` limit keeps its \
                values. Demand is compared like with like: against the quota each region \
                enforced (its share of the global `hourly_quota`; `enforced_quota` is the \
                largest), bursts against the region's share of the bucket (`regions`), so the \
                recommendation is a global limit of which each region's share covers its \
                keys. Decisions of the kill switch and of \
                mode off count nothing and are left out.",
            tables: &["decisions", "policies", "regions"],
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
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
            ],
        },
        Report {
            name: "limit-outliers",
            sql: limit_outliers_sql,
            description: "The keys behind a limit's refusals: per limit of the review \
                (`wrong-limits`), the top 1 % of its keys by refusals (at least one, refused \
                at least once), with their refusals, their share of the limit's refusals, \
                their demand and burst. They are override or abuse candidates, not evidence \
                against the limit.",
            tables: &["decisions", "policies", "regions"],
            params: vec![FROM, TO, TIER, ROUTE],
        },
        Report {
            name: "demand-history",
            sql: demand_history_sql,
            description: "Whether a limit is too high, over any range of the rollup's five \
                years: per tier × route class, the distribution of key-hours by demand (requests \
                in the hour over the quota the key had) from the hourly demand histogram, \
                `demand_p50` … `demand_max` (each the upper bound of its log-spaced bucket, \
                within a factor of 1.19). Verdict: `too high` when even the p99 key-hour uses \
                less than `too_high_use` of the quota, `not enough data` below `min_key_hours` \
                key-hours, else `not too high` (the `wrong-limits` review over the raw table's \
                seven days says whether it is too low or fine).",
            tables: &["demand_hourly", "policies"],
            params: vec![
                ParamSpec {
                    doc: "start of the time range, inclusive (default: `to` minus 30 days)",
                    ..FROM
                },
                TO,
                TIER,
                ROUTE,
                ParamSpec::number(
                    "too_high_use",
                    "0.5",
                    "demand under which the p99 key-hour makes the limit too high",
                ),
                ParamSpec::integer(
                    "min_key_hours",
                    "100",
                    "key-hours a limit needs to be judged",
                ),
            ],
        },
        Report {
            name: "shadow-impact",
            sql: shadow_impact_sql,
            description: "For each tier × route class in shadow mode: what enforcing it would do. \
                Requests, would-deny requests (each would have got a 429) and their rate, keys, \
                and keys that would have been refused at least once; split by bucket and window.",
            tables: &["decisions", "policies"],
            params: vec![FROM, TO, TIER, ROUTE],
        },
        Report {
            name: "top-denied",
            sql: top_denied_sql,
            description: "The keys with the most refusals (denied plus would-deny) from the hourly \
                rollup, with tier, route class, the tier's quota and the key's override if it has one.",
            tables: &["denied_hourly", "policies"],
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
                KEY,
                ParamSpec::integer("limit", "20", "how many keys"),
            ],
        },
        Report {
            name: "overage",
            sql: overage_sql,
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
            name: "denial-rate",
            sql: denial_rate_sql,
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
            params: vec![
                FROM,
                TO,
                TIER,
                ROUTE,
                KEY,
                ParamSpec {
                    name: "source",
                    kind: ParamKind::Choice,
                    default: Some("auto"),
                    doc: "`raw` (the decisions), `rollup` (the hourly rollup) or `auto`: raw \
                          when the range starts within the raw table's 7 days, else the rollup",
                },
            ],
        },
        Report {
            name: "policy-changes",
            sql: policy_changes_sql,
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
        },
        Report {
            name: "degraded",
            sql: degraded_sql,
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
                "no report named {}; the reports are: {}",
                shown(name),
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

/// `t` on the hour: its minutes, seconds and fraction dropped.
pub fn start_of_hour(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp().div_euclid(3_600) * 3_600, 0).unwrap_or(t)
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
    /// The range of `from` and `to` parameters (see [`parse_time`]); without `to`, the hour
    /// after `now`'s; without `from`, `default_days` before `to`.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        now: DateTime<Utc>,
        default_days: i64,
    ) -> Result<Self, QueryError> {
        let to = match to {
            Some(t) => parse_time("to", t)?,
            None => start_of_hour(now) + Duration::hours(1),
        };
        let from = match from {
            Some(t) => parse_time("from", t)?,
            None => to - Duration::days(default_days),
        };
        if from >= to {
            return Err(QueryError::Invalid(format!(
                "parameters from/to: the range is empty ({from} is not before {to})"
            )));
        }
        // The lake's times are nanoseconds since 1970, which end in 2262: nothing lies past
        // that, so a range reaching further (`from=1970-01-01&to=9999-12-31`, "all of it")
        // ends there rather than failing where its end is cast to a timestamp.
        let last = NaiveDate::from_ymd_opt(2262, 4, 11)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default();
        let to = to.min(last);
        if from >= to {
            return Err(QueryError::Invalid(
                "parameters from/to: the range lies past the times the lake can hold \
                 (they end on 2262-04-11)"
                    .to_owned(),
            ));
        }
        Ok(Self { from, to })
    }

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
    pub(crate) fn sql(&self, time_column: &str, hour_partitions: bool) -> String {
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

/// `text` as an error message shows it: quoted, and cut after 40 characters, so a message
/// never carries much of what a caller sent.
pub fn shown(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// Parses a time parameter: a UTC time in the years 1970 to 9999 (so that the default
/// ranges and the partition bounds derived from it can never overflow).
pub fn parse_time(name: &str, text: &str) -> Result<DateTime<Utc>, QueryError> {
    let t = parse_any_time(name, text)?;
    if !(1970..=9999).contains(&t.year()) {
        return Err(QueryError::Invalid(format!(
            "parameter {name}: the year {} is outside 1970 to 9999",
            t.year()
        )));
    }
    Ok(t)
}

fn parse_any_time(name: &str, text: &str) -> Result<DateTime<Utc>, QueryError> {
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
        "parameter {name}: {} is not a time; use RFC 3339 (2026-11-30T14:00:00Z), \
         2026-11-30T14:00 (UTC) or a date (2026-11-30)",
        shown(text)
    )))
}

/// The parameters of one call, checked.
struct Args<'a> {
    report: &'a Report,
    given: &'a BTreeMap<String, String>,
    names: &'a Names,
    /// Reads only the lake's tables and `policies`, as DuckDB can (see [`render_portable`]).
    portable: bool,
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
                QueryError::Invalid(format!("parameter {name}: {} is not a number", shown(text)))
            })
    }

    fn integer(&self, name: &str) -> Result<Option<i64>, QueryError> {
        self.raw(name)
            .map(|text| {
                text.parse::<i64>().map_err(|_| {
                    QueryError::Invalid(format!(
                        "parameter {name}: {} is not a whole number",
                        shown(text)
                    ))
                })
            })
            .transpose()
    }

    fn range(&self, now: DateTime<Utc>, default_days: i64) -> Result<Range, QueryError> {
        Range::parse(self.raw("from"), self.raw("to"), now, default_days)
    }

    fn name_id(&self, param: &str, of: &BTreeMap<String, u8>) -> Result<Option<u8>, QueryError> {
        let Some(name) = self.raw(param) else {
            return Ok(None);
        };
        of.get(name).copied().map(Some).ok_or_else(|| {
            let known: Vec<&str> = of.keys().map(String::as_str).collect();
            QueryError::Invalid(format!(
                "parameter {param}: {} is not in the policy in force; it has: {}",
                shown(name),
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
                    "parameter key: {} is not a key id (32 hex digits)",
                    shown(key)
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
    report.render(given, names, now)
}

/// [`render`], as a statement over the lake's tables and `policies` only, which DuckDB runs
/// too: the limit review reads the decisions all the way instead of the query service's
/// kept parts (`review_parts`, see [`crate::parts`]), with the same rows.
pub fn render_portable(
    report: &Report,
    given: &BTreeMap<String, String>,
    names: &Names,
    now: DateTime<Utc>,
) -> Result<String, QueryError> {
    report.render_as(given, names, now, true)
}

fn limit_join(alias: &str) -> String {
    format!(
        "LEFT JOIN policies p ON p.kind = 'limit' AND p.tier_id = {alias}.tier \
         AND p.route_class_id = {alias}.route_class"
    )
}

/// Where the limit review reads each key's row from: the kept parts of its range, or (when
/// portable) the decisions.
fn review_keys(a: &Args<'_>, now: DateTime<Utc>) -> Result<KeysFrom, QueryError> {
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

/// The SQL of `wrong-limits`.
fn wrong_limits_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    Ok(review_sql(&review_keys(a, now)?, &ReviewParams::of(a)?))
}

/// The SQL of `limit-outliers`.
fn limit_outliers_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let keys = review_keys(a, now)?;
    // The review's own thresholds, at their defaults: the same keys are constrained here.
    let review = find("wrong-limits")?;
    let defaults = Args {
        report: &review,
        given: &BTreeMap::new(),
        names: a.names,
        portable: a.portable,
    };
    Ok(outliers_sql(&keys, &ReviewParams::of(&defaults)?))
}

/// The SQL of `demand-history`: nearest-rank percentiles over the histogram's buckets, each
/// the upper bound of the first bucket whose running count of key-hours reaches the rank.
fn demand_history_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 30)?.sql("hour", false);
    let filters = a.filters("")?;
    let too_high = a.number("too_high_use")?;
    let min_key_hours = a.integer("min_key_hours")?.unwrap_or(100).max(1);
    let upper = |b: &str| format!("POWER(2.0, CAST({b} + 1 AS DOUBLE) / 4.0)");
    let rank = |q: f64| format!("MIN(CASE WHEN cum >= CEIL({q} * total) THEN bucket END)");
    Ok(format!(
        "WITH b AS (
  SELECT tier, route_class, bucket, SUM(keys) AS keys, SUM(requests) AS requests,
    COUNT(DISTINCT hour) AS hours
  FROM demand_hourly
  WHERE {range}{filters}
  GROUP BY tier, route_class, bucket
), c AS (
  SELECT tier, route_class, bucket, keys, requests, hours,
    SUM(keys) OVER (PARTITION BY tier, route_class ORDER BY bucket
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
    SUM(keys) OVER (PARTITION BY tier, route_class) AS total
  FROM b
), l AS (
  SELECT tier, route_class, MAX(total) AS key_hours, SUM(requests) AS requests,
    MAX(hours) AS hours, {b50} AS b50, {b90} AS b90, {b99} AS b99, MAX(bucket) AS bmax
  FROM c
  GROUP BY tier, route_class
)
SELECT l.tier AS tier_id, p.tier, l.route_class AS route_class_id, p.route_class, p.mode,
  p.hourly_quota, l.key_hours, l.requests,
  {p50} AS demand_p50, {p90} AS demand_p90, {p99} AS demand_p99, {pmax} AS demand_max,
  CASE WHEN l.key_hours < {min_key_hours} THEN 'not enough data'
       WHEN {p99} < {too_high} THEN 'too high'
       ELSE 'not too high' END AS verdict
FROM l
{join}
ORDER BY l.tier, l.route_class",
        b50 = rank(0.5),
        b90 = rank(0.9),
        b99 = rank(0.99),
        p50 = upper("l.b50"),
        p90 = upper("l.b90"),
        p99 = upper("l.b99"),
        pmax = upper("l.bmax"),
        join = limit_join("l"),
    ))
}

/// `level`'s kept parts of `range` merged: `aggregates` over them (`k`, with `AND k.…`
/// `filters`) grouped by `group`, a report's first level as its portable statement has it.
pub(super) fn merged(
    level: Level,
    range: &Range,
    group: &str,
    aggregates: &str,
    filters: &str,
) -> String {
    format!(
        "SELECT {group}, {aggregates}
  FROM {} k
  WHERE TRUE{filters}
  GROUP BY {group}",
        level.call(range)
    )
}

/// The per-key level of `shadow-impact` over the decisions within `range` (a condition on
/// the decisions) with `filters`: each key of a shadow limit, its requests and would-deny.
fn shadow_keys(range: &str, filters: &str) -> String {
    // Only the decisions of shadow limits are grouped by key: the semi-join drops the
    // others before the per-key aggregation, the report's main cost (about a fifth
    // less time in `verdict bench query`; the final join alone gives the same rows).
    format!(
        "SELECT tier, route_class, key_id, COUNT(*) AS requests,
    SUM(CASE WHEN verdict = 2 THEN 1 ELSE 0 END) AS would_deny,
    SUM(CASE WHEN verdict = 2 AND denied_by_bucket THEN 1 ELSE 0 END) AS would_deny_by_bucket,
    SUM(CASE WHEN verdict = 2 AND denied_by_window THEN 1 ELSE 0 END) AS would_deny_by_window
  FROM decisions
  WHERE EXISTS (SELECT 1 FROM policies s WHERE s.kind = 'limit' AND s.mode = 'shadow'
      AND s.tier_id = decisions.tier AND s.route_class_id = decisions.route_class)
    AND {range}{filters}
  GROUP BY tier, route_class, key_id"
    )
}

/// The kept part of `shadow-impact` over the decisions within `range` (see [`crate::parts`]).
pub fn shadow_part_sql(range: &Range) -> String {
    shadow_keys(&range.sql("event_time", true), "")
}

/// The SQL of `shadow-impact`.
fn shadow_impact_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let per_key = if a.portable {
        shadow_keys(&range.sql("event_time", true), &a.filters("")?)
    } else {
        merged(
            Level::Shadow,
            &range,
            "tier, route_class, key_id",
            "SUM(requests) AS requests, SUM(would_deny) AS would_deny,
    SUM(would_deny_by_bucket) AS would_deny_by_bucket,
    SUM(would_deny_by_window) AS would_deny_by_window",
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

/// The SQL of `top-denied`.
fn top_denied_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?.sql("hour", false);
    let filters = a.filters("")?;
    let limit = a.integer("limit")?.unwrap_or(20);
    if !(1..=100_000).contains(&limit) {
        return Err(QueryError::Invalid(format!(
            "parameter limit: {limit} is out of range (1 to 100000)"
        )));
    }
    Ok(format!(
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
    ))
}

/// The SQL of `overage`.
fn overage_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
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

/// The per-version level of `policy-changes` over the decisions (`x`) within `range` with
/// `filters`: each limit's requests, refusals, first decision and largest regional quota
/// under each policy version.
pub(super) fn version_counts(range: &str, filters: &str) -> String {
    format!(
        "SELECT tier, route_class, policy_version, COUNT(*) AS requests, SUM({REFUSED}) AS refused,
    MIN(event_time) AS first_seen, MAX(window_quota) AS enforced
  FROM decisions x
  WHERE {range} AND source IN (0, 1){filters}
  GROUP BY tier, route_class, policy_version"
    )
}

/// The kept part of `policy-changes` over the decisions within `range` (see
/// [`crate::parts`]).
pub fn versions_part_sql(range: &Range) -> String {
    version_counts(&range.sql("event_time", true), "")
}

/// The SQL of `policy-changes`.
fn policy_changes_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    let range = a.range(now, 7)?;
    let jump = a.number("jump")?;
    let min_rise = a.number("min_rise")?;
    let v = if a.portable {
        version_counts(&range.sql("event_time", true), &a.filters("")?)
    } else {
        merged(
            Level::Versions,
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

/// Each hour and region's decisions, and those of the fallback and the kill switch, over the
/// decisions within `range` (a condition on them) with `filters`, and `columns` after the
/// counts (`, …`).
fn degraded_counts(range: &str, filters: &str, columns: &str) -> String {
    format!(
        "SELECT date, hour, region, COUNT(*) AS decisions,
  SUM(CASE WHEN source = 1 THEN 1 ELSE 0 END) AS local_fallback,
  SUM(CASE WHEN source = 2 THEN 1 ELSE 0 END) AS kill_switch{columns}
FROM decisions
WHERE {range}{filters}
GROUP BY date, hour, region"
    )
}

/// The kept part of `degraded` over the decisions within `range` (see [`crate::parts`]).
pub fn degraded_part_sql(range: &Range) -> String {
    degraded_counts(&range.sql("event_time", true), "", "")
}

/// The SQL of `degraded`.
fn degraded_sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
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
        Level::Degraded.call(&range),
        region("k.")?
    ))
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

    /// Every report's SQL, as it runs (and as DuckDB runs it in the benchmark), over a
    /// week of whole days with every filter given.
    #[test]
    fn every_reports_sql_is_the_recorded_one() {
        for report in catalog() {
            let mut given = args(&[("from", "2026-11-23"), ("to", "2026-11-30")]);
            for p in &report.params {
                match p.kind {
                    ParamKind::Tier => given.insert(p.name.into(), "pro".into()),
                    ParamKind::RouteClass => given.insert(p.name.into(), "read".into()),
                    ParamKind::Key => {
                        given.insert(p.name.into(), "00112233445566778899aabbccddeeff".into())
                    }
                    _ => None,
                };
            }
            let sql = render_portable(&report, &given, &names(), now()).unwrap();
            insta::assert_snapshot!(report.name, sql);
            // The query service's statement: the same, but the reports over raw decisions
            // read their first level from the kept parts.
            let served = render(&report, &given, &names(), now()).unwrap();
            if served.contains("_parts('") {
                insta::assert_snapshot!(format!("{}-served", report.name), served);
            } else {
                assert_eq!(served, sql, "{}", report.name);
            }
        }
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
        let sql = render_portable(
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
    fn a_range_past_what_the_lake_holds_is_cut_to_it() {
        let now = Utc::now();
        let all = Range::parse(Some("1970-01-01"), Some("9999-12-31"), now, 1).unwrap();
        assert_eq!(
            (all.from.to_rfc3339(), all.to.to_rfc3339()),
            (
                "1970-01-01T00:00:00+00:00".to_owned(),
                "2262-04-11T00:00:00+00:00".to_owned()
            )
        );
        let e = Range::parse(Some("2300-01-01"), Some("2400-01-01"), now, 1).unwrap_err();
        assert!(e.to_string().contains("past the times"), "{e}");
    }

    #[test]
    fn a_range_off_the_hour_bounds_the_time_column_too() {
        let sql = render_portable(
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
        // An extreme date is refused by name, not carried into the range's arithmetic.
        assert!(
            bad(&[("to", "-262143-01-01")]).contains("parameter to"),
            "{}",
            bad(&[("to", "-262143-01-01")])
        );
        assert!(bad(&[("from", "0001-01-01")]).contains("the year 1 is outside 1970 to 9999"));
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
