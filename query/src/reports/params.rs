//! What a report is and what it takes: its parameters, each with a type, a default and
//! its documentation, and the checked arguments of one call, which render names as ids, a
//! key as a hex literal and times as a range.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{QueryError, shown};
use crate::range::Range;

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
#[derive(Debug, Clone, Copy, Serialize)]
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

/// A parameter's name, default or documentation: text in the program.
type Text = &'static str;

impl ParamSpec {
    /// A filter or range bound with no default (`null`: no filter).
    pub(super) const fn filter(name: Text, kind: ParamKind, doc: Text) -> Self {
        Self {
            name,
            kind,
            default: None,
            doc,
        }
    }

    /// A number with its default.
    pub(super) const fn number(name: Text, default: Text, doc: Text) -> Self {
        Self::with_default(name, ParamKind::Number, default, doc)
    }

    /// A whole number with its default.
    pub(super) const fn integer(name: Text, default: Text, doc: Text) -> Self {
        Self::with_default(name, ParamKind::Integer, default, doc)
    }

    /// A parameter of `kind` with its default.
    const fn with_default(name: Text, kind: ParamKind, default: Text, doc: Text) -> Self {
        Self {
            default: Some(default),
            ..Self::filter(name, kind, doc)
        }
    }
}

/// Builds a report's SQL from its checked parameters and the time now (for default ranges).
pub(super) type SqlBuilder = fn(&Args<'_>, DateTime<Utc>) -> Result<String, QueryError>;

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
    pub(super) sql: SqlBuilder,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish()
    }
}

/// Which statement of a report: the one the query service runs, or the portable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The query service's: the reports over raw decisions read their first level from the
    /// kept parts (see [`crate::parts`]).
    Served,
    /// Over the lake's tables, `policies` and `regions` only, which DuckDB runs too: the
    /// first levels read from the decisions all the way, with the same rows.
    Portable,
}

impl Report {
    /// Its SQL in `form` with `given` parameters (each checked, names looked up in
    /// `names`); `now` sets the default range.
    pub fn render(
        &self,
        given: &BTreeMap<String, String>,
        names: &Names,
        now: DateTime<Utc>,
        form: Form,
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
            params: &self.params,
            given,
            names,
            portable: form == Form::Portable,
        };
        (self.sql)(&args, now)
    }
}

/// The range, tier, route class and key filters, then a report's own parameters.
pub(super) fn keyed(own: impl IntoIterator<Item = ParamSpec>) -> Vec<ParamSpec> {
    FILTERS.into_iter().chain(own).collect()
}

/// The filters of a report's rows, in the order the reports list them.
#[rustfmt::skip]
const FILTERS: [ParamSpec; 5] = {
    use ParamKind::{Key, RouteClass, Tier, Time};
    [
        ParamSpec::filter("from", Time, "start, inclusive (default: `to` minus 7 days)"),
        ParamSpec::filter("to", Time, "end, exclusive (default: now, rounded up to the hour)"),
        ParamSpec::filter("tier", Tier, "only this tier (a name from the policy)"),
        ParamSpec::filter("route_class", RouteClass, "only this route class (by its name)"),
        ParamSpec::filter("key", Key, "only this key id (32 hex digits)"),
    ]
};
pub(super) const FROM: ParamSpec = FILTERS[0];
pub(super) const TO: ParamSpec = FILTERS[1];
pub(super) const TIER: ParamSpec = FILTERS[2];
pub(super) const ROUTE: ParamSpec = FILTERS[3];
pub(super) const KEY: ParamSpec = FILTERS[4];

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

/// The parameters of one call, checked.
pub(super) struct Args<'a> {
    /// Its parameters, whose defaults stand in for those not given.
    pub(super) params: &'a [ParamSpec],
    /// The parameters given.
    pub(super) given: &'a BTreeMap<String, String>,
    /// The names of the policy in force.
    pub(super) names: &'a Names,
    /// Reads only the lake's tables, `policies` and `regions`, as DuckDB can
    /// ([`Form::Portable`]).
    pub(super) portable: bool,
}

impl Args<'_> {
    pub(super) fn raw(&self, name: &str) -> Option<&str> {
        self.given
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .or_else(|| {
                self.params
                    .iter()
                    .find(|p| p.name == name)
                    .and_then(|p| p.default)
            })
    }

    pub(super) fn number(&self, name: &str) -> Result<f64, QueryError> {
        let text = self.raw(name).unwrap_or("0");
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                QueryError::Invalid(format!("parameter {name}: {} is not a number", shown(text)))
            })
    }

    pub(super) fn integer(&self, name: &str) -> Result<Option<i64>, QueryError> {
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

    pub(super) fn range(&self, now: DateTime<Utc>, default_days: i64) -> Result<Range, QueryError> {
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
    pub(super) fn filters(&self, alias: &str) -> Result<String, QueryError> {
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

/// The join that names a row's limit (`p`) from its tier and route class ids (`alias`).
pub(super) fn limit_join(alias: &str) -> String {
    format!(
        "LEFT JOIN policies p ON p.kind = 'limit' AND p.tier_id = {alias}.tier \
         AND p.route_class_id = {alias}.route_class"
    )
}
