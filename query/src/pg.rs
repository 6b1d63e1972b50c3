//! The same tables over the PostgreSQL wire protocol, so `psql` and BI tools connect
//! (`datafusion-postgres` on `pgwire`).
//!
//! Bounded as over HTTP (admission, time limit, cancel, size: see `bounds`), and read-only as
//! over HTTP: a hook refuses every statement but queries (and the `SHOW`,
//! transaction and cursor statements clients send on their own), before DataFusion plans it,
//! and `SELECT … INTO` with them. A `SET` of a client's own setting (`client_encoding`,
//! `DateStyle`, …, see [`CLIENT_SETTINGS`]) is answered and ignored, but for
//! `statement_timeout`, which the session keeps and its statements run under; any other `SET`
//! (the engine's `datafusion.*` options) is refused. Each connection has a session of its own, with
//! the engine's memory limit drawing from the shared budget. With tokens configured, the
//! password must be one of them (any user name); with none, the listener must be on
//! loopback.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;

use arrow::datatypes::DataType;
use async_trait::async_trait;
use datafusion::common::config::ConfigOptions;
use datafusion::common::{Column, ParamValues};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, cast};
use datafusion::optimizer::AnalyzerRule;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{Query, Set, SetExpr, Statement};
use datafusion_postgres::DfSessionService;
use datafusion_postgres::auth::AuthManager;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::pgwire::api::auth::{
    DefaultServerParameterProvider, LoginInfo, StartupHandler, finish_authentication,
    protocol_negotiation, save_startup_parameters_to_metadata,
};
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{Response, Tag};
use datafusion_postgres::pgwire::api::{
    ClientInfo, PgWireConnectionState, PgWireServerHandlers, PidSecretKeyGenerator,
    RandomPidSecretKeyGenerator,
};
use datafusion_postgres::pgwire::error::{PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::startup::Authentication;
use datafusion_postgres::pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use datafusion_postgres::pgwire::tokio::process_socket_unix;
use futures::{Sink, SinkExt};

use crate::connections::{Conn, Connections};
use crate::engine::Engine;
use crate::http::{check_exposure, constant_time_eq};

mod bounds;
mod cursors;
mod frames;

use bounds::{Bounded, CancelRequests, Cancels};

/// How long a PostgreSQL connection may run nothing for its client (no statement, no cursor
/// or portal holding rows) before it is closed, as PostgreSQL's `idle_session_timeout`
/// does. Longer than HTTP's keep-alive: a BI tool's pooled connection or an analyst's psql
/// sits between queries for minutes. Idle connections also give their place to new ones
/// when every place is taken ([`crate::connections`]).
pub const IDLE_SESSION: std::time::Duration = std::time::Duration::from_secs(600);

/// Refuses every statement that is not a query or a client's session housekeeping.
#[derive(Debug)]
pub struct ReadOnlyHook;

/// The session settings clients send by themselves on connecting (psql, JDBC, BI tools):
/// acknowledged and ignored, so a connection can change nothing of the engine's.
pub const CLIENT_SETTINGS: [&str; 14] = [
    "application_name",
    "bytea_output",
    "client_encoding",
    "client_min_messages",
    "datestyle",
    "extra_float_digits",
    "intervalstyle",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "search_path",
    "standard_conforming_strings",
    "statement_timeout",
    "timezone",
];

/// True when `query` (or a query inside it) selects `INTO` a new table.
fn selects_into(query: &Query) -> bool {
    // An explicit stack: a long chain of set operations is a deep tree.
    fn push<'a>(stack: &mut Vec<&'a SetExpr>, q: &'a Query) {
        stack.push(q.body.as_ref());
        if let Some(with) = &q.with {
            stack.extend(with.cte_tables.iter().map(|c| c.query.body.as_ref()));
        }
    }
    let mut stack = Vec::new();
    push(&mut stack, query);
    while let Some(e) = stack.pop() {
        match e {
            SetExpr::Select(s) if s.into.is_some() => return true,
            SetExpr::Query(inner) => push(&mut stack, inner),
            SetExpr::SetOperation { left, right, .. } => {
                stack.push(left);
                stack.push(right);
            }
            _ => {}
        }
    }
    false
}

