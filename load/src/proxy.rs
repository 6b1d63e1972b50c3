//! A TCP proxy on loopback for fault injection: it delays what the client sends, or cuts
//! the line. The fault tests put it between a client and Redis, Kafka or S3, and
//! `verdict-bench soak` between the gateways and PostgreSQL.

use std::time::Duration;

/// A TCP proxy on a free loopback port in front of a server, for fault tests: it can
/// delay what the client sends, and cut the line (live connections are dropped and new
/// ones closed at once) until restored.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    port: u16,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    up: tokio::sync::watch::Sender<bool>,
}

impl TcpProxy {
    /// Starts a proxy to `127.0.0.1:<upstream>`.
    ///
    /// # Errors
    /// When no loopback port can be had.
    pub async fn start(upstream: u16) -> std::io::Result<Self> {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (up, _) = tokio::sync::watch::channel(true);
        let proxy = Self {
            port,
            delay_ms: delay_ms.clone(),
            up: up.clone(),
        };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut line = up.subscribe();
                if !*line.borrow() {
                    continue; // dropped: the client sees the connection closed
                }
                let delay_ms = delay_ms.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up_dir = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            let d = delay_ms.load(Ordering::SeqCst);
                            if d > 0 {
                                tokio::time::sleep(Duration::from_millis(d)).await;
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down_dir = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::select! {
                        _ = async { tokio::join!(up_dir, down_dir) } => {}
                        _ = line.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Ok(proxy)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Delays everything the client sends by `ms`.
    pub fn set_delay_ms(&self, ms: u64) {
        self.delay_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Cuts the line: live connections are dropped, new ones closed.
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// Restores the line.
    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}
