//! The limits of the HTTP front end, held over the PostgreSQL wire too: every statement
//! waits for a place in the shared budget's line (refused as busy past the queue timeout),
//! runs under the service's time limit (or the client's `statement_timeout` when shorter),
//! stops on the connection's cancel request, and is checked for size
//! ([`crate::guard::check_size`]) before anything plans it. One statement per query, in both
//! protocols: several are refused, not run one by one nor cut to the first.
//!
//! A client that closes its connection stops its statement too (`frames::guard` says when).
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
use datafusion_postgres::pgwire::api::portal::{Format, Portal, PortalExecutionState};
use datafusion_postgres::pgwire::api::query::{
    ExtendedQueryHandler, SimpleQueryHandler, send_execution_response,
};
use datafusion_postgres::pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::stmt::QueryParser;
use datafusion_postgres::pgwire::api::store::{Entry, PortalStore};
use datafusion_postgres::pgwire::api::{
    ClientInfo, ClientPortalStore, DEFAULT_NAME, PgWireConnectionState, Type,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use datafusion_postgres::pgwire::messages::cancel::CancelRequest;
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::messages::extendedquery::{Execute, PortalSuspended};
use datafusion_postgres::pgwire::messages::response::EmptyQueryResponse;
use datafusion_postgres::{DfSessionService, Parser};
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::connections::{Busy, Conn};
use crate::engine::Engine;
use crate::error::QueryError;
use crate::guard::check_size;
use crate::limits::Limits;
use crate::memory::QueryMemory;

/// A PostgreSQL error with `code` (SQLSTATE) and `message`.
pub(super) fn pg_error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        message,
    )))
}

fn refused_by_engine(e: QueryError) -> PgWireError {
    pg_error(e.sqlstate(), e.to_string())
}

/// The error the client is told for one the front end's engine returned: a DataFusion
/// error gets the kind and words the HTTP service gives it ([`QueryError`]) and its
/// SQLSTATE, a parser's error is a syntax error (42601) in its own words; any other error
/// is passed on as it is.
fn named(e: PgWireError, limits: &Limits) -> PgWireError {
    match e {
        PgWireError::ApiError(inner) => {
            match inner.downcast::<datafusion::error::DataFusionError>() {
                Ok(df) => refused_by_engine(QueryError::from_datafusion(*df, limits)),
                Err(other) => {
                    match other.downcast::<datafusion::sql::sqlparser::parser::ParserError>() {
                        Ok(p) => pg_error("42601", crate::error::clip(&p.to_string())),
                        Err(other) => PgWireError::ApiError(other),
                    }
                }
            }
        }
        other => other,
    }
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
    /// The engine's limits, for naming an error.
    limits: Limits,
    /// The connection is busy while this is held.
    busy: Busy,
    /// What the statement's allocations count against (see [`crate::memory`]).
    memory: QueryMemory,
}

/// A statement's rows and place in line, until its stream ends or its bounds stop it.
struct Held {
    rows: Option<Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>>,
    permit: Option<OwnedSemaphorePermit>,
    busy: Option<Busy>,
    memory: Option<QueryMemory>,
    /// When the client last asked for a row.
    asked: std::time::Instant,
    /// Whether it is waiting for the row it asked for (the plan is still making it).
    waiting: bool,
    /// Why the bounds stopped it, to be said once.
    stopped: Option<PgWireError>,
    /// Who waits for the next row.
    waker: Option<std::task::Waker>,
}

/// How long a statement keeps its place in line while its client asks for no row (a portal
/// suspended by its row limit and not fetched, a client that does not read what was sent),
/// at most: then its plan and place are given back and the next fetch says why. A client
/// waiting for a row the plan is still making is asking.
pub const UNREAD_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// The statement's stream of rows, ended by its bounds. A watchdog task holds the bounds:
/// at the deadline, on cancel, when the client goes, or when the client has asked for no
/// row for [`UNREAD_HOLD`] (or half the time limit, when that is shorter), it drops the plan
/// and the place in line at once, even when nobody polls the rows (a portal suspended by
/// its row limit and never fetched again); the next poll says why.
struct BoundedRows {
    held: Arc<Mutex<Held>>,
    watchdog: tokio::task::JoinHandle<()>,
    limits: Limits,
}