/// What a `SET` is: a client's own setting (acknowledged and ignored), or a refusal.
fn set_refusal(set: &Set) -> Option<String> {
    let names: Vec<String> = match set {
        Set::SingleAssignment { variable, .. } => vec![variable.to_string()],
        Set::MultipleAssignments { assignments } => {
            assignments.iter().map(|a| a.name.to_string()).collect()
        }
        Set::ParenthesizedAssignments { variables, .. } => {
            variables.iter().map(ToString::to_string).collect()
        }
        Set::SetTimeZone { .. } | Set::SetNames { .. } | Set::SetNamesDefault {} => return None,
        _ => return Some("this SET statement is refused".into()),
    };
    names
        .into_iter()
        .find(|n| !CLIENT_SETTINGS.contains(&n.to_ascii_lowercase().as_str()))
        .map(|n| {
            format!(
                "the query service is read-only and its settings are its own: SET {} is refused",
                crate::error::shown(&n)
            )
        })
}

/// True for a `SET` a client sends by itself: answered "SET" and ignored (but
/// `statement_timeout`, which the session keeps: see [`is_statement_timeout`]).
pub fn is_client_setting(statement: &Statement) -> bool {
    matches!(statement, Statement::Set(set) if set_refusal(set).is_none())
        && !is_statement_timeout(statement)
}

/// True for `SET statement_timeout …`: the session keeps it, and a statement then runs
/// under the shorter of it and the service's time limit.
pub fn is_statement_timeout(statement: &Statement) -> bool {
    matches!(
        statement,
        Statement::Set(Set::SingleAssignment { variable, .. })
            if variable.to_string().eq_ignore_ascii_case("statement_timeout")
    )
}

/// Why `statement` is refused, or `None` if it may run.
pub fn refusal(statement: &Statement) -> Option<String> {
    let read_only = |what: &str| {
        format!("the query service is read-only and runs only SELECT queries: {what} is refused")
    };
    match statement {
        Statement::Query(q) if selects_into(q) => return Some(read_only("SELECT … INTO")),
        Statement::Set(set) => return set_refusal(set),
        Statement::Declare { stmts }
            if stmts
                .iter()
                .filter_map(|d| d.for_query.as_deref())
                .any(selects_into) =>
        {
            return Some(read_only("DECLARE … FOR SELECT … INTO"));
        }
        _ => {}
    }
    let allowed = match statement {
        Statement::Query(_) => true,
        Statement::Explain { statement, .. } => matches!(statement.as_ref(), Statement::Query(_)),
        Statement::ShowVariable { .. }
        | Statement::ShowVariables { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. }
        | Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Declare { .. }
        | Statement::Fetch { .. }
        | Statement::Close { .. }
        | Statement::Discard { .. }
        | Statement::Deallocate { .. } => true,
        _ => false,
    };
    (!allowed).then(|| {
        let text = statement.to_string();
        let head: String = text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        format!("the query service is read-only and runs only SELECT queries: {head} … is refused")
    })
}

/// What the hooks answer for `statement`: a client setting is acknowledged with `set()`'s
/// answer; `SET statement_timeout` and the queries the service runs pass on (`None`) to the
/// hooks after this one; anything else is refused as a write.
fn screen<T>(statement: &Statement, set: impl FnOnce() -> T) -> Option<PgWireResult<T>> {
    if is_client_setting(statement) {
        return Some(Ok(set()));
    }
    if is_statement_timeout(statement) {
        return None;
    }
    refusal(statement).map(|m| Err(refused(m)))
}

fn refused(message: String) -> PgWireError {
    // read_only_sql_transaction
    bounds::pg_error("25006", message)
}

#[async_trait]
impl QueryHook for ReadOnlyHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _: &SessionContext,
        _: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        screen(statement, || Response::Execution(Tag::new("SET")))
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _: &SessionContext,
        _: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        screen(statement, cursors::nothing)
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _: &LogicalPlan,
        _: &ParamValues,
        _: &SessionContext,
        _: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        screen(statement, || Response::Execution(Tag::new("SET")))
    }
}

/// Asks for a password and accepts any configured token; with no tokens, asks nothing.
#[derive(Debug)]
struct TokenStartup {
    tokens: Vec<String>,
    parameters: DefaultServerParameterProvider,
    pids: RandomPidSecretKeyGenerator,
    cancels: Arc<Cancels>,
}

