//! Every report, in the order `GET /v1/reports` lists them. A new report is a file of its
//! own beside this one (its parameters, documentation and SQL) and a line here.

use super::params::Report;
use super::{
    degraded, demand_history, denial_rate, limit_outliers, overage, policy_changes, shadow_impact,
    top_denied, wrong_limits,
};
use crate::error::{QueryError, shown};

/// Every report, in the order `GET /v1/reports` lists them.
pub fn catalog() -> Vec<Report> {
    vec![
        wrong_limits::report(),
        limit_outliers::report(),
        demand_history::report(),
        shadow_impact::report(),
        top_denied::report(),
        overage::report(),
        denial_rate::report(),
        policy_changes::report(),
        degraded::report(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};

    use super::*;
    use crate::range::parse_time;
    use crate::reports::{Form, Names, ParamKind};

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
            let sql = report
                .render(&given, &names(), now(), Form::Portable)
                .unwrap();
            insta::assert_snapshot!(report.name, sql);
            // The query service's statement: the same, but the reports over raw decisions
            // read their first level from the kept parts, and `top-denied` counts its hours
            // in one level of aggregation (`crate::distinct`).
            let served = report
                .render(&given, &names(), now(), Form::Served)
                .unwrap();
            if served.contains("_parts('") || served.contains("verdict_count_distinct(") {
                insta::assert_snapshot!(format!("{}-served", report.name), served);
            } else {
                assert_eq!(served, sql, "{}", report.name);
            }
        }
    }

    #[test]
    fn every_report_renders_with_its_defaults() {
        for report in catalog() {
            let sql = report
                .render(&BTreeMap::new(), &names(), now(), Form::Served)
                .unwrap();
            assert!(sql.contains("SELECT"), "{}", report.name);
        }
    }

    #[test]
    fn the_default_range_is_the_last_seven_days_to_the_next_hour() {
        let sql = find("degraded")
            .unwrap()
            .render(&BTreeMap::new(), &names(), now(), Form::Portable)
            .unwrap();
        // Whole hours: the partition columns alone bound it.
        let expected = "(date > DATE '2026-11-23' OR (date = DATE '2026-11-23' AND hour >= 15)) \
                        AND (date < DATE '2026-11-30' OR (date = DATE '2026-11-30' AND hour < 15))";
        assert!(sql.contains(expected), "{sql}");
        assert!(!sql.contains("event_time"), "{sql}");
    }

    #[test]
    fn a_range_off_the_hour_bounds_the_time_column_too() {
        let sql = find("degraded")
            .unwrap()
            .render(
                &args(&[("from", "2026-11-30T10:30:00Z"), ("to", "2026-12-01")]),
                &names(),
                now(),
                Form::Portable,
            )
            .unwrap();
        let expected = "date >= DATE '2026-11-30' AND date <= DATE '2026-11-30' \
                        AND event_time >= TIMESTAMP '2026-11-30 10:30:00.000' \
                        AND event_time < TIMESTAMP '2026-12-01 00:00:00.000'";
        assert!(sql.contains(expected), "{sql}");
        // The rollup has only a date partition column: whole days suffice there.
        let sql = find("top-denied")
            .unwrap()
            .render(
                &args(&[("from", "2026-11-01"), ("to", "2026-12-01")]),
                &names(),
                now(),
                Form::Portable,
            )
            .unwrap();
        assert!(
            sql.contains("WHERE date >= DATE '2026-11-01' AND date < DATE '2026-12-01'"),
            "{sql}"
        );
    }

    #[test]
    fn names_become_ids_and_keys_hex_literals() {
        let sql = find("top-denied")
            .unwrap()
            .render(
                &args(&[
                    ("tier", "pro"),
                    ("route_class", "read"),
                    ("key", "00112233445566778899AABBCCDDEEFF"),
                ]),
                &names(),
                now(),
                Form::Served,
            )
            .unwrap();
        assert!(
            sql.contains(
                "AND k.tier = 2 AND k.route_class = 0 \
                 AND k.key_id = X'00112233445566778899aabbccddeeff'"
            ),
            "{sql}"
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let report = find("top-denied").unwrap();
        let bad = |pairs: &[(&str, &str)]| {
            report
                .render(&args(pairs), &names(), now(), Form::Served)
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