impl BoundedRows {
    fn new(
        rows: Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>,
        bounds: Bounds,
    ) -> Self {
        let held = Arc::new(Mutex::new(Held {
            rows: Some(rows),
            permit: Some(bounds.permit),
            busy: Some(bounds.busy),
            memory: Some(bounds.memory),
            asked: std::time::Instant::now(),
            waiting: false,
            stopped: None,
            waker: None,
        }));
        let watched = Arc::clone(&held);
        let stop = bounds.stop;
        let limits = bounds.limits;
        let hold = UNREAD_HOLD.min(limits.timeout / 2);
        let watchdog = tokio::spawn(async move {
            let unread = async {
                loop {
                    // A client waiting for a row the plan is still making is reading.
                    let asked = watched.lock().map_or_else(
                        |_| std::time::Instant::now(),
                        |h| {
                            if h.waiting {
                                std::time::Instant::now()
                            } else {
                                h.asked
                            }
                        },
                    );
                    let until = tokio::time::Instant::from_std(asked + hold);
                    if tokio::time::Instant::now() >= until {
                        return pg_error(
                            "57014",
                            format!(
                                "canceling statement: its client asked for no row for {} s, \
                                 so its place was given back; fetch rows as they come",
                                hold.as_secs()
                            ),
                        );
                    }
                    tokio::time::sleep_until(until).await;
                }
            };
            let e = tokio::select! {
                e = stop => e,
                e = unread => e,
            };
            let (held, waker) = match watched.lock() {
                Ok(mut h) if h.rows.is_some() => {
                    h.stopped = Some(e);
                    (h.release(), h.waker.take())
                }
                _ => return,
            };
            // Dropped outside the lock: dropping a plan aborts its tasks.
            drop(held);
            if let Some(waker) = waker {
                waker.wake();
            }
        });
        Self {
            held,
            watchdog,
            limits,
        }
    }
}

/// What a statement holds while it runs: its plan, its place, its connection's busy mark
/// and its memory count.
type Holding = (
    Option<Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>>,
    Option<OwnedSemaphorePermit>,
    Option<Busy>,
    Option<QueryMemory>,
);

impl Held {
    /// Everything the statement holds, taken out to be dropped outside the lock.
    fn release(&mut self) -> Holding {
        (
            self.rows.take(),
            self.permit.take(),
            self.busy.take(),
            self.memory.take(),
        )
    }
}

/// The rows of the cursor the running statement declared (a session's), waiting for the
/// statement's bounds to be moved onto them once it has run.
#[derive(Default)]
pub(super) struct Unbound(Mutex<Option<Handoff>>);

impl Unbound {
    /// Holds `rows` for the running statement's bounds.
    pub(super) fn put(&self, rows: Handoff) {
        if let Ok(mut held) = self.0.lock() {
            *held = Some(rows);
        }
    }

    /// The rows of the cursor the statement that just ran declared, if it declared one.
    fn take(&self) -> Option<Handoff> {
        self.0.lock().ok()?.take()
    }
}

/// The rows of a declared cursor, waiting for the bounds of the statement that declared it
/// ([`Handoff::bound`]): from then on they are that statement's [`BoundedRows`].
pub(super) struct Handoff(Arc<Mutex<Handing>>);

enum Handing {
    Waiting(Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>),
    Bounded(BoundedRows),
    Moved,
}

impl Handoff {
    /// `rows`, and the handle that bounds them.
    pub(super) fn new(
        rows: Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>,
    ) -> (Self, Self) {
        let shared = Arc::new(Mutex::new(Handing::Waiting(rows)));
        (Self(Arc::clone(&shared)), Self(shared))
    }

    /// Puts the rows within `bounds`.
    fn bound(&self, bounds: Bounds) {
        if let Ok(mut h) = self.0.lock()
            && let Handing::Waiting(rows) = std::mem::replace(&mut *h, Handing::Moved)
        {
            *h = Handing::Bounded(BoundedRows::new(rows, bounds));
        }
    }
}

