//! Stopping the long-running commands cleanly.

use anyhow::Context;

/// Registers the SIGTERM and SIGINT handlers now, and returns a future that resolves on
/// the first of them. Registering eagerly means a signal delivered before the future is
/// first polled is not lost (and does not kill the process with the default action).
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    tracing::info!("listening for SIGTERM and Ctrl-C");
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: flushing and stopping"),
            _ = int.recv() => tracing::info!("Ctrl-C: flushing and stopping"),
        }
    })
}
