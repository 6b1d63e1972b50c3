//! Every refusal in the documented JSON, `{"error": {"kind": …, "message": …}}`: a
//! query's error mapped to its status, the request head past the limits (414, 431), the
//! framework's own rejections, and a panicking handler (500, for that request alone).

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::QueryError;

/// An error answer: `{"error": {"kind": …, "message": …}}`.
pub(super) struct ApiError(pub(super) QueryError);

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        Self(e)
    }
}

pub(super) fn status_of(e: &QueryError) -> StatusCode {
    match e {
        QueryError::Refused(_) | QueryError::Invalid(_) | QueryError::TooLarge(_) => {
            StatusCode::BAD_REQUEST
        }
        QueryError::NotFound(_) => StatusCode::NOT_FOUND,
        QueryError::MemoryLimit { .. }
        | QueryError::SpillLimit { .. }
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

pub(super) fn error_response(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": {"kind": kind, "message": message}}).to_string(),
    )
        .into_response()
}

/// A panic while a request is handled fails that request alone, with a 500 in the
/// documented JSON (the detail goes to the log), instead of dropping its connection.
pub(super) async fn catch_panics(request: Request, next: Next) -> Response {
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

/// Refuses a request target or a header section past the service's limits with 414 or
/// 431 in the documented JSON.
pub(super) async fn head_limits(request: Request, next: Next) -> Response {
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
pub(super) async fn json_errors(response: Response) -> Response {
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
