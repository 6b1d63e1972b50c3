//! A gateway and an upstream inside this process, on loopback: what `verdict demo` sends its
//! traffic through and what `verdict-bench gateway` measures. The gateway is put together
//! as `verdict gateway` does it, by `verdict_gateway::GatewayBuilder`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use verdict_gateway::Gateway;
use verdict_limiter::CounterStore;

/// The built-in upstream: answers every request with a small JSON body.
pub async fn spawn_upstream() -> anyhow::Result<SocketAddr> {
    let app = axum::Router::new()
        .fallback(|| async { ([("content-type", "application/json")], "{\"ok\":true}\n") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the built-in upstream on loopback")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// A gateway serving on a loopback port until [`LocalGateway::stop`].
#[derive(Debug)]
pub struct LocalGateway {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl LocalGateway {
    /// Serves `gateway` on a free loopback port.
    pub async fn start<S: CounterStore>(gateway: Gateway<S>) -> anyhow::Result<Self> {
        let gateway = Arc::new(gateway);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the gateway on loopback")?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(verdict_gateway::serve(listener, gateway, async move {
            let _ = stopped.await;
        }));
        Ok(Self { addr, stop, server })
    }

    /// Stops listening and waits for the connections to close.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.server.await.context("the gateway task failed")??;
        Ok(())
    }
}
