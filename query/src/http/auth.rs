//! Who may ask: bearer tokens (loaded from a file, compared in constant time), and no
//! listening beyond loopback without them.

use std::net::SocketAddr;
use std::sync::Arc;

use super::errors::error_response;
use super::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

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

pub(super) async fn auth(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
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
