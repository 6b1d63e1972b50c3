//! A front end's open connections, bounded: at most [`Limits::connections`] at once. A
//! connection is idle when it is running nothing for its client (HTTP: no request being
//! answered, no answer's body being sent; PostgreSQL: no statement running or holding
//! rows). When every place is taken, a new connection takes the place of the connection
//! idle longest, which is told to close; when none is idle, the new one is refused. So no
//! number of idle connections shuts a working client out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::limits::Limits;

/// One open connection, as the front end tracks it.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    /// Requests being answered, and answers whose body is being sent.
    busy: AtomicUsize,
    /// When it last became idle.
    idle_since: Mutex<Instant>,
    /// Told to close (it is closed as soon as it is idle, which it is when told).
    close: tokio::sync::Notify,
}

impl Conn {
    /// Waits until the front end takes this connection's place for another.
    pub(crate) async fn evicted(&self) {
        self.close.notified().await;
    }

    /// Waits until it has been idle for `idle` (running nothing for its client).
    pub(crate) async fn idle_for(&self, idle: std::time::Duration) {
        loop {
            let since = self
                .idle_since
                .lock()
                .map_or_else(|_| Instant::now(), |t| *t);
            let due = since + idle;
            if self.busy.load(Ordering::Acquire) == 0 && Instant::now() >= due {
                return;
            }
            let wake = due.max(Instant::now() + std::time::Duration::from_millis(100));
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        }
    }

    /// Marks it busy until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(self))
    }
}

/// A request (or the body of its answer) in progress on a connection; the connection is
/// idle again once every one is dropped.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::AcqRel) == 1
            && let Ok(mut since) = self.0.idle_since.lock()
        {
            *since = Instant::now();
        }
    }
}

/// The open connections of one front end.
#[derive(Debug)]
pub(crate) struct Connections {
    max: usize,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Connections {
    /// At most `limits.connections` at once.
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            max: limits.connections.max(1),
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A place for a new connection: a free one, or the place of the connection idle
    /// longest (told to close); `None` when every connection is busy.
    pub(crate) fn admit(&self) -> Option<Arc<Conn>> {
        let mut open = self.open.lock().ok()?;
        if open.len() >= self.max {
            let idle_longest = open
                .values()
                .filter(|c| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|c| c.idle_since.lock().map_or_else(|_| Instant::now(), |t| *t))
                .map(|c| c.id)?;
            if let Some(old) = open.remove(&idle_longest) {
                old.close.notify_one();
                tracing::debug!(
                    connection = idle_longest,
                    "an idle connection closed to make room"
                );
            }
        }
        let conn = Arc::new(Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: tokio::sync::Notify::new(),
        });
        open.insert(conn.id, Arc::clone(&conn));
        Some(conn)
    }

    /// Gives `conn`'s place back (it has closed).
    pub(crate) fn closed(&self, conn: &Conn) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&conn.id);
        }
    }

    /// How many are open.
    pub(crate) fn open(&self) -> usize {
        self.open.lock().map_or(0, |o| o.len())
    }
}

/// Reads from `stream` until `enough` says what was read is enough, the client stops
/// sending, 64 KiB, or a second: what a refusal reads of a connection before answering it.
pub(crate) async fn read_some(stream: &mut tokio::net::TcpStream, enough: impl Fn(&[u8]) -> bool) {
    use tokio::io::AsyncReadExt;
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    while read.len() < 64 << 10 && !enough(&read) {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => read.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
}

/// Closes `stream` after what was written: the write side first, then whatever the client
/// still sends is read (for a second at most), so that the answer is not lost to a reset.
pub(crate) async fn close(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
        if n == 0 {
            break;
        }
    }
}
