//! A small HTTP listener for the long-running commands (`verdict ingest`, `verdict jobs
//! run`): `/metrics` in Prometheus's text format and `/healthz`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// Binds `addr` now (so a taken port is an error at start, naming the address) and serves
/// `/metrics` from `render` and `/healthz` in the background.
pub async fn serve_metrics(
    addr: SocketAddr,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener to {addr}"))?;
    let bound = listener.local_addr()?;
    let render = Arc::new(render);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let render = Arc::clone(&render);
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        render(),
                    )
                        .into_response()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    tracing::info!(%bound, "serving /metrics and /healthz");
    Ok(bound)
}