#[async_trait]
impl StartupHandler for TokenStartup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if self.tokens.is_empty() {
                    self.accept(client).await?;
                } else {
                    client.set_state(PgWireConnectionState::AuthenticationInProgress);
                    client
                        .send(PgWireBackendMessage::Authentication(
                            Authentication::CleartextPassword,
                        ))
                        .await?;
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(pwd) => {
                let pwd = pwd.into_password()?;
                let ok = self
                    .tokens
                    .iter()
                    .any(|t| constant_time_eq(t.as_bytes(), pwd.password.as_bytes()));
                if !ok {
                    let login = LoginInfo::from_client_info(client);
                    tracing::info!(user = ?login.user(), host = login.host(), "PostgreSQL login refused: wrong token");
                    return Err(PgWireError::InvalidPassword(
                        login.user().map(str::to_owned).unwrap_or_default(),
                    ));
                }
                self.accept(client).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

impl TokenStartup {
    async fn accept<C>(&self, client: &mut C) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (pid, secret) = self.pids.generate(client);
        let slot = self.cancels.register(pid, secret.to_bytes().to_vec());
        client.session_extensions().insert(slot);
        client.set_pid_and_secret_key(pid, secret);
        finish_authentication(client, &self.parameters).await
    }
}

/// The handlers of one listener.
struct Handlers {
    session: Arc<Bounded>,
    startup: Arc<TokenStartup>,
    cancel: Arc<CancelRequests>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::clone(&self.session)
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::clone(&self.session)
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::clone(&self.startup)
    }

    fn cancel_handler(&self) -> Arc<impl datafusion_postgres::pgwire::api::cancel::CancelHandler> {
        Arc::clone(&self.cancel)
    }
}

/// Shows 16-byte key ids to PostgreSQL clients as `bytea`: the wire encoder has no
/// fixed-size binary, so the answer's fixed-size binary columns are cast to binary at the
/// root of every plan (filters below still compare the 16 bytes as stored).
#[derive(Debug)]
pub struct KeysAsBytea;

impl AnalyzerRule for KeysAsBytea {
    fn analyze(
        &self,
        plan: LogicalPlan,
        _: &ConfigOptions,
    ) -> datafusion::error::Result<LogicalPlan> {
        let fixed = plan
            .schema()
            .fields()
            .iter()
            .any(|f| matches!(f.data_type(), DataType::FixedSizeBinary(_)));
        // Only a query's answer; what is not a query never reaches the wire (refused).
        let not_a_query = matches!(
            plan,
            LogicalPlan::Dml(_)
                | LogicalPlan::Ddl(_)
                | LogicalPlan::Statement(_)
                | LogicalPlan::Copy(_)
                | LogicalPlan::Explain(_)
                | LogicalPlan::Analyze(_)
        );
        if !fixed || not_a_query {
            return Ok(plan);
        }
        let columns: Vec<Expr> = plan
            .schema()
            .iter()
            .map(|(qualifier, field)| {
                let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                if matches!(field.data_type(), DataType::FixedSizeBinary(_)) {
                    // Qualified as before: a self join's two key ids stay two columns.
                    cast(column, DataType::Binary).alias_qualified(qualifier.cloned(), field.name())
                } else {
                    column
                }
            })
            .collect();
        LogicalPlanBuilder::from(plan).project(columns)?.build()
    }

    fn name(&self) -> &str {
        "keys_as_bytea"
    }
}

/// A session of its own for one connection: the engine's catalog, a memory pool drawing from
/// the shared budget, `pg_catalog` for the tools that browse it, and the read-only hook first.
fn connection_session(engine: &Engine) -> std::io::Result<Arc<DfSessionService>> {
    let ctx = engine.session();
    ctx.add_analyzer_rule(Arc::new(KeysAsBytea));
    // The provider by value: datafusion-pg-catalog 0.19's impl of its provider trait for
    // `Arc<T>` calls itself, so an `Arc` here made `SELECT * FROM pg_catalog.pg_roles`
    // recurse until the stack overflowed and the process aborted.
    setup_pg_catalog(&ctx, "datafusion", AuthManager::default())
        .map_err(|e| std::io::Error::other(format!("setting up pg_catalog: {e}")))?;
    let hooks: Vec<Arc<dyn QueryHook>> = vec![
        Arc::new(ReadOnlyHook),
        Arc::new(cursors::CursorHook),
        Arc::new(SetShowHook),
        Arc::new(TransactionStatementHook),
    ];
    Ok(Arc::new(DfSessionService::new_with_hooks(
        Arc::new(ctx),
        hooks,
    )))
}