impl Stream for Handoff {
    type Item = PgWireResult<DataRow>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Ok(mut h) = self.0.lock() else {
            return Poll::Ready(None);
        };
        match &mut *h {
            Handing::Waiting(rows) => rows.poll_next_unpin(cx),
            Handing::Bounded(rows) => rows.poll_next_unpin(cx),
            Handing::Moved => Poll::Ready(None),
        }
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
        held.asked = std::time::Instant::now();
        if let Some(e) = held.stopped.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(service) = held.memory.as_ref().and_then(|m| m.check(cx)) {
            let holding = held.release();
            drop(held);
            drop(holding);
            self.watchdog.abort();
            let e = crate::error::memory_refusal(service, &self.limits);
            return Poll::Ready(Some(Err(refused_by_engine(e))));
        }
        let held = &mut *held;
        let Some(rows) = held.rows.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = match held.memory.as_ref() {
            Some(memory) => memory.run(|| rows.poll_next_unpin(cx)),
            None => rows.poll_next_unpin(cx),
        };
        match polled {
            Poll::Ready(None) => {
                let holding = held.release();
                drop(holding);
                self.watchdog.abort();
                Poll::Ready(None)
            }
            Poll::Pending => {
                held.waker = Some(cx.waker().clone());
                held.waiting = true;
                Poll::Pending
            }
            Poll::Ready(Some(Err(e))) => {
                held.waiting = false;
                Poll::Ready(Some(Err(named(e, &self.limits))))
            }
            ready => {
                held.waiting = false;
                held.asked = std::time::Instant::now();
                ready
            }
        }
    }
}

/// The session service with the engine's bounds around every statement.
pub(super) struct Bounded {
    inner: Arc<DfSessionService>,
    parser: Arc<OneStatement>,
    engine: Engine,
    gone: watch::Receiver<bool>,
    conn: Arc<Conn>,
}

impl Bounded {
    /// `inner` bounded by `engine`'s limits; `gone` turns true when the client has gone.
    pub(super) fn new(
        inner: Arc<DfSessionService>,
        engine: Engine,
        gone: watch::Receiver<bool>,
        conn: Arc<Conn>,
    ) -> Self {
        Self {
            parser: Arc::new(OneStatement {
                inner: inner.query_parser(),
                limits: *engine.limits(),
            }),
            inner,
            engine,
            gone,
            conn,
        }
    }

    /// A place in line, the deadline (the service's time limit, or the client's
    /// `statement_timeout` when shorter) and the connection's cancel requests.
    async fn bounds<C: ClientInfo + ?Sized>(&self, client: &C) -> PgWireResult<Bounds> {
        let busy = self.conn.start();
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
        Ok(Bounds {
            permit,
            stop,
            limits: *self.engine.limits(),
            busy,
            memory: QueryMemory::claim(self.engine.limits().memory_bytes),
        })
    }

    /// A statement's `response`, its rows carrying its `bounds` on; when it declared a
    /// cursor (`client`'s portal), the cursor's rows carry them.
    fn carry<C: ClientInfo + ?Sized>(client: &C, bounds: Bounds, response: Response) -> Response {
        match response {
            Response::Query(q) => {
                let tag = q.command_tag().to_owned();
                let schema = q.row_schema();
                let mut bounded = QueryResponse::new(schema, BoundedRows::new(q.data_rows, bounds));
                bounded.set_command_tag(&tag);
                Response::Query(bounded)
            }
            other => {
                if let Some(cursor) = client
                    .session_extensions()
                    .get::<Unbound>()
                    .and_then(|d| d.take())
                {
                    cursor.bound(bounds);
                }
                other
            }
        }
    }

    /// Runs `work` until `bounds` stop it.
    async fn run<F>(bounds: &mut Bounds, work: F) -> PgWireResult<Response>
    where
        F: Future<Output = PgWireResult<Response>>,
    {
        let work = bounds.memory.enter(work);
        let response = tokio::select! {
            r = work => r.map_err(|e| named(e, &bounds.limits))?,
            e = bounds.stop.as_mut() => return Err(e),
        };
        if let Some(service) = bounds.memory.state() {
            let e = crate::error::memory_refusal(service, &bounds.limits);
            return Err(refused_by_engine(e));
        }
        Ok(response)
    }
}

/// Parses with the PostgreSQL front end's own parser and refuses more than one statement.
fn one_statement(sql: &str) -> PgWireResult<()> {
    check_size(sql).map_err(refused_by_engine)?;
    let statements = PostgresCompatibilityParser::new()
        .parse(sql)
        // syntax_error
        .map_err(|e| pg_error("42601", crate::error::clip(&e.to_string())))?;
    if let Some(statement) = statements.first() {
        crate::guard::check_expansion(statement).map_err(refused_by_engine)?;
    }
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
        let mut bounds = self.bounds(client).await?;
        let inner = Arc::clone(&self.inner);
        let response = Self::run(&mut bounds, async {
            let mut all = SimpleQueryHandler::do_query(inner.as_ref(), client, query).await?;
            all.pop().ok_or(PgWireError::QueryCanceled)
        })
        .await?;
        Ok(vec![Self::carry(client, bounds, response)])
    }
}

