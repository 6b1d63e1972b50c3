//! The HTTP front end's connections, bounded ([`crate::connections`]): an idle connection
//! is closed after [`Limits::idle`] (hyper's header read timeout, which runs from when a
//! connection starts waiting for a request's head until the head is in, so it also ends a
//! client that sends its head too slowly); a connection is busy from each request until
//! its answer's body has been sent; a connection there is no place for is answered 503 in
//! the documented JSON and closed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use crate::connections::{Busy, Conn};
#[cfg(doc)]
use crate::limits::Limits;

/// Answers a connection there is no place for, 503 in the documented JSON form, and
/// closes it.
pub(super) async fn refuse(mut stream: tokio::net::TcpStream, max: usize) {
    // The request's head is read first (for a second at most): closing a socket with
    // unread data resets it, and the client would see the reset instead of the answer.
    crate::connections::read_some(&mut stream, |read| {
        read.windows(4).any(|w| w == b"\r\n\r\n")
    })
    .await;
    let body = serde_json::json!({
        "error": {
            "kind": "too_many_connections",
            "message": format!(
                "the service has {max} connections open, every one busy: retry in 1 s"
            ),
        }
    })
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    crate::connections::close(stream).await;
}

/// `router` as one connection's service: the connection is busy from each request until
/// its answer's body has been sent (or dropped).
pub(super) fn tracked(
    router: axum::Router,
    conn: Arc<Conn>,
) -> impl tower::Service<
    Request<hyper::body::Incoming>,
    Response = Response<Body>,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: Request<hyper::body::Incoming>| {
        let busy = conn.start();
        let router = router.clone();
        async move {
            let response = tower::ServiceExt::oneshot(router, request).await?;
            Ok(response.map(|body| {
                Body::new(Tracked {
                    body,
                    busy: Some(busy),
                })
            }))
        }
    })
}

/// An answer's body that keeps its connection busy until it is sent or dropped.
struct Tracked {
    body: Body,
    busy: Option<Busy>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            drop(self.busy.take());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