/// Tells a connection there is no place for that the server has too many (SQLSTATE 53300,
/// as PostgreSQL does: an ErrorResponse before anything else) and closes it.
async fn refuse(mut socket: tokio::net::TcpStream, max: usize) {
    use tokio::io::AsyncWriteExt;
    // The client's first message (a startup or SSL request: a length, then the rest) is
    // read first, as PostgreSQL does, so that closing does not reset the connection.
    crate::connections::read_some(&mut socket, |read| {
        read.len() >= 4
            && read.len() >= u32::from_be_bytes([read[0], read[1], read[2], read[3]]) as usize
    })
    .await;
    let message = format!(
        "sorry, too many clients already: the service has {max} connections open, every one \
         busy; retry in a second"
    );
    let frame = frames::error_response("FATAL", "53300", &message);
    let _ = socket.write_all(&frame).await;
    crate::connections::close(socket).await;
}

/// One connection, from its first byte to its end: the guard, then (once the client's
/// startup message has come, within the idle timeout) a session of its own and the
/// protocol. A connection that never says anything costs no session.
async fn session(
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    engine: &Engine,
    startup: Arc<TokenStartup>,
    cancel: Arc<CancelRequests>,
    conn: Arc<Conn>,
) {
    let frames::Guarded {
        socket,
        gone,
        mut started,
    } = match frames::guard(socket) {
        Ok(guarded) => guarded,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "PostgreSQL connection setup failed");
            return;
        }
    };
    let idle = engine.limits().idle;
    match tokio::time::timeout(idle, started.wait_for(|s| *s)).await {
        Ok(Ok(_)) => {}
        // Gone, or refused by the guard, before its startup message.
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::info!(%peer, idle_s = idle.as_secs(), "PostgreSQL connection closed: no startup message within the idle timeout");
            return;
        }
    }
    // One session per connection: what one connection does to its session (a cursor, a
    // transaction) is never seen by another.
    let session = match connection_session(engine) {
        Ok(session) => session,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "PostgreSQL session setup failed");
            return;
        }
    };
    let handlers = Arc::new(Handlers {
        session: Arc::new(Bounded::new(session, engine.clone(), gone, conn)),
        startup,
        cancel,
    });
    if let Err(e) = process_socket_unix(socket, handlers).await {
        tracing::info!(%peer, error = %e, "PostgreSQL connection ended with an error");
    }
}

/// Binds `addr` (refusing a non-loopback address without tokens) and serves the engine's
/// tables over the PostgreSQL protocol until the task is dropped.
pub async fn serve(
    engine: &Engine,
    tokens: Vec<String>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    check_exposure(&tokens, addr)?;
    // Checked once here, so a connection's own setup cannot fail later.
    connection_session(engine)?;
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.default_transaction_read_only = true;
    parameters.is_superuser = false;
    let cancels = Arc::new(Cancels::default());
    let startup = Arc::new(TokenStartup {
        tokens,
        parameters,
        pids: RandomPidSecretKeyGenerator::default(),
        cancels: Arc::clone(&cancels),
    });
    let cancel = Arc::new(CancelRequests(cancels));
    let engine = engine.clone();
    let open = Arc::new(Connections::new(engine.limits()));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the PostgreSQL listener to {addr}: {e}"),
        )
    })?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "PostgreSQL wire protocol listening");
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((socket, peer)) => {
                    let Some(conn) = open.admit() else {
                        tracing::warn!(%peer, open = open.open(), "PostgreSQL connection refused: every connection is busy");
                        tokio::spawn(refuse(socket, engine.limits().connections));
                        continue;
                    };
                    let engine = engine.clone();
                    let startup = Arc::clone(&startup);
                    let cancel = Arc::clone(&cancel);
                    let open = Arc::clone(&open);
                    // Everything past the place is the connection's own task: the loop
                    // only accepts, so a flood of connections cannot hold up the next one.
                    tokio::spawn(async move {
                        tokio::select! {
                            () = session(socket, peer, &engine, startup, cancel, Arc::clone(&conn)) => {}
                            () = conn.evicted() => {
                                tracing::debug!(%peer, "idle PostgreSQL connection closed to make room for a new one");
                            }
                            () = conn.idle_for(IDLE_SESSION) => {
                                tracing::info!(%peer, idle_s = IDLE_SESSION.as_secs(), "idle PostgreSQL connection closed");
                            }
                        }
                        open.closed(&conn);
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accepting a PostgreSQL connection failed"),
            }
        }
    });
    Ok((bound, task))
}
