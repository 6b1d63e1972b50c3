//! The limits of the HTTP front end, held over the PostgreSQL wire too: every statement
//! waits for a place in the shared budget's line (refused as busy past the queue timeout),
//! runs under the service's time limit (or the client's `statement_timeout` when shorter),
//! stops on the connection's cancel request, and is checked for size
//! ([`crate::engine::check_size`]) before anything plans it. One statement per query, in both
//! protocols: several are refused, not run one by one nor cut to the first.
//!
//! A client that closes its connection stops its statement too ([`watch_gone`]).
//!
//! A statement's plan is lazy: most of its work happens while its rows are sent. So the
//! bounds hold for the rows too: a watchdog drops the plan (its memory, its place in line)
//! at the deadline or on cancel, there and then, even for a portal suspended by its row
//! limit that nobody fetches from, and the rows end with the error.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use datafusion_postgres::pgwire::api::cancel::CancelHandler;
use datafusion_postgres::pgwire::api::portal::{Format, Portal};
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{FieldInfo, QueryResponse, Response};
use datafusion_postgres::pgwire::api::stmt::QueryParser;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{ClientInfo, ClientPortalStore, Type};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use datafusion_postgres::pgwire::messages::cancel::CancelRequest;
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::{DfSessionService, Parser};
use futures::{Sink, Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::engine::{Engine, check_size};
use crate::error::QueryError;

/// A PostgreSQL error with `code` (SQLSTATE) and `message`.
pub(super) fn pg_error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        message,
    )))
}

/// The SQLSTATE of a refusal of the engine's.
fn code_of(e: &QueryError) -> &'static str {
    match e {
        // program_limit_exceeded
        QueryError::TooLarge(_) => "54000",
        // insufficient_resources
        QueryError::Busy { .. } => "53000",
        // query_canceled
        QueryError::TimeLimit { .. } => "57014",
        // syntax_error_or_access_rule_violation
        _ => "42000",
    }
}

fn refused_by_engine(e: QueryError) -> PgWireError {
    pg_error(code_of(&e), e.to_string())
}

/// A connection as a cancel request names it: its process id and secret key.
type Backend = (i32, Vec<u8>);

/// The cancel requests of live connections.
#[derive(Debug, Default)]
pub(super) struct Cancels {
    live: Mutex<HashMap<Backend, Arc<watch::Sender<u64>>>>,
}

impl Cancels {
    /// Registers a connection; the slot goes into its session and unregisters on drop.
    pub(super) fn register(self: &Arc<Self>, pid: i32, secret: Vec<u8>) -> CancelSlot {
        let (tx, _) = watch::channel(0);
        let tx = Arc::new(tx);
        if let Ok(mut live) = self.live.lock() {
            live.insert((pid, secret.clone()), Arc::clone(&tx));
        }
        CancelSlot {
            tx,
            key: (pid, secret),
            cancels: Arc::clone(self),
        }
    }
}

/// One connection's cancel signal: a count of cancel requests, watched by its statement.
pub(super) struct CancelSlot {
    tx: Arc<watch::Sender<u64>>,
    key: Backend,
    cancels: Arc<Cancels>,
}

impl Drop for CancelSlot {
    fn drop(&mut self) {
        if let Ok(mut live) = self.cancels.live.lock() {
            live.remove(&self.key);
        }
    }
}

/// Answers a cancel request (it comes on a connection of its own) by signalling the
/// connection it names, if the secret matches; anything else is ignored, as PostgreSQL does.
#[derive(Debug)]
pub(super) struct CancelRequests(pub(super) Arc<Cancels>);

#[async_trait]
impl CancelHandler for CancelRequests {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let key = (request.pid, request.secret_key.to_bytes().to_vec());
        let tx = self
            .0
            .live
            .lock()
            .ok()
            .and_then(|live| live.get(&key).cloned());
        match tx {
            Some(tx) => {
                tx.send_modify(|n| *n += 1);
                tracing::info!(pid = request.pid, "PostgreSQL cancel request");
            }
            None => tracing::info!(
                pid = request.pid,
                "PostgreSQL cancel request for no live connection"
            ),
        }
    }
}

/// What ends a statement early: its deadline, or a cancel request.
type Stop = Pin<Box<dyn Future<Output = PgWireError> + Send>>;

