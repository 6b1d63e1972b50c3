//! Named cursors (`DECLARE … CURSOR FOR`, `FETCH`, `CLOSE`), as drivers use them to read a
//! large answer in pieces: psycopg's named cursors, SQLAlchemy's `stream_results`, pandas'
//! `chunksize`. They declare over the extended protocol with parameters and describe each
//! `FETCH` before they read it, so:
//!
//! - `DECLARE` plans its query with the parameters bound (the hook's parse returns a plan
//!   that holds the query's parameters and describes no rows, as PostgreSQL's `DECLARE`);
//! - `FETCH` describes the cursor's columns (a `FETCH` described as returning nothing and
//!   then sending rows made psycopg crash);
//! - the cursor's rows run within the bounds of a statement: its place in line, its memory
//!   count, its time limit and the hold of a client that fetches nothing (see `bounds`).
//!
//! `FETCH` and `CLOSE` themselves are datafusion-postgres's ([`CursorStatementHook`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::common::{DFSchema, DFSchemaRef, ParamValues};
use datafusion::logical_expr::{CreateView, DdlStatement, EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{DeclareType, Statement};
use datafusion_postgres::arrow_pg::datatypes::df::encode_dataframe;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::pgwire::api::ClientInfo;
use datafusion_postgres::pgwire::api::portal::{Format, Portal};
use datafusion_postgres::pgwire::api::results::{QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::stmt::StoredStatement;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::error::{PgWireError, PgWireResult};

use super::bounds::{Handoff, Unbound, pg_error};

/// The cursors a session declared: each one's columns (for describing a `FETCH`).
#[derive(Default)]
struct Declared {
    columns: Mutex<HashMap<String, DFSchemaRef>>,
}

impl Declared {
    fn columns(&self, name: &str) -> Option<DFSchemaRef> {
        self.columns.lock().ok()?.get(name).cloned()
    }

    fn declare(&self, name: &str, columns: DFSchemaRef) {
        if let Ok(mut all) = self.columns.lock() {
            all.insert(name.to_owned(), columns);
        }
    }
}

fn declared<C: ClientInfo + ?Sized>(client: &C) -> Arc<Declared> {
    client
        .session_extensions()
        .get_or_insert_with(Declared::default)
}

/// A plan that describes no rows.
pub(super) fn nothing() -> LogicalPlan {
    LogicalPlan::EmptyRelation(EmptyRelation {
        produce_one_row: false,
        schema: Arc::new(DFSchema::empty()),
    })
}

/// The cursor's name and query of a `DECLARE … CURSOR FOR query`.
fn declaration(statement: &Statement) -> Option<PgWireResult<(String, Statement)>> {
    let Statement::Declare { stmts } = statement else {
        return None;
    };
    let [declare] = stmts.as_slice() else {
        return Some(Err(pg_error(
            "0A000",
            "one cursor per DECLARE: declare them one at a time".to_owned(),
        )));
    };
    if declare.declare_type != Some(DeclareType::Cursor) {
        return Some(Err(pg_error(
            "42601",
            "DECLARE declares a cursor here: DECLARE name CURSOR FOR query".to_owned(),
        )));
    }
    let (Some(name), Some(query)) = (declare.names.first(), declare.for_query.as_ref()) else {
        return Some(Err(pg_error(
            "42601",
            "DECLARE needs a cursor name and a FOR query".to_owned(),
        )));
    };
    Some(Ok((name.value.clone(), Statement::Query(query.clone()))))
}

/// Plans the query of a cursor; `None` when `statement` declares none.
async fn plan_declared(
    statement: &Statement,
    ctx: &SessionContext,
) -> Option<PgWireResult<(String, LogicalPlan)>> {
    let (name, query) = match declaration(statement)? {
        Ok(d) => d,
        Err(e) => return Some(Err(e)),
    };
    let plan = ctx
        .state()
        .statement_to_plan(DfStatement::Statement(Box::new(query)))
        .await
        .map_err(|e| PgWireError::ApiError(Box::new(e)));
    Some(plan.map(|plan| (name, plan)))
}

/// Starts the cursor `name` over `plan` (its parameters bound) in the session's portals.
async fn start(
    statement: &Statement,
    name: String,
    plan: LogicalPlan,
    ctx: &SessionContext,
    client: &mut dyn HookClient,
) -> PgWireResult<Response> {
    let df = ctx
        .execute_logical_plan(plan)
        .await
        .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    let columns = Arc::new(df.schema().clone());
    let encoded = encode_dataframe(df, &Format::UnifiedText, None).await?;
    let tag = encoded.command_tag().to_owned();
    let schema = encoded.row_schema();
    let (rows, handle) = Handoff::new(encoded.data_rows);
    let mut rows = QueryResponse::new(schema, rows);
    rows.set_command_tag(&tag);
    // Described with the cursor's columns: a driver describes the portal it declared.
    let described = LogicalPlan::EmptyRelation(EmptyRelation {
        produce_one_row: false,
        schema: Arc::clone(&columns),
    });
    let statement = Arc::new(StoredStatement::new(
        name.clone(),
        (statement.to_string(), Some((statement.clone(), described))),
        vec![],
    ));
    let portal = Portal::new_cursor(name.clone(), statement);
    portal.start(rows).await;
    client.portal_store().put_portal(Arc::new(portal));
    declared(&*client).declare(&name, columns);
    // The statement's bounds are moved onto the cursor's rows once it has run.
    client
        .session_extensions()
        .get_or_insert_with(Unbound::default)
        .put(handle);
    Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
}

/// The cursor statements, with `DECLARE`'s parameters and `FETCH`'s columns.
#[derive(Debug)]
pub(super) struct CursorHook;

#[async_trait]
impl QueryHook for CursorHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        match plan_declared(statement, ctx).await {
            Some(Ok((name, plan))) => Some(start(statement, name, plan, ctx, client).await),
            Some(Err(e)) => Some(Err(e)),
            None => {
                CursorStatementHook
                    .handle_simple_query(statement, ctx, client)
                    .await
            }
        }
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        match statement {
            // The query's plan, held by a statement that describes no rows: its parameters
            // are the DECLARE's.
            Statement::Declare { .. } => {
                Some(plan_declared(statement, ctx).await?.map(|(name, plan)| {
                    LogicalPlan::Ddl(DdlStatement::CreateView(CreateView {
                        name: name.into(),
                        input: Arc::new(plan),
                        or_replace: false,
                        definition: None,
                        temporary: true,
                    }))
                }))
            }
            Statement::Fetch { name, .. } => Some(Ok(declared(client)
                .columns(&name.value)
                .map_or_else(nothing, |schema| {
                    LogicalPlan::EmptyRelation(EmptyRelation {
                        produce_one_row: false,
                        schema,
                    })
                }))),
            Statement::Close { .. } => Some(Ok(nothing())),
            _ => None,
        }
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        plan: &LogicalPlan,
        params: &ParamValues,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        if let (Statement::Declare { .. }, LogicalPlan::Ddl(DdlStatement::CreateView(view))) =
            (statement, plan)
        {
            let name = view.name.table().to_owned();
            let bound = match view
                .input
                .as_ref()
                .clone()
                .replace_params_with_values(params)
            {
                Ok(plan) => plan,
                Err(e) => return Some(Err(PgWireError::ApiError(Box::new(e)))),
            };
            return Some(start(statement, name, bound, ctx, client).await);
        }
        match statement {
            Statement::Fetch { .. } | Statement::Close { .. } => {
                CursorStatementHook
                    .handle_extended_query(statement, plan, params, ctx, client)
                    .await
            }
            _ => None,
        }
    }
}
