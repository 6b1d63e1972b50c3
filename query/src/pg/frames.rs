//! The PostgreSQL front end's protocol library reads a message whole before anything looks
//! at it, and takes a Query or a Parse of up to 1 GiB: a client could make the process hold
//! a gigabyte for each connection before the statement's size check refused it. So every
//! connection's bytes pass through [`guard`] on their way in. It follows the messages'
//! framing and refuses a message by the length its header declares, before its body is read:
//! a Query past the statement limit ([`crate::guard::MAX_STATEMENT_BYTES`]), any other
//! message past [`MAX_MESSAGE`]. The client is told why (an ErrorResponse with SQLSTATE
//! 54000) and the connection is closed: what follows the header cannot be skipped without
//! reading it.
//!
//! The guard also answers a client's request for TLS or GSSAPI encryption (this service
//! speaks neither: 'N', and the client goes on in the clear, as `sslmode=prefer` does), and
//! says when the client has gone.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{Mutex, watch};

use crate::guard::MAX_STATEMENT_BYTES;

/// The largest message other than a Query the front end reads: 1 MiB (a Parse's statement
/// with its parameter types, a Bind's parameter values).
pub const MAX_MESSAGE: usize = 1 << 20;

/// The largest startup message (as PostgreSQL and pgwire take).
const MAX_STARTUP: usize = 10_000;

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// Where the framing is.
#[derive(Debug, Default)]
struct Framing {
    /// Past the startup message: messages start with a type byte.
    typed: bool,
    /// The current message's first bytes, while its header is incomplete (and, before the
    /// startup message, the whole of each untyped message).
    head: Vec<u8>,
    /// Bytes of the current message's body still to pass.
    body: usize,
}

/// What passing a chunk of the client's bytes did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Pass these bytes to the protocol.
    Pass(Vec<u8>),
    /// Tell the client 'N' (no encryption); nothing passes.
    Decline,
    /// A message too large: its type and declared length.
    Refuse(char, usize),
}

impl Framing {
    /// Follows `chunk`; the steps in order.
    fn feed(&mut self, mut chunk: &[u8]) -> Vec<Step> {
        let mut steps = Vec::new();
        let mut pass = Vec::with_capacity(chunk.len());
        while !chunk.is_empty() {
            if self.body > 0 {
                let n = self.body.min(chunk.len());
                pass.extend_from_slice(&chunk[..n]);
                self.body -= n;
                chunk = &chunk[n..];
                continue;
            }
            if self.typed {
                let need = 5 - self.head.len();
                let n = need.min(chunk.len());
                self.head.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                if self.head.len() < 5 {
                    break;
                }
                let kind = self.head[0] as char;
                let len =
                    u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]])
                        as usize;
                let limit = if kind == 'Q' {
                    // The statement, its terminating NUL and the length itself.
                    MAX_STATEMENT_BYTES + 5
                } else {
                    MAX_MESSAGE
                };
                if len > limit {
                    if !pass.is_empty() {
                        steps.push(Step::Pass(std::mem::take(&mut pass)));
                    }
                    steps.push(Step::Refuse(kind, len));
                    return steps;
                }
                pass.append(&mut self.head);
                self.body = len.saturating_sub(4);
            } else {
                // Untyped: the length, then the rest; kept whole until complete.
                if self.head.len() < 4 {
                    let n = (4 - self.head.len()).min(chunk.len());
                    self.head.extend_from_slice(&chunk[..n]);
                    chunk = &chunk[n..];
                    if self.head.len() < 4 {
                        break;
                    }
                }
                let len =
                    u32::from_be_bytes([self.head[0], self.head[1], self.head[2], self.head[3]])
                        as usize;
                if !(8..=MAX_STARTUP).contains(&len) {
                    if !pass.is_empty() {
                        steps.push(Step::Pass(std::mem::take(&mut pass)));
                    }
                    steps.push(Step::Refuse('0', len));
                    return steps;
                }
                let n = (len - self.head.len()).min(chunk.len());
                self.head.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                if self.head.len() < len {
                    break;
                }
                let code =
                    u32::from_be_bytes([self.head[4], self.head[5], self.head[6], self.head[7]]);
                if code == SSL_REQUEST || code == GSSENC_REQUEST {
                    if !pass.is_empty() {
                        steps.push(Step::Pass(std::mem::take(&mut pass)));
                    }
                    self.head.clear();
                    steps.push(Step::Decline);
                    continue;
                }
                // The startup message (or a cancel request, after which the protocol ends
                // the connection): typed messages follow.
                pass.append(&mut self.head);
                self.typed = true;
            }
        }
        if !pass.is_empty() {
            steps.push(Step::Pass(pass));
        }
        steps
    }
}

