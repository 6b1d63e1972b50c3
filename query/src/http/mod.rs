//! The HTTP API (axum).
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/sql` | body: one SQL query (text, or JSON `{"sql": "…"}`) |
//! | `GET /v1/reports` | the named reports with their parameters |
//! | `GET /v1/reports/{name}?…` | one report's rows |
//! | `GET /v1/recommendations?…` | the review's recommendations, each proven by a replay of the range, as a policy |
//! | `GET /v1/tables` | the tables and their columns |
//! | `GET /v1/openapi.json` | the OpenAPI 3.1 document |
//! | `GET /healthz`, `GET /metrics` | liveness, Prometheus metrics (no token needed) |
//! | `GET /` | the analysts' page, which reads the routes above (the page needs no token; its queries do) |
//!
//! Answers are JSON unless `?format=csv|arrow|parquet` or the `Accept` header asks
//! otherwise; JSON is bounded by the row limit, the others stream. With tokens configured,
//! every `/v1` route wants `Authorization: Bearer <token>`; with none, [`serve`] listens only
//! on loopback.
//!
//! Here: the router, the handlers and the server. Beside it: `state.rs` (what the handlers
//! share: the engine, the tokens, the metrics), `auth.rs` (tokens,
//! loopback only without them), `errors.rs` (every refusal in the documented JSON, the
//! request head's limits, a panicking handler), `formats.rs` (the answer in the format
//! asked for, bounded or streamed), `openapi.rs` (the OpenAPI document) and `page.rs` (the
//! analysts' page and its embedded files).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::error::QueryError;
use crate::limits::Limits;
use crate::reports::{Form, catalog};
use crate::view::AsOf;

mod auth;
mod connections;
mod errors;
mod formats;
mod openapi;
pub mod page;
mod state;

use auth::auth;
pub use auth::{check_exposure, constant_time_eq, load_tokens};
use errors::{ApiError, catch_panics, error_response, head_limits, json_errors};
pub use errors::{MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES};
pub use formats::ANSWER_CACHE_HEADER;
use formats::{Keep, answer, answer_error};
use openapi::openapi;
pub use openapi::openapi_document;
pub use state::{AppState, QueryMetrics};

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/sql", post(sql))
        .route("/v1/reports", get(list_reports))
        .route("/v1/reports/{name}", get(report))
        .route("/v1/what-if", post(what_if))
        .route("/v1/recommendations", get(recommendations))
        .route("/v1/tables", get(tables))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .merge(page::routes())
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

/// What hyper itself reads before it answers 414 or 431 without a body: well past the
/// service's own limits, so that below these every refusal is the documented JSON.
const HYPER_MAX_HEADERS: usize = 1_024;
const HYPER_BUFFER_BYTES: usize = 1 << 20;

/// Binds `addr` and serves until `shutdown` resolves, then lets the requests in flight
/// finish. Without tokens, only a loopback address is accepted.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = bind(&state, addr).await?;
    tracing::info!(addr = %listener.local_addr()?, auth = !state.tokens.is_empty(), "query service listening");
    let limits = *state.engine.limits();
    accept_loop(listener, router(state), limits, shutdown).await;
    Ok(())
}

/// Binds `addr` and serves in the background; returns the bound address (port 0 picks one).
pub async fn spawn(
    state: Arc<AppState>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = bind(&state, addr).await?;
    let bound = listener.local_addr()?;
    let limits = *state.engine.limits();
    let task = tokio::spawn(accept_loop(
        listener,
        router(state),
        limits,
        std::future::pending(),
    ));
    Ok((bound, task))
}

/// Serves HTTP/1.1 connections from `listener` until `shutdown`, then waits for the open
/// ones to finish their requests. hyper reads more of a request's head than the service
/// takes ([`MAX_URI_BYTES`], [`MAX_HEADERS`]), so that the service, not hyper, refuses it,
/// in JSON. The connections are bounded by `limits` ([`connections`]).
async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let open = Arc::new(crate::connections::Connections::new(&limits));
    let mut tasks = tokio::task::JoinSet::new();
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
        let Some(conn) = open.admit() else {
            tracing::warn!(%peer, open = open.open(), "HTTP connection refused: every connection is busy");
            tasks.spawn(connections::refuse(stream, limits.connections));
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(connections::tracked(
            router.clone(),
            Arc::clone(&conn),
        ));
        let mut stop = stop_rx.clone();
        let open = Arc::clone(&open);
        tasks.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_headers(HYPER_MAX_HEADERS)
                .max_buf_size(HYPER_BUFFER_BYTES)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.idle);
            let connection =
                builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = async {
                    tokio::select! {
                        _ = stop.wait_for(|stop| *stop) => {}
                        () = conn.evicted() => {}
                    }
                } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            open.closed(&conn);
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        });
        // Finished connections leave the set as they go.
        while tasks.try_join_next().is_some() {}
    }
    stop_tx.send_replace(true);
    while tasks.join_next().await.is_some() {}
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

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let spilled = state.engine.spill_counters();
        state
            .metrics
            .render_with(&[&spilled.queries, &spilled.spills, &spilled.bytes])
    })
        .into_response()
}

/// The query parameters `/v1/sql` takes (names are case-sensitive).
const SQL_PARAMS: [&str; 3] = ["format", "version", "as_of"];

async fn sql(
    State(state): State<Arc<AppState>>,
    Query(params): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    // Media types are case-insensitive (RFC 9110, 8.3.1).
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("application/json"));
    if let Some(name) = params.keys().find(|n| !SQL_PARAMS.contains(&n.as_str())) {
        return answer_error(
            &state,
            "sql",
            QueryError::Invalid(format!(
                "/v1/sql has no parameter {}; it takes: {}",
                crate::error::shown(name),
                SQL_PARAMS.join(", ")
            )),
        );
    }
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
    answer(&state, "sql", &text, &params, &headers, at, Keep::No).await
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
    let sql = match state.engine.report_sql(&name, &params, Form::Served).await {
        Ok(sql) => sql,
        Err(e) => return answer_error(&state, "report", e),
    };
    tracing::debug!(report = %name, %sql, "report");
    answer(&state, "report", &sql, &params, &headers, None, Keep::Yes).await
}

/// The `keys` parameter of the replays: how many keys whose refusals change most to list
/// (10 unless given, at most 10,000).
fn keys_param(keys: Option<&String>) -> Result<usize, QueryError> {
    match keys {
        Some(k) => k
            .parse::<usize>()
            .ok()
            .filter(|k| *k <= 10_000)
            .ok_or_else(|| {
                QueryError::Invalid("parameter keys: a whole number from 0 to 10000".into())
            }),
        None => Ok(10),
    }
}

/// The keys a what-if replays whole before it samples them (`sample_keys`: from 1 to
/// 1,000,000,000; [`crate::whatif::SAMPLE_KEYS`] unless given).
fn sample_keys_param(sample: Option<&String>) -> Result<u64, QueryError> {
    match sample {
        Some(k) => k
            .parse::<u64>()
            .ok()
            .filter(|k| (1..=1_000_000_000).contains(k))
            .ok_or_else(|| {
                QueryError::Invalid(
                    "parameter sample_keys: a whole number from 1 to 1000000000".into(),
                )
            }),
        None => Ok(crate::whatif::SAMPLE_KEYS),
    }
}

/// `POST /v1/what-if?from=…&to=…&keys=N&sample_keys=M`, the candidate policy (TOML) in
/// the body.
async fn what_if(
    State(state): State<Arc<AppState>>,
    Query(params): Query<BTreeMap<String, String>>,
    body: String,
) -> Response {
    let answer = async {
        for name in params.keys() {
            if !["from", "to", "keys", "sample_keys"].contains(&name.as_str()) {
                return Err(QueryError::Invalid(format!(
                    "what-if has no parameter {name:?}; it takes: from, to, keys, sample_keys"
                )));
            }
        }
        let keys = keys_param(params.get("keys"))?;
        let sample_keys = sample_keys_param(params.get("sample_keys"))?;
        let range = crate::range::Range::parse(
            params.get("from").map(String::as_str),
            params.get("to").map(String::as_str),
            state.engine.now(),
            7,
        )?;
        let candidate = crate::whatif::candidate(&body)?;
        crate::whatif::what_if(&state.engine, candidate, range, keys, sample_keys).await
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

/// `GET /v1/recommendations?from=…&to=…&keys=N&…`: the limit review's recommendations, each
/// proven by replaying the range ([`crate::recommend::replay`]), with the policy in force
/// with them put in (TOML) and the `verdict policy set-limit` commands that apply them. It
/// takes the review's parameters (`wrong-limits`) and `keys`.
async fn recommendations(
    State(state): State<Arc<AppState>>,
    Query(mut params): Query<BTreeMap<String, String>>,
) -> Response {
    let answer = async {
        let keys = keys_param(params.remove("keys").as_ref())?;
        let replayed =
            crate::recommend::replay(&state.engine, &params, state.engine.now(), keys).await?;
        let policy = verdict_limiter::policy::to_toml(&replayed.candidate)
            .map_err(|e| QueryError::Invalid(format!("the recommended policy as TOML: {e}")))?;
        let mut body = serde_json::to_value(&replayed)
            .map_err(|e| QueryError::Invalid(format!("the answer as JSON: {e}")))?;
        body["policy"] = json!(policy);
        body["commands"] = json!(replayed.set_limit_commands());
        Ok::<_, QueryError>(body)
    }
    .await;
    match answer {
        Ok(body) => {
            state
                .metrics
                .requests
                .with_label_values(&["recommendations", "ok"])
                .inc();
            axum::Json(body).into_response()
        }
        Err(e) => answer_error(&state, "recommendations", e),
    }
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
        tokio::spawn(accept_loop(
            listener,
            router,
            Limits::default(),
            std::future::pending(),
        ));
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
