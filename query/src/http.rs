//! The HTTP API (axum).
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/sql` | body: one SQL query (text, or JSON `{"sql": "…"}`) |
//! | `GET /v1/reports` | the named reports with their parameters |
//! | `GET /v1/reports/{name}?…` | one report's rows |
//! | `GET /v1/tables` | the tables and their columns |
//! | `GET /v1/openapi.json` | the OpenAPI 3.1 document |
//! | `GET /healthz`, `GET /metrics` | liveness, Prometheus metrics (no token needed) |
//!
//! Answers are JSON unless `?format=csv|arrow|parquet` or the `Accept` header asks
//! otherwise; JSON is bounded by the row limit, the others stream. With tokens configured,
//! every `/v1` route wants `Authorization: Bearer <token>`; with none, [`serve`] listens only
//! on loopback.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use prometheus::{
    HistogramVec, IntCounterVec, Registry, TextEncoder, register_histogram_vec_with_registry,
    register_int_counter_vec_with_registry,
};
use serde_json::json;

use crate::engine::{Engine, QueryStream};
use crate::error::QueryError;
use crate::format::{Encoder, Format, json};
use crate::reports::catalog;
use crate::view::AsOf;

/// The service's own metrics.
#[derive(Debug, Clone)]
pub struct QueryMetrics {
    /// The registry holding them.
    pub registry: Registry,
    /// `verdict_query_requests_total{endpoint, outcome}`: outcome is `ok` or an error kind.
    pub requests: IntCounterVec,
    /// `verdict_query_seconds{endpoint}`: time to the answer's first byte.
    pub seconds: HistogramVec,
    /// `verdict_query_rows_total{endpoint}`: rows answered.
    pub rows: IntCounterVec,
}

impl QueryMetrics {
    /// A fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = register_int_counter_vec_with_registry!(
            "verdict_query_requests_total",
            "Queries answered, by endpoint and outcome (ok or the error kind)",
            &["endpoint", "outcome"],
            registry
        )
        .expect("a valid, unique metric");
        let seconds = register_histogram_vec_with_registry!(
            "verdict_query_seconds",
            "Time from the request to the answer's first byte",
            &["endpoint"],
            vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
            ],
            registry
        )
        .expect("a valid, unique metric");
        let rows = register_int_counter_vec_with_registry!(
            "verdict_query_rows_total",
            "Rows answered, by endpoint",
            &["endpoint"],
            registry
        )
        .expect("a valid, unique metric");
        Self {
            registry,
            requests,
            seconds,
            rows,
        }
    }

    /// The metrics in Prometheus's text format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

impl Default for QueryMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// Accepted bearer tokens; empty: no authentication (loopback only).
    pub tokens: Vec<String>,
    /// Metrics.
    pub metrics: QueryMetrics,
}

/// An error answer: `{"error": {"kind": …, "message": …}}`.
struct ApiError(QueryError);

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        Self(e)
    }
}

fn status_of(e: &QueryError) -> StatusCode {
    match e {
        QueryError::Refused(_) | QueryError::Invalid(_) | QueryError::TooLarge(_) => {
            StatusCode::BAD_REQUEST
        }
        QueryError::NotFound(_) => StatusCode::NOT_FOUND,
        QueryError::MemoryLimit { .. }
        | QueryError::RowLimit { .. }
        | QueryError::AnswerTooLarge { .. }
        | QueryError::ValueTooLarge(_) => StatusCode::UNPROCESSABLE_ENTITY,
        QueryError::TimeLimit { .. } => StatusCode::REQUEST_TIMEOUT,
        QueryError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
        QueryError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = error_response(status_of(&self.0), self.0.kind(), &self.0.to_string());
        if let QueryError::Busy { retry_after_s } = self.0 {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        response
    }
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": {"kind": kind, "message": message}}).to_string(),
    )
        .into_response()
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/sql", post(sql))
        .route("/v1/reports", get(list_reports))
        .route("/v1/reports/{name}", get(report))
        .route("/v1/what-if", post(what_if))
        .route("/v1/tables", get(tables))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(|| async {
            error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; GET /v1/openapi.json lists them",
            )
        })
        .layer(middleware::from_fn(head_limits))
        .layer(middleware::from_fn(catch_panics))
        .layer(middleware::map_response(json_errors))
        .with_state(state)
}

/// A panic while a request is handled fails that request alone, with a 500 in the
/// documented JSON (the detail goes to the log), instead of dropping its connection.
async fn catch_panics(request: Request, next: Next) -> Response {
    use futures::FutureExt;
    let route = request.uri().path().to_owned();
    match std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(%route, panic = %what, "a request's handler panicked");
            error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request failed; the service log has the detail",
            )
        }
    }
}

/// The longest request target the service reads (path and query string), bytes.
pub const MAX_URI_BYTES: usize = 8 << 10;
/// The most header fields, and header bytes, the service reads.
pub const MAX_HEADERS: usize = 64;
/// See [`MAX_HEADERS`].
pub const MAX_HEADER_BYTES: usize = 32 << 10;
/// What hyper itself reads before it answers 414 or 431 without a body: well past the
/// service's own limits, so that below these every refusal is the documented JSON.
const HYPER_MAX_HEADERS: usize = 1_024;
const HYPER_BUFFER_BYTES: usize = 1 << 20;

/// Refuses a request target or a header section past the service's limits with 414 or
/// 431 in the documented JSON.
async fn head_limits(request: Request, next: Next) -> Response {
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return error_response(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            &format!(
                "the request target is {target} bytes; the service reads {MAX_URI_BYTES} at \
                 most: send long SQL in the body of POST /v1/sql"
            ),
        );
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return error_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!(
                "the request has {} header fields in {bytes} bytes; the service reads \
                 {MAX_HEADERS} fields and {MAX_HEADER_BYTES} bytes at most",
                headers.len()
            ),
        );
    }
    next.run(request).await
}

/// Every error answer in the documented JSON form, the framework's own rejections included
/// (a wrong method, a body too large or not UTF-8, a malformed query string): their plain
/// text is replaced by a message that does not echo the request. Headers such as `Allow`
/// stay.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (kind, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "this route does not take that method; GET /v1/openapi.json lists the routes",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "body_too_large",
            "the request body is larger than the service takes (2 MiB)",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            "send the body as text/plain (SQL, a policy) or application/json",
        ),
        s if s.is_server_error() => (
            "internal",
            "the request failed; the service log has the detail",
        ),
        _ => (
            "bad_request",
            "the request could not be read: check the query string and that the body is UTF-8 text",
        ),
    };
    let (mut parts, _) = response.into_parts();
    let fresh = error_response(status, kind, message);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, fresh.into_body())
}

/// Binds `addr` and serves until `shutdown` resolves, then lets the requests in flight
/// finish. Without tokens, only a loopback address is accepted.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = bind(&state, addr).await?;
    tracing::info!(addr = %listener.local_addr()?, auth = !state.tokens.is_empty(), "query service listening");
    accept_loop(listener, router(state), shutdown).await;
    Ok(())
}

/// Binds `addr` and serves in the background; returns the bound address (port 0 picks one).
pub async fn spawn(
    state: Arc<AppState>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = bind(&state, addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(accept_loop(listener, router(state), std::future::pending()));
    Ok((bound, task))
}

/// Serves HTTP/1.1 connections from `listener` until `shutdown`, then waits for the open
/// ones to finish their requests. hyper reads more of a request's head than the service
/// takes ([`MAX_URI_BYTES`], [`MAX_HEADERS`]), so that the service, not hyper, refuses it,
/// in JSON.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_headers(HYPER_MAX_HEADERS)
                .max_buf_size(HYPER_BUFFER_BYTES);
            let connection =
                builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = async {
                    let _ = stop.wait_for(|stop| *stop).await;
                } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        });
        // Finished connections leave the set as they go.
        while connections.try_join_next().is_some() {}
    }
    stop_tx.send_replace(true);
    while connections.join_next().await.is_some() {}
}

/// Binds `addr`, refusing a non-loopback address when no token is configured.
pub async fn bind(state: &AppState, addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    check_exposure(&state.tokens, addr)?;
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the query service to {addr}: {e}"),
        )
    })
}

/// No token, no listening beyond loopback.
pub fn check_exposure(tokens: &[String], addr: SocketAddr) -> std::io::Result<()> {
    if tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "no token is configured, so the service listens on loopback only, not {addr}: \
                 configure tokens (--tokens-file) or listen on 127.0.0.1"
            ),
        ));
    }
    Ok(())
}

async fn auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.tokens.is_empty() {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(token)
            if state
                .tokens
                .iter()
                .any(|t| constant_time_eq(t.as_bytes(), token.as_bytes())) =>
        {
            next.run(request).await
        }
        _ => {
            let mut r = error_response(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this service wants a bearer token: Authorization: Bearer <token>",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    }
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

fn pick_format(
    params: &BTreeMap<String, String>,
    headers: &HeaderMap,
) -> Result<Format, QueryError> {
    if let Some(name) = params.get("format") {
        return Format::from_name(name).ok_or_else(|| {
            QueryError::Invalid(format!(
                "format {name:?} is not one of {}",
                Format::NAMES.join(", ")
            ))
        });
    }
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("*/*");
    Format::from_accept(accept).ok_or_else(|| {
        QueryError::Invalid(format!(
            "Accept {accept:?} names no format this service writes: application/json, text/csv, \
             application/vnd.apache.arrow.stream, application/vnd.apache.parquet"
        ))
    })
}

async fn sql(
    State(state): State<Arc<AppState>>,
    Query(params): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let text = if is_json {
        match serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("sql").and_then(|s| s.as_str()).map(str::to_string))
        {
            Some(s) => s,
            None => {
                return answer_error(
                    &state,
                    "sql",
                    QueryError::Invalid(
                        "a JSON body must be an object with a string field \"sql\"".into(),
                    ),
                );
            }
        }
    } else {
        body
    };
    if text.trim().is_empty() {
        return answer_error(
            &state,
            "sql",
            QueryError::Invalid("the body holds no SQL".into()),
        );
    }
    let at = match as_of(&params) {
        Ok(at) => at,
        Err(e) => return answer_error(&state, "sql", e),
    };
    answer(&state, "sql", &text, &params, &headers, at).await
}

/// The time travel `/v1/sql` asks for: `?version=N` (a version of the raw table's log) or
/// `?as_of=2026-11-30T12:00:00Z` (the newest version committed by then); neither is now.
pub fn as_of(params: &BTreeMap<String, String>) -> Result<Option<AsOf>, QueryError> {
    match (params.get("version"), params.get("as_of")) {
        (Some(_), Some(_)) => Err(QueryError::Invalid(
            "give version or as_of, not both".into(),
        )),
        (Some(v), None) => v
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|v| *v >= 0)
            .map(|v| Some(AsOf::Version(v)))
            .ok_or_else(|| {
                QueryError::Invalid(format!(
                    "parameter version: {v:?} is not a version of the raw table (a whole number from 0)"
                ))
            }),
        (None, Some(t)) => chrono::DateTime::parse_from_rfc3339(t.trim())
            .map(|t| Some(AsOf::Time(t.with_timezone(&chrono::Utc))))
            .map_err(|e| {
                QueryError::Invalid(format!(
                    "parameter as_of: {t:?} is not an RFC 3339 time such as 2026-11-30T12:00:00Z ({e})"
                ))
            }),
        (None, None) => Ok(None),
    }
}

async fn report(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let sql = match state.engine.report_sql(&name, &params).await {
        Ok(sql) => sql,
        Err(e) => return answer_error(&state, "report", e),
    };
    tracing::debug!(report = %name, %sql, "report");
    answer(&state, "report", &sql, &params, &headers, None).await
}

/// `POST /v1/what-if?from=…&to=…&keys=N`, the candidate policy (TOML) in the body.
async fn what_if(
    State(state): State<Arc<AppState>>,
    Query(params): Query<BTreeMap<String, String>>,
    body: String,
) -> Response {
    let answer = async {
        for name in params.keys() {
            if !["from", "to", "keys"].contains(&name.as_str()) {
                return Err(QueryError::Invalid(format!(
                    "what-if has no parameter {name:?}; it takes: from, to, keys"
                )));
            }
        }
        let keys = match params.get("keys") {
            Some(k) => k
                .parse::<usize>()
                .ok()
                .filter(|k| *k <= 10_000)
                .ok_or_else(|| {
                    QueryError::Invalid("parameter keys: a whole number from 0 to 10000".into())
                })?,
            None => 10,
        };
        let range = crate::reports::Range::parse(
            params.get("from").map(String::as_str),
            params.get("to").map(String::as_str),
            chrono::Utc::now(),
            7,
        )?;
        let candidate = crate::whatif::candidate(&body)?;
        crate::whatif::what_if(&state.engine, candidate, range, keys).await
    }
    .await;
    match answer {
        Ok(w) => {
            state
                .metrics
                .requests
                .with_label_values(&["what_if", "ok"])
                .inc();
            (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(&w).unwrap_or_default(),
            )
                .into_response()
        }
        Err(e) => answer_error(&state, "what_if", e),
    }
}

fn answer_error(state: &AppState, endpoint: &str, e: QueryError) -> Response {
    state
        .metrics
        .requests
        .with_label_values(&[endpoint, e.kind()])
        .inc();
    ApiError(e).into_response()
}

async fn answer(
    state: &AppState,
    endpoint: &str,
    sql: &str,
    params: &BTreeMap<String, String>,
    headers: &HeaderMap,
    at: Option<AsOf>,
) -> Response {
    let started = Instant::now();
    let format = match pick_format(params, headers) {
        Ok(f) => f,
        Err(e) => return answer_error(state, endpoint, e),
    };
    let result = match format {
        Format::Json => json_answer(state, sql, at).await,
        other => streamed_answer(state, endpoint, sql, other, at).await,
    };
    state
        .metrics
        .seconds
        .with_label_values(&[endpoint])
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok((response, rows)) => {
            state
                .metrics
                .requests
                .with_label_values(&[endpoint, "ok"])
                .inc();
            if let Some(rows) = rows {
                state
                    .metrics
                    .rows
                    .with_label_values(&[endpoint])
                    .inc_by(rows as u64);
            }
            response
        }
        Err(e) => {
            tracing::info!(endpoint, kind = e.kind(), error = %e, "query refused or failed");
            answer_error(state, endpoint, e)
        }
    }
}

async fn json_answer(
    state: &AppState,
    sql: &str,
    at: Option<AsOf>,
) -> Result<(Response, Option<usize>), QueryError> {
    let limits = state.engine.limits();
    let (schema, batches) = state
        .engine
        .collect_bounded_at(sql, limits.json_rows, limits.json_bytes, at)
        .await?;
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let body = json(&schema, &batches).map_err(|e| {
        tracing::warn!(error = %e, "encoding JSON failed");
        QueryError::Internal
    })?;
    Ok((
        ([(header::CONTENT_TYPE, Format::Json.content_type())], body).into_response(),
        Some(rows),
    ))
}

/// Starts the query and waits for its first batch, so that an error before any row is a
/// clean error answer; the rest streams. An error later cuts the stream short (the client
/// sees an incomplete body, never a complete-looking wrong one).
async fn streamed_answer(
    state: &AppState,
    endpoint: &str,
    sql: &str,
    format: Format,
    at: Option<AsOf>,
) -> Result<(Response, Option<usize>), QueryError> {
    let mut stream: QueryStream = state.engine.run_at(sql, at).await?;
    let schema = stream.schema();
    let first = stream.next().await.transpose()?;
    let internal = |e: arrow::error::ArrowError| {
        tracing::warn!(error = %e, "encoding the answer failed");
        QueryError::Internal
    };
    let mut encoder = Encoder::new(format, &schema).map_err(internal)?;
    let head = match &first {
        Some(b) => encoder.batch(b).map_err(internal)?,
        None => bytes::Bytes::new(),
    };
    let rows_metric = state.metrics.rows.with_label_values(&[endpoint]);
    rows_metric.inc_by(first.as_ref().map_or(0, |b| b.num_rows() as u64));
    let body = futures::stream::unfold(Some((stream, encoder, schema)), move |st| {
        let rows_metric = rows_metric.clone();
        async move {
            let (mut stream, mut encoder, schema) = st?;
            match stream.next().await {
                Some(Ok(batch)) => {
                    rows_metric.inc_by(batch.num_rows() as u64);
                    match encoder.batch(&batch) {
                        Ok(bytes) => Some((Ok(bytes), Some((stream, encoder, schema)))),
                        Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "query failed while streaming; answer cut short");
                    Some((Err(std::io::Error::other(e.to_string())), None))
                }
                None => match encoder.finish(&schema) {
                    Ok(bytes) => Some((Ok(bytes), None)),
                    Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
                },
            }
        }
    });
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(head) }).chain(body);
    let response = Response::builder()
        .header(header::CONTENT_TYPE, format.content_type())
        .body(Body::from_stream(body))
        .map_err(|_| QueryError::Internal)?;
    Ok((response, None))
}

async fn list_reports() -> Response {
    axum::Json(json!({"reports": catalog()})).into_response()
}

async fn tables(State(state): State<Arc<AppState>>) -> Response {
    match state.engine.table_schemas().await {
        Ok(tables) => {
            let tables: Vec<serde_json::Value> = tables
                .iter()
                .map(|(name, schema)| {
                    let columns: Vec<serde_json::Value> = schema
                        .fields()
                        .iter()
                        .map(|f| json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
                        .collect();
                    json!({"name": name, "columns": columns})
                })
                .collect();
            axum::Json(json!({"tables": tables})).into_response()
        }
        Err(e) => ApiError(e).into_response(),
    }
}

async fn openapi() -> Response {
    axum::Json(openapi_document()).into_response()
}

/// What every route may answer: a wrong method, a request head past the limits.
const HEAD_ERRORS: &[&str] = &["405", "414", "431"];
/// Every `/v1` route: the same, and a missing token.
const V1_ERRORS: &[&str] = &["401", "405", "414", "431"];
/// A route that runs a query.
const QUERY_ERRORS: &[&str] = &[
    "400", "401", "404", "405", "408", "414", "422", "431", "500", "503",
];
/// A route that reads a body.
const BODY_ERRORS: &[&str] = &["413", "415"];

/// `responses` with the documented error answer for each of `codes`.
fn with_errors(mut responses: serde_json::Value, codes: &[&str]) -> serde_json::Value {
    if let Some(map) = responses.as_object_mut() {
        for code in codes {
            map.insert(
                (*code).to_owned(),
                json!({"$ref": "#/components/responses/Error"}),
            );
        }
    }
    responses
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi_document() -> serde_json::Value {
    let formats = json!({
        "name": "format", "in": "query", "required": false,
        "description": "answer format (default: from Accept, else json); json is bounded by the row limit, the others stream",
        "schema": {"type": "string", "enum": Format::NAMES}
    });
    let answer = json!({
        "200": {"description": "the rows", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Rows"}},
            "text/csv": {"schema": {"type": "string"}},
            "application/vnd.apache.arrow.stream": {"schema": {"type": "string", "format": "binary"}},
            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}}
        }},
    });
    let answer = with_errors(answer, QUERY_ERRORS);
    let mut report_params = vec![
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string", "enum": catalog().iter().map(|r| r.name).collect::<Vec<_>>()}}),
        formats.clone(),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for r in catalog() {
        for p in r.params {
            if seen.insert(p.name) {
                report_params.push(json!({"name": p.name, "in": "query", "required": false, "description": p.doc, "schema": {"type": "string"}}));
            }
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "verdict query service", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Read-only SQL and named reports over the rate limiter's decisions: decisions, denied_hourly, overage, policies."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sql": {"post": {
                "summary": "Run one read-only SQL query (SELECT or EXPLAIN of one)",
                "parameters": [formats,
                    {"name": "version", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0},
                     "description": "time travel: `decisions` reads this version of the raw table's Delta log (the other tables as they are now)"},
                    {"name": "as_of", "in": "query", "required": false, "schema": {"type": "string", "format": "date-time"},
                     "description": "time travel: `decisions` reads the newest version committed at or before this time; not with version"}],
                "requestBody": {"required": true, "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "object", "required": ["sql"], "properties": {"sql": {"type": "string"}}}}
                }},
                "responses": with_errors(answer.clone(), BODY_ERRORS)
            }},
            "/v1/reports": {"get": {"summary": "The named reports and their parameters",
                "responses": with_errors(json!({"200": {"description": "reports", "content": {"application/json": {}}}}), V1_ERRORS)}},
            "/v1/reports/{name}": {"get": {"summary": "Run a named report", "parameters": report_params, "responses": answer}},
            "/v1/what-if": {"post": {
                "summary": "Replay the recorded requests of a range under a candidate policy (the limiter's decision core): per tier × route class, what it would have refused beside what was refused, and the keys that change most",
                "parameters": [
                    {"name": "from", "in": "query", "required": false, "description": "start, inclusive (default: to minus 7 days)", "schema": {"type": "string"}},
                    {"name": "to", "in": "query", "required": false, "description": "end, exclusive (default: the next full hour)", "schema": {"type": "string"}},
                    {"name": "keys", "in": "query", "required": false, "description": "keys to list (default 10, at most 10000)", "schema": {"type": "integer"}}
                ],
                "requestBody": {"required": true, "content": {"application/toml": {"schema": {"type": "string"}}, "text/plain": {"schema": {"type": "string"}}}},
                "responses": with_errors(
                    with_errors(json!({"200": {"description": "the replay", "content": {"application/json": {}}}}), QUERY_ERRORS),
                    BODY_ERRORS
                )
            }},
            "/v1/tables": {"get": {"summary": "The tables and their columns",
                "responses": with_errors(json!({"200": {"description": "tables", "content": {"application/json": {}}}}), &["401", "405", "414", "431", "500"])}},
            "/v1/openapi.json": {"get": {"summary": "This document", "responses": with_errors(json!({"200": {"description": "OpenAPI 3.1"}}), V1_ERRORS)}},
            "/healthz": {"get": {"summary": "Liveness", "security": [], "responses": with_errors(json!({"200": {"description": "ok"}}), HEAD_ERRORS)}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": with_errors(json!({"200": {"description": "text format 0.0.4"}}), HEAD_ERRORS)}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Rows": {"type": "object", "properties": {
                    "columns": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "type": {"type": "string"}}}},
                    "rows": {"type": "array", "items": {"type": "object"}},
                    "row_count": {"type": "integer"}
                }},
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                    "kind": {"type": "string", "enum": ["refused", "invalid_query", "query_too_large", "bad_request", "method_not_allowed", "body_too_large", "uri_too_long", "headers_too_large", "unsupported_media_type", "not_found", "memory_limit", "time_limit", "row_limit", "answer_too_large", "value_too_large", "busy", "internal", "unauthorized"]},
                    "message": {"type": "string"}
                }}}}
            },
            "responses": {"Error": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}
        }
    })
}

/// Loads bearer tokens: one per line of `path` (blank lines and `#` comments skipped).
pub fn load_tokens(path: &std::path::Path) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("reading tokens from {}: {e}", path.display()),
        )
    })?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    if tokens.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} holds no token", path.display()),
        ));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_travel_parameters_parse_or_say_what_is_wrong() {
        let p = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(as_of(&p(&[])).unwrap(), None);
        assert_eq!(
            as_of(&p(&[("version", "12")])).unwrap(),
            Some(AsOf::Version(12))
        );
        assert_eq!(
            as_of(&p(&[("as_of", "2026-11-30T12:00:00+01:00")])).unwrap(),
            Some(AsOf::Time(
                "2026-11-30T11:00:00Z"
                    .parse::<chrono::DateTime<chrono::Utc>>()
                    .unwrap()
            ))
        );
        for (params, says) in [
            (p(&[("version", "-1")]), "parameter version"),
            (p(&[("version", "latest")]), "parameter version"),
            (p(&[("as_of", "yesterday")]), "parameter as_of"),
            (
                p(&[("version", "1"), ("as_of", "2026-11-30T12:00:00Z")]),
                "not both",
            ),
        ] {
            let e = as_of(&params).unwrap_err();
            assert!(e.to_string().contains(says), "{params:?}: {e}");
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_fails_its_request_alone_in_json() {
        let router: Router = Router::new()
            .route(
                "/boom",
                get(|| async {
                    if std::hint::black_box(true) {
                        panic!("boom");
                    }
                    "unreachable"
                }),
            )
            .route("/fine", get(|| async { "fine" }))
            .layer(middleware::from_fn(catch_panics))
            .layer(middleware::map_response(json_errors));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, router, std::future::pending()));
        let client = reqwest::Client::new();
        let r = client
            .get(format!("http://{addr}/boom"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["kind"], "internal", "{v}");
        // The same connection and the service carry on.
        let r = client
            .get(format!("http://{addr}/fine"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "fine");
    }
}