/// An ErrorResponse of `severity` (ERROR, FATAL) with `code` and `message`, written by the
/// front end itself, outside the protocol library.
pub(super) fn error_response(severity: &str, code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = vec![b'E'];
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A client's connection behind [`guard`].
pub(super) struct Guarded {
    /// The stream the protocol runs on.
    pub socket: UnixStream,
    /// Turns true when the client has gone (its end closed, or the socket failed).
    pub gone: watch::Receiver<bool>,
    /// Turns true once the client's startup message has passed; closed (an error to wait
    /// on) when the client went or was refused before that.
    pub started: watch::Receiver<bool>,
}

/// How much of the client's bytes the guard reads at once: messages larger than this pass
/// in pieces.
const READ_CHUNK: usize = 16 << 10;

/// How much of the protocol's answers the guard passes at once (rows stream through it).
const WRITE_CHUNK: usize = 64 << 10;

/// Passes `socket`'s bytes to and from the protocol's stream, refusing a message too large
/// by its header. A connection costs its sockets and two tasks until it speaks: the buffers
/// are taken when its first bytes come, so connections that never send one cost little.
pub(super) fn guard(socket: TcpStream) -> std::io::Result<Guarded> {
    let (ours, theirs) = UnixStream::pair()?;
    let (mut client_in, client_out) = socket.into_split();
    let (mut server_in, mut server_out) = ours.into_split();
    let client_out = Arc::new(Mutex::new(client_out));
    let (gone, gone_rx) = watch::channel(false);
    let (started, started_rx) = watch::channel(false);
    // Told when the protocol has ended its side (the session closed, evicted or idle past
    // its time), so that the client's side is let go too, though the client sends nothing.
    let ended = Arc::new(tokio::sync::Notify::new());
    let protocol_ended = Arc::clone(&ended);
    // The protocol's answers, to the client as they come.
    let to_client = Arc::clone(&client_out);
    tokio::spawn(async move {
        let mut buf = Vec::new();
        loop {
            if buf.is_empty() {
                if server_in.readable().await.is_err() {
                    break;
                }
                buf = vec![0u8; WRITE_CHUNK];
            }
            let n = match server_in.read(&mut buf).await {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            if to_client.lock().await.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_client.lock().await.shutdown().await;
        protocol_ended.notify_one();
    });
    // The client's messages, to the protocol when their size allows.
    tokio::spawn(async move {
        let mut framing = Framing::default();
        let mut buf = Vec::new();
        loop {
            if buf.is_empty() {
                tokio::select! {
                    readable = client_in.readable() => if readable.is_err() {
                        gone.send_replace(true);
                        break;
                    },
                    () = ended.notified() => return,
                }
                buf = vec![0u8; READ_CHUNK];
            }
            let read = tokio::select! {
                read = client_in.read(&mut buf) => read,
                () = ended.notified() => return,
            };
            let n = match read {
                Ok(n) if n > 0 => n,
                _ => {
                    gone.send_replace(true);
                    break;
                }
            };
            for step in framing.feed(&buf[..n]) {
                match step {
                    Step::Pass(bytes) => {
                        if server_out.write_all(&bytes).await.is_err() {
                            return;
                        }
                        if framing.typed && !*started.borrow() {
                            started.send_replace(true);
                        }
                    }
                    Step::Decline => {
                        if client_out.lock().await.write_all(b"N").await.is_err() {
                            return;
                        }
                    }
                    Step::Refuse(kind, len) => {
                        let (what, limit) = match kind {
                            'Q' => ("statement", MAX_STATEMENT_BYTES),
                            '0' => ("startup message", MAX_STARTUP),
                            _ => ("message", MAX_MESSAGE),
                        };
                        tracing::warn!(kind = %kind, len, "PostgreSQL message too large: connection closed");
                        let message = format!(
                            "the {what} is {len} bytes; the limit is {limit}: the connection is \
                             closed"
                        );
                        let mut out = client_out.lock().await;
                        let _ = out
                            .write_all(&error_response("ERROR", "54000", &message))
                            .await;
                        let _ = out.shutdown().await;
                        gone.send_replace(true);
                        return;
                    }
                }
            }
        }
    });
    Ok(Guarded {
        socket: theirs,
        gone: gone_rx,
        started: started_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup() -> Vec<u8> {
        let body = b"\0\x03\0\0user\0a\0\0";
        let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    fn message(kind: u8, len: u32) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&len.to_be_bytes());
        m
    }

    #[test]
    fn a_query_past_the_statement_limit_is_refused_by_its_header() {
        let mut f = Framing::default();
        let mut ssl = 8u32.to_be_bytes().to_vec();
        ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        assert_eq!(f.feed(&ssl), vec![Step::Decline]);
        let s = startup();
        assert_eq!(f.feed(&s), vec![Step::Pass(s.clone())]);
        // A small query split inside its header: held until the header is whole, then it
        // passes whole.
        let mut q = message(b'Q', 4 + 9);
        q.extend_from_slice(b"SELECT 1\0");
        let (a, b) = q.split_at(3);
        assert_eq!(f.feed(a), vec![]);
        assert_eq!(f.feed(b), vec![Step::Pass(q.clone())]);
        // A 1 GB query: refused on its five header bytes.
        let big = message(b'Q', 1 << 30);
        assert_eq!(f.feed(&big), vec![Step::Refuse('Q', 1 << 30)]);
        let mut f = Framing::default();
        f.feed(&startup());
        let bind = message(b'B', (MAX_MESSAGE + 1) as u32);
        assert_eq!(f.feed(&bind), vec![Step::Refuse('B', MAX_MESSAGE + 1)]);
    }
}
