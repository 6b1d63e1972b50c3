//! The analysts' page at `/`: one HTML file, its script and its style sheet, embedded in
//! the binary as they are in `page/` (no build step, nothing fetched from elsewhere). The
//! page reads the same `/v1` API as every other client, with the same bearer token, which
//! it asks for once and keeps in the tab's session storage; the page itself needs none.

use std::collections::BTreeMap;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{Duration, NaiveDate};

use crate::engine::{Engine, RunOptions};
use crate::error::QueryError;
use crate::reports::Form;

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const APP_CSS: &str = include_str!("page/app.css");

/// Only the service's own scripts, styles and API: no inline script, nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// The page's routes, outside the token check (they hold no data).
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/page/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/page/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}

/// Days of the page's default range ("last 7 days"): the whole days (UTC) before today.
pub const DEFAULT_DAYS: i64 = 7;

/// The reports the page asks for when it opens on a range from `from` to `to` (times as the
/// page writes them, `2026-11-24T00:00:00Z`) with every tier, route class and key and the
/// review's thresholds at their defaults, each with its parameters as the page sends them:
/// the denial rate and the policy changes, the review, shadow mode's impact, the degraded
/// decisions and the 20 keys refused most (`app.js`, `load()`).
pub fn first_load(from: &str, to: &str) -> Vec<(&'static str, BTreeMap<String, String>)> {
    let range = || {
        BTreeMap::from([
            ("from".to_string(), from.to_string()),
            ("to".to_string(), to.to_string()),
        ])
    };
    let mut top = range();
    top.insert("limit".into(), "20".into());
    vec![
        ("denial-rate", range()),
        ("policy-changes", range()),
        ("wrong-limits", range()),
        ("shadow-impact", range()),
        ("degraded", range()),
        ("top-denied", top),
    ]
}

/// What [`warm_first_load`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstLoadWarmed {
    /// The range's first and last day.
    pub days: (NaiveDate, NaiveDate),
    /// Answers computed now (the others were kept already).
    pub computed: usize,
    /// Answers kept already.
    pub kept: usize,
}

/// Makes sure the answers the page's first load asks for over the default range ending
/// with `last_day` (the [`DEFAULT_DAYS`] whole days up to it) are kept (see
/// [`crate::answers`]), computing those that are not: so that the page opens in the time
/// it takes to plan its queries, not in the review's time. The query service's warming
/// calls it after the parts of the closed days are kept, with the newest closed day, which
/// is the page's default range while ingest is current (its range ends at today's
/// midnight). Nothing is kept when the service keeps no answers.
pub async fn warm_first_load(
    engine: &Engine,
    last_day: NaiveDate,
) -> Result<FirstLoadWarmed, QueryError> {
    let first_day = last_day - Duration::days(DEFAULT_DAYS - 1);
    let at = |day: NaiveDate| format!("{}T00:00:00Z", day.format("%Y-%m-%d"));
    let (from, to) = (at(first_day), at(last_day + Duration::days(1)));
    let mut warmed = FirstLoadWarmed {
        days: (first_day, last_day),
        computed: 0,
        kept: 0,
    };
    if !engine.answers().enabled() {
        return Ok(warmed);
    }
    for (report, params) in first_load(&from, &to) {
        let sql = engine.report_sql(report, &params, Form::Served).await?;
        if engine.json(&sql, &RunOptions::default().kept()).await?.kept {
            warmed.kept += 1;
        } else {
            warmed.computed += 1;
        }
    }
    Ok(warmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reports the page is warmed with are those its script asks for at first load.
    #[test]
    fn the_first_load_warmed_is_the_scripts() {
        for (report, params) in first_load("a", "b") {
            assert!(
                APP_JS.contains(&format!("report(\"{report}\"")),
                "the page asks for no {report}"
            );
            assert_eq!(params["from"], "a");
        }
        assert!(APP_JS.contains("{ ...params, limit: \"20\" }"));
        assert!(APP_JS.contains(&format!(
            "const days = {{ \"24h\": 1, \"7d\": {DEFAULT_DAYS}"
        )));
    }

    /// The page names only files the service serves, and the script only reports that exist.
    #[test]
    fn the_page_names_what_the_service_serves() {
        assert!(INDEX_HTML.contains(r#"src="/page/app.js""#));
        assert!(INDEX_HTML.contains(r#"href="/page/app.css""#));
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(
            !APP_JS.contains("https://"),
            "the page fetches nothing from elsewhere"
        );
        let names: Vec<&str> = crate::reports::catalog().iter().map(|r| r.name).collect();
        for called in APP_JS.split("report(\"").skip(1) {
            let name = called.split('"').next().unwrap_or_default();
            assert!(names.contains(&name), "app.js asks for report {name:?}");
        }
    }
}
