//! The query service's router driven in process with tower's `oneshot` on the known lake in
//! a local folder: no socket, no S3. SQL answers the counts the fixture wrote, a named
//! report names the known wrong limit, the format follows `Accept`, every error is the
//! documented JSON, and tokens guard the `/v1` routes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use tower::ServiceExt as _;
use verdict_query::Limits;
use verdict_query::http::{AppState, QueryMetrics, router};
use verdict_tests::query_fixture::{hour_10, hour_11, known_local_engine};

const TOKEN: &str = "analyst-token-1";

async fn app(tokens: &[&str]) -> (axum::Router, tempfile::TempDir) {
    let (engine, dir) = known_local_engine(Limits::default()).await;
    let state = Arc::new(AppState {
        engine,
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        metrics: QueryMetrics::new(),
    });
    (router(state), dir)
}

/// Status, content type and body of one request.
async fn call(app: &axum::Router, request: Request<Body>) -> (StatusCode, String, Vec<u8>) {
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the body");
    (status, content_type, body.to_vec())
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn sql(text: &str) -> Request<Body> {
    Request::post("/v1/sql")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(text.to_owned()))
        .unwrap()
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_reports_answer_what_the_lake_holds() {
    let (app, _dir) = app(&[]).await;
    let (status, _, body) = call(&app, get("/healthz")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"ok\n"[..]));

    // Decisions per tier id, counted from the events the fixture wrote.
    let mut expected = BTreeMap::new();
    for e in hour_10().iter().chain(hour_11().iter()) {
        *expected.entry(u64::from(e.tier.0)).or_insert(0i64) += 1;
    }
    let (status, content_type, body) = call(
        &app,
        sql("SELECT tier, COUNT(*) AS n FROM decisions GROUP BY tier ORDER BY tier"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let answer = json(&body);
    let got: BTreeMap<u64, i64> = answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["tier"].as_u64().unwrap(), r["n"].as_i64().unwrap()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(answer["row_count"], 4);

    // The limit review names the tier refused on every key as too low.
    let (status, _, body) = call(
        &app,
        get(
            "/v1/reports/wrong-limits?from=2026-11-30T10:00:00Z&to=2026-11-30T11:00:00Z&min_keys=5",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let review = json(&body);
    assert_eq!(review["rows"][0]["tier"], "tight", "{review}");
    assert_eq!(review["rows"][0]["verdict"], "too low", "{review}");

    // Accept picks the format.
    let mut request = sql("SELECT 1 AS one");
    request
        .headers_mut()
        .insert(header::ACCEPT, "text/csv".parse().unwrap());
    let (status, content_type, body) = call(&app, request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/csv; charset=utf-8");
    assert_eq!(body, b"one\n1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_the_documented_json() {
    let (app, _dir) = app(&[]).await;
    let cases = [
        (get("/nope"), StatusCode::NOT_FOUND, "not_found"),
        (
            get("/v1/sql"),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (get("/v1/reports/nope"), StatusCode::NOT_FOUND, "not_found"),
        (
            get("/v1/reports/top-denied?tier=gold"),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
        (
            sql("DELETE FROM decisions"),
            StatusCode::BAD_REQUEST,
            "refused",
        ),
        (
            sql("SELECT nope FROM decisions"),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
    ];
    for (request, status, kind) in cases {
        let what = format!("{} {}", request.method(), request.uri());
        let (got, content_type, body) = call(&app, request).await;
        assert_eq!(got, status, "{what}: {}", String::from_utf8_lossy(&body));
        assert_eq!(content_type, "application/json", "{what}");
        assert_eq!(json(&body)["error"]["kind"], kind, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_the_v1_routes() {
    let (app, _dir) = app(&[TOKEN]).await;
    let with = |token: Option<&str>| {
        let mut r = Request::get("/v1/tables");
        if let Some(t) = token {
            r = r.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        r.body(Body::empty()).unwrap()
    };
    for token in [None, Some("analyst-token-2"), Some("")] {
        let (status, _, body) = call(&app, with(token)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(json(&body)["error"]["kind"], "unauthorized");
    }
    let (status, _, body) = call(&app, with(Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["tables"][0]["name"], "decisions");
    // Health and metrics stay open to the orchestrator.
    assert_eq!(call(&app, get("/healthz")).await.0, StatusCode::OK);
    assert_eq!(call(&app, get("/metrics")).await.0, StatusCode::OK);
}

/// The sampled review reads its level three times in one plan, and DataFusion plans the
/// scans at once: with no part kept (`part_cache_bytes` 0), each part of the known lake's
/// day is still computed once per report, not once per scan (the review's level and the
/// quotas' level: two), and a second report computes them again (nothing is kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_several_scans_of_one_plan_read_is_computed_once() {
    let limits = Limits {
        part_cache_bytes: 0,
        ..Limits::default()
    };
    let (engine, _dir) = known_local_engine(limits).await;
    let (from, to) = ("2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z");
    let review =
        verdict_tests::query_fixture::report_in(&engine, "wrong-limits", from, to, &[]).await;
    assert_eq!(review.len(), 5, "{review:?}");
    assert_eq!(engine.parts_computed(), 2);
    verdict_tests::query_fixture::report_in(&engine, "wrong-limits", from, to, &[]).await;
    assert_eq!(engine.parts_computed(), 4);
}
