//! The analysts' page at `/`: one HTML file, its script and its style sheet, embedded in
//! the binary as they are in `page/` (no build step, nothing fetched from elsewhere). The
//! page reads the same `/v1` API as every other client, with the same bearer token, which
//! it asks for once and keeps in the tab's session storage; the page itself needs none.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

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

#[cfg(test)]
mod tests {
    use super::*;

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