/// The extended protocol's parser, refusing more than one statement in a Parse.
pub(super) struct OneStatement {
    inner: Arc<Parser>,
    limits: Limits,
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
        self.inner
            .parse_sql(client, sql, types)
            .await
            .map_err(|e| named(e, &self.limits))
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
        let mut bounds = self.bounds(client).await?;
        let inner = Arc::clone(&self.inner);
        let response = Self::run(&mut bounds, async {
            ExtendedQueryHandler::do_query(inner.as_ref(), client, portal, max_rows).await
        })
        .await?;
        Ok(Self::carry(client, bounds, response))
    }

    /// pgwire's own Execute, but with the rows streamed: its default gathers every row an
    /// Execute asks for (all of them when it asks for no limit, as drivers do) into memory
    /// before sending the first; here each row goes to the connection's buffer as it comes,
    /// and the buffer is written out as it fills.
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        let mut transaction_status = client.transaction_status();
        client.set_state(PgWireConnectionState::QueryInProgress);
        let portal_name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        let max_rows = message.max_rows.max(0) as usize;
        let portal = match client.portal_store().get_portal(portal_name) {
            Some(Entry::Value(portal)) => portal,
            Some(Entry::Empty) => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
                client.set_state(PgWireConnectionState::ReadyForQuery);
                return Ok(());
            }
            None => return Err(PgWireError::PortalNotFound(portal_name.to_owned())),
        };
        let started = matches!(*portal.state().lock().await, PortalExecutionState::Initial);
        let fetch = if started {
            match ExtendedQueryHandler::do_query(self, client, portal.as_ref(), max_rows).await? {
                Response::Query(results) => {
                    portal.start(results).await;
                    true
                }
                Response::EmptyQuery => {
                    client
                        .feed(PgWireBackendMessage::EmptyQueryResponse(
                            EmptyQueryResponse::new(),
                        ))
                        .await?;
                    false
                }
                Response::Execution(tag) => {
                    send_execution_response(client, tag).await?;
                    false
                }
                Response::TransactionStart(tag) => {
                    send_execution_response(client, tag).await?;
                    transaction_status = transaction_status.to_in_transaction_state();
                    false
                }
                Response::TransactionEnd(tag) => {
                    send_execution_response(client, tag).await?;
                    transaction_status = transaction_status.to_idle_state();
                    client.portal_store().rm_portal(DEFAULT_NAME);
                    false
                }
                Response::Error(err) => {
                    client
                        .send(PgWireBackendMessage::ErrorResponse((*err).into()))
                        .await?;
                    transaction_status = transaction_status.to_error_state();
                    false
                }
                // Copies are refused before they run (read-only service).
                _ => {
                    return Err(refused_by_engine(QueryError::Refused(
                        "COPY is not served: this service is read-only".to_owned(),
                    )));
                }
            }
        } else {
            true
        };
        if fetch {
            let state = portal.state();
            let mut state = state.lock().await;
            let mut sent = 0usize;
            let mut suspended = false;
            let mut tag = String::new();
            if let PortalExecutionState::Suspended(response) = &mut *state {
                tag = response.command_tag().to_owned();
                let rows = response.data_rows();
                loop {
                    if max_rows > 0 && sent == max_rows {
                        suspended = true;
                        break;
                    }
                    match rows.next().await {
                        Some(row) => {
                            client.feed(PgWireBackendMessage::DataRow(row?)).await?;
                            sent += 1;
                        }
                        None => break,
                    }
                }
            }
            if suspended {
                client
                    .send(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
                    .await?;
            } else {
                *state = PortalExecutionState::Finished;
                let tag = Tag::new(&tag).with_rows(sent);
                client
                    .send(PgWireBackendMessage::CommandComplete(tag.into()))
                    .await?;
            }
        }
        if !matches!(client.state(), PgWireConnectionState::CopyInProgress(_)) {
            client.set_state(PgWireConnectionState::ReadyForQuery);
            client.set_transaction_status(transaction_status);
        }
        Ok(())
    }
}