/// One statement's bounds: its place in line and what stops it.
struct Bounds {
    /// Dropping it gives the place back.
    permit: OwnedSemaphorePermit,
    stop: Stop,
}

/// A statement's rows and place in line, until its stream ends or its bounds stop it.
#[derive(Default)]
struct Held {
    rows: Option<Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>>,
    permit: Option<OwnedSemaphorePermit>,
    /// Why the bounds stopped it, to be said once.
    stopped: Option<PgWireError>,
    /// Who waits for the next row.
    waker: Option<std::task::Waker>,
}

/// The statement's stream of rows, ended by its bounds. A watchdog task holds the bounds:
/// at the deadline, on cancel or when the client goes it drops the plan and the place in
/// line at once, even when nobody polls the rows (a portal suspended by its row limit and
/// never fetched again); the next poll says why.
struct BoundedRows {
    held: Arc<Mutex<Held>>,
    watchdog: tokio::task::JoinHandle<()>,
}

impl BoundedRows {
    fn new(
        rows: Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>,
        bounds: Bounds,
    ) -> Self {
        let held = Arc::new(Mutex::new(Held {
            rows: Some(rows),
            permit: Some(bounds.permit),
            ..Held::default()
        }));
        let watched = Arc::clone(&held);
        let stop = bounds.stop;
        let watchdog = tokio::spawn(async move {
            let e = stop.await;
            let (rows, permit, waker) = match watched.lock() {
                Ok(mut h) if h.rows.is_some() => {
                    h.stopped = Some(e);
                    (h.rows.take(), h.permit.take(), h.waker.take())
                }
                _ => return,
            };
            // Dropped outside the lock: dropping a plan aborts its tasks.
            drop((rows, permit));
            if let Some(waker) = waker {
                waker.wake();
            }
        });
        Self { held, watchdog }
    }
}

impl Drop for BoundedRows {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

impl Stream for BoundedRows {
    type Item = PgWireResult<DataRow>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Ok(mut held) = self.held.lock() else {
            return Poll::Ready(None);
        };
        if let Some(e) = held.stopped.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let Some(rows) = held.rows.as_mut() else {
            return Poll::Ready(None);
        };
        match rows.poll_next_unpin(cx) {
            Poll::Ready(None) => {
                let (rows, permit) = (held.rows.take(), held.permit.take());
                drop(held);
                drop((rows, permit));
                self.watchdog.abort();
                Poll::Ready(None)
            }
            Poll::Pending => {
                held.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            ready => ready,
        }
    }
}

/// Splits `socket` into the socket the protocol runs on and a signal that turns true when
/// the client has gone (its end closed, or the socket failed), watched on a second handle
/// of the same socket: the protocol reads the socket only between statements, so a client
/// that closes its connection during a long statement would go unnoticed until the time
/// limit.
pub(super) fn watch_gone(
    socket: tokio::net::TcpStream,
) -> std::io::Result<(tokio::net::TcpStream, watch::Receiver<bool>)> {
    let std = socket.into_std()?;
    let probe = tokio::net::TcpStream::from_std(std.try_clone()?)?;
    let socket = tokio::net::TcpStream::from_std(std)?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut byte = [0u8; 1];
        loop {
            tokio::select! {
                // The connection's session is gone: nothing left to watch.
                () = tx.closed() => return,
                peeked = probe.peek(&mut byte) => match peeked {
                    Ok(0) | Err(_) => {
                        tx.send_replace(true);
                        return;
                    }
                    // The client's next message, not read yet: look again in a while.
                    Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                },
            }
        }
    });
    Ok((socket, rx))
}

/// The session service with the engine's bounds around every statement.
pub(super) struct Bounded {
    inner: Arc<DfSessionService>,
    parser: Arc<OneStatement>,
    engine: Engine,
    gone: watch::Receiver<bool>,
}

impl Bounded {
    /// `inner` bounded by `engine`'s limits; `gone` turns true when the client has gone.
    pub(super) fn new(
        inner: Arc<DfSessionService>,
        engine: Engine,
        gone: watch::Receiver<bool>,
    ) -> Self {
        Self {
            parser: Arc::new(OneStatement {
                inner: inner.query_parser(),
            }),
            inner,
            engine,
            gone,
        }
    }

