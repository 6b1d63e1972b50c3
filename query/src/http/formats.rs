//! An answer in the format asked for (`?format=` or `Accept`): JSON bounded by the row and
//! size limits, CSV, Arrow and Parquet streamed.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::errors::ApiError;
use super::state::AppState;
use crate::engine::{Json, QueryStream, RunOptions};
use crate::error::QueryError;
use crate::format::{Encoder, Format};
use crate::view::AsOf;

pub(super) fn pick_format(
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

pub(super) fn answer_error(state: &AppState, endpoint: &str, e: QueryError) -> Response {
    state
        .metrics
        .requests
        .with_label_values(&[endpoint, e.kind()])
        .inc();
    ApiError(e).into_response()
}

pub(super) async fn answer(
    state: &AppState,
    endpoint: &str,
    sql: &str,
    params: &BTreeMap<String, String>,
    headers: &HeaderMap,
    at: Option<AsOf>,
    keep: Keep,
) -> Response {
    let started = Instant::now();
    let format = match pick_format(params, headers) {
        Ok(f) => f,
        Err(e) => return answer_error(state, endpoint, e),
    };
    let result = match format {
        Format::Json if keep == Keep::Yes && at.is_none() && state.engine.answers().enabled() => {
            kept_json_answer(state, sql).await
        }
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

/// Whether a JSON answer may be kept for the same query over unchanged tables (see
/// [`crate::answers`]): only a named report's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// A named report: kept.
    Yes,
    /// Ad-hoc SQL (it may read the clock): never kept.
    No,
}

/// The header that says whether an answer was kept from before (`hit`) or computed (`miss`).
pub const ANSWER_CACHE_HEADER: &str = "x-verdict-answer-cache";

/// A report's JSON answer, kept from before when nothing it reads has changed.
async fn kept_json_answer(
    state: &AppState,
    sql: &str,
) -> Result<(Response, Option<usize>), QueryError> {
    let Json { body, rows, kept } = state
        .engine
        .json(sql, &RunOptions::default().kept())
        .await?;
    let outcome = if kept { "hit" } else { "miss" };
    state
        .metrics
        .answer_cache
        .with_label_values(&[outcome])
        .inc();
    Ok((
        (
            [
                (header::CONTENT_TYPE, Format::Json.content_type()),
                (
                    header::HeaderName::from_static(ANSWER_CACHE_HEADER),
                    outcome,
                ),
            ],
            body,
        )
            .into_response(),
        Some(rows),
    ))
}

pub(super) async fn json_answer(
    state: &AppState,
    sql: &str,
    at: Option<AsOf>,
) -> Result<(Response, Option<usize>), QueryError> {
    let Json { body, rows, .. } = state
        .engine
        .json(sql, &RunOptions::default().at(at))
        .await?;
    Ok((
        ([(header::CONTENT_TYPE, Format::Json.content_type())], body).into_response(),
        Some(rows),
    ))
}

/// Starts the query and waits for its first batch, so that an error before any row is a
/// clean error answer; the rest streams. An error later cuts the stream short (the client
/// sees an incomplete body, never a complete-looking wrong one).
pub(super) async fn streamed_answer(
    state: &AppState,
    endpoint: &str,
    sql: &str,
    format: Format,
    at: Option<AsOf>,
) -> Result<(Response, Option<usize>), QueryError> {
    let mut stream: QueryStream = state.engine.run(sql, &RunOptions::default().at(at)).await?;
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