    /// A place in line, the deadline (the service's time limit, or the client's
    /// `statement_timeout` when shorter) and the connection's cancel requests.
    async fn bounds<C: ClientInfo + ?Sized>(&self, client: &C) -> PgWireResult<Bounds> {
        let permit = self
            .engine
            .budget()
            .admit()
            .await
            .ok_or_else(|| refused_by_engine(QueryError::Busy { retry_after_s: 5 }))?;
        let limit = self.engine.limits().timeout;
        // Where the session's SET statement_timeout keeps it (datafusion-postgres's hook).
        let own = client
            .metadata()
            .get("statement_timeout_ms")
            .and_then(|ms| ms.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis);
        let timeout = own.filter(|t| *t < limit);
        let deadline = tokio::time::Instant::now() + timeout.unwrap_or(limit);
        let expired = match timeout {
            Some(_) => pg_error(
                "57014",
                "canceling statement due to statement timeout".to_owned(),
            ),
            None => refused_by_engine(QueryError::TimeLimit {
                seconds: limit.as_secs(),
            }),
        };
        let mut cancel = client
            .session_extensions()
            .get::<CancelSlot>()
            .map(|slot| slot.tx.subscribe());
        let mut gone = self.gone.clone();
        let stop: Stop = Box::pin(async move {
            let cancelled = async {
                // A closed channel is a connection going away, not a cancel.
                let changed = match cancel.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => false,
                };
                if !changed {
                    std::future::pending::<()>().await;
                }
            };
            let left = async {
                if gone.wait_for(|gone| *gone).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => expired,
                () = cancelled => pg_error(
                    "57014",
                    "canceling statement due to user request".to_owned(),
                ),
                () = left => {
                    tracing::info!("PostgreSQL client gone: its statement stopped");
                    pg_error("57014", "canceling statement: the client has gone".to_owned())
                }
            }
        });
        Ok(Bounds { permit, stop })
    }

    /// Runs `work` within `bounds`; a query's rows carry the bounds on.
    async fn within<F>(mut bounds: Bounds, work: F) -> PgWireResult<Response>
    where
        F: Future<Output = PgWireResult<Response>>,
    {
        let response = tokio::select! {
            r = work => r?,
            e = bounds.stop.as_mut() => return Err(e),
        };
        Ok(match response {
            Response::Query(q) => {
                let tag = q.command_tag().to_owned();
                let schema = q.row_schema();
                let mut bounded = QueryResponse::new(schema, BoundedRows::new(q.data_rows, bounds));
                bounded.set_command_tag(&tag);
                Response::Query(bounded)
            }
            other => other,
        })
    }
}

/// Parses with the PostgreSQL front end's own parser and refuses more than one statement.
fn one_statement(sql: &str) -> PgWireResult<()> {
    check_size(sql).map_err(refused_by_engine)?;
    let statements = PostgresCompatibilityParser::new()
        .parse(sql)
        .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    if statements.len() > 1 {
        // feature_not_supported
        return Err(pg_error(
            "0A000",
            format!(
                "one statement per query: this one has {}; send them one at a time",
                statements.len()
            ),
        ));
    }
    Ok(())
}

#[async_trait]
impl SimpleQueryHandler for Bounded {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        one_statement(query)?;
        let bounds = self.bounds(client).await?;
        let inner = Arc::clone(&self.inner);
        let mut responses = Vec::with_capacity(1);
        let response = Self::within(bounds, async move {
            let mut all = SimpleQueryHandler::do_query(inner.as_ref(), client, query).await?;
            all.pop().ok_or(PgWireError::QueryCanceled)
        })
        .await?;
        responses.push(response);
        Ok(responses)
    }
}

/// The extended protocol's parser, refusing more than one statement in a Parse.
pub(super) struct OneStatement {
    inner: Arc<Parser>,
}

#[async_trait]
impl QueryParser for OneStatement {
    type Statement = <Parser as QueryParser>::Statement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        one_statement(sql)?;
        self.inner.parse_sql(client, sql, types).await
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        self.inner.get_parameter_types(stmt)
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        self.inner.get_result_schema(stmt, column_format)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Bounded {
    type Statement = <Parser as QueryParser>::Statement;
    type QueryParser = OneStatement;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::clone(&self.parser)
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let bounds = self.bounds(client).await?;
        let inner = Arc::clone(&self.inner);
        Self::within(bounds, async move {
            ExtendedQueryHandler::do_query(inner.as_ref(), client, portal, max_rows).await
        })
        .await
    }
}
