//! The statement guard: what passes to the planner. Only one `SELECT` (or `EXPLAIN` of
//! one) within the size limits: DDL, DML, `COPY`, `CREATE EXTERNAL TABLE`, `SET` and every
//! other statement are refused, and so are statements whose size alone (tokens, chained
//! operators, set branches, `WITH` queries written out) would make planning itself the
//! attack. Pure: it reads the statement's text and syntax tree, nothing else.

use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::prelude::SQLOptions;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement;

use crate::error::{QueryError, clip, in_words};

/// What DataFusion itself must refuse in a plan.
pub fn read_only_options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// The most a statement may hold. An analyst's query, however long, stays far below; what
/// goes past is generated (a sum of thousands of terms, thousands of `OR`s or `UNION ALL`
/// branches), and every stage after the parser (planning, optimizing, printing, evaluating)
/// walks such trees recursively, so they are refused before any of that.
pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;
/// Tokens a statement may hold (keywords, names, literals, operators).
pub const MAX_STATEMENT_TOKENS: usize = 8_192;
/// Branches of `UNION`, `INTERSECT` and `EXCEPT` a statement may hold.
pub const MAX_SET_BRANCHES: usize = 64;
/// Binary operators one expression may chain at one level of parentheses (`a + b + …`,
/// `x = 1 OR x = 2 OR …`): such a chain is a tree as deep as it is long, and printing or
/// evaluating it recurses once per operator. A long list of values belongs in `IN (…)`.
pub const MAX_CHAINED_OPERATORS: usize = 128;

/// Refuses a statement over [`MAX_STATEMENT_BYTES`], [`MAX_STATEMENT_TOKENS`] or
/// [`MAX_SET_BRANCHES`], naming the limit. Tokenizing is flat (no recursion), so it is safe
/// on any input.
pub fn check_size(sql: &str) -> Result<(), QueryError> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if sql.len() > MAX_STATEMENT_BYTES {
        return Err(QueryError::TooLarge(format!(
            "the statement is {} bytes; the limit is {MAX_STATEMENT_BYTES}",
            sql.len()
        )));
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| QueryError::Invalid(clip(&e.to_string())))?;
    let meaningful = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .count();
    if meaningful > MAX_STATEMENT_TOKENS {
        return Err(QueryError::TooLarge(format!(
            "the statement has {meaningful} tokens; the limit is {MAX_STATEMENT_TOKENS}"
        )));
    }
    let chained = longest_operator_chain(&tokens);
    if chained > MAX_CHAINED_OPERATORS {
        return Err(QueryError::TooLarge(format!(
            "an expression chains {chained} operators; the limit is {MAX_CHAINED_OPERATORS}: \
             put a long list of values in IN (…)"
        )));
    }
    let branches = 1 + tokens
        .iter()
        .filter(|t| {
            matches!(t, Token::Word(w)
                if matches!(w.keyword, Keyword::UNION | Keyword::INTERSECT | Keyword::EXCEPT))
        })
        .count();
    if branches > MAX_SET_BRANCHES {
        return Err(QueryError::TooLarge(format!(
            "the statement has {branches} branches of UNION, INTERSECT or EXCEPT; the limit \
             is {MAX_SET_BRANCHES}"
        )));
    }
    Ok(())
}

/// Table references a statement may expand into once its `WITH` queries are written out
/// where they are used (counted as [`check_expansion`] does).
pub const MAX_EXPANDED_RELATIONS: u64 = 1_000;

/// Refuses a statement that expands into more than [`MAX_EXPANDED_RELATIONS`] table
/// references: planning writes each `WITH` query out where it is used, so 600 bytes of
/// `c_i AS (SELECT * FROM c_(i-1) UNION ALL SELECT * FROM c_(i-1))` make 2^24 scans, which
/// took the process past 8 GiB before a plan existed. A `WITH` query counts the references
/// in its body (a `WITH` query named there counts its own count); the statement counts
/// every reference it holds, those in the bodies included, so a chain counts at most twice
/// what it expands into. Refused before anything is planned, naming the limit.
pub fn check_expansion(statement: &Statement) -> Result<(), QueryError> {
    use datafusion::sql::sqlparser::ast::{Query, Visit, Visitor, visit_relations};
    use std::collections::HashMap;
    use std::ops::ControlFlow;

    fn name_of(name: &datafusion::sql::sqlparser::ast::ObjectName) -> String {
        name.to_string().to_lowercase()
    }
    fn weight_of(weights: &HashMap<String, u64>, name: &str) -> u64 {
        weights.get(name).copied().unwrap_or(1)
    }
    struct Ctes(HashMap<String, u64>);
    impl Visitor for Ctes {
        type Break = ();
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
            for cte in query.with.iter().flat_map(|w| &w.cte_tables) {
                let mut weight = 0u64;
                let _ = visit_relations(&*cte.query, |r| {
                    weight = weight.saturating_add(weight_of(&self.0, &name_of(r)));
                    ControlFlow::<()>::Continue(())
                });
                self.0
                    .insert(cte.alias.name.value.to_lowercase(), weight.max(1));
            }
            ControlFlow::Continue(())
        }
    }
    let mut ctes = Ctes(HashMap::new());
    let _ = statement.visit(&mut ctes);
    if ctes.0.is_empty() {
        return Ok(());
    }
    let mut total = 0u64;
    let _ = visit_relations(statement, |r| {
        total = total.saturating_add(weight_of(&ctes.0, &name_of(r)));
        ControlFlow::<()>::Continue(())
    });
    if total > MAX_EXPANDED_RELATIONS {
        let widest = ctes
            .0
            .iter()
            .max_by_key(|(name, w)| (**w, std::cmp::Reverse((*name).clone())))
            .map(|(name, w)| format!("{} alone stands for {w}", clip(name)))
            .unwrap_or_default();
        return Err(QueryError::TooLarge(format!(
            "the statement expands into {} table references once its WITH queries are \
             written out where they are used ({widest}); the limit is \
             {MAX_EXPANDED_RELATIONS}",
            if total == u64::MAX {
                "more than 2^64".to_owned()
            } else {
                total.to_string()
            }
        )));
    }
    Ok(())
}

/// The most binary operators chained in one expression at one level of parentheses: the
/// count restarts at every comma, parenthesis and clause keyword.
fn longest_operator_chain(tokens: &[datafusion::sql::sqlparser::tokenizer::Token]) -> usize {
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::Token;
    let mut levels = vec![0usize];
    let mut longest = 0;
    for t in tokens {
        match t {
            Token::LParen => levels.push(0),
            Token::RParen if levels.len() > 1 => {
                levels.pop();
            }
            Token::Comma => *levels.last_mut().unwrap_or(&mut 0) = 0,
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::Mod
            | Token::StringConcat
            | Token::Eq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::Ampersand
            | Token::Pipe
            | Token::Caret => {
                if let Some(n) = levels.last_mut() {
                    *n += 1;
                    longest = longest.max(*n);
                }
            }
            Token::Word(w) => match w.keyword {
                Keyword::AND | Keyword::OR => {
                    if let Some(n) = levels.last_mut() {
                        *n += 1;
                        longest = longest.max(*n);
                    }
                }
                Keyword::SELECT
                | Keyword::FROM
                | Keyword::WHERE
                | Keyword::GROUP
                | Keyword::HAVING
                | Keyword::ORDER
                | Keyword::LIMIT
                | Keyword::ON
                | Keyword::CASE
                | Keyword::WHEN
                | Keyword::THEN
                | Keyword::ELSE
                | Keyword::END
                | Keyword::UNION
                | Keyword::INTERSECT
                | Keyword::EXCEPT => *levels.last_mut().unwrap_or(&mut 0) = 0,
                _ => {}
            },
            _ => {}
        }
    }
    longest
}

/// Parses `sql` and passes it only if it is one query (or `EXPLAIN` of one), within the
/// size limits of [`check_size`].
pub fn check_read_only(state: &SessionState, sql: &str) -> Result<DfStatement, QueryError> {
    check_size(sql)?;
    let dialect = state.config().options().sql_parser.dialect;
    let statement = state
        .sql_to_statement(sql, &dialect)
        .map_err(|e| match e.find_root() {
            DataFusionError::NotImplemented(m) if m.contains("single SQL statement") => {
                QueryError::Refused(
                    "one statement per request: send the queries one at a time".into(),
                )
            }
            root => QueryError::Invalid(in_words(root)),
        })?;
    refuse_unless_query(&statement)?;
    // EXPLAIN plans what it explains: its statement is bounded the same.
    let explained = match &statement {
        DfStatement::Explain(e) => e.statement.as_ref(),
        other => other,
    };
    if let DfStatement::Statement(inner) = explained {
        check_expansion(inner)?;
    }
    Ok(statement)
}

fn refuse_unless_query(statement: &DfStatement) -> Result<(), QueryError> {
    let what = match statement {
        DfStatement::Statement(s) => match s.as_ref() {
            Statement::Query(_) => return Ok(()),
            Statement::Explain { statement, .. } => match statement.as_ref() {
                Statement::Query(_) => return Ok(()),
                _ => "EXPLAIN of a statement that is not a query",
            },
            Statement::Insert(_)
            | Statement::Update { .. }
            | Statement::Delete(_)
            | Statement::Merge { .. }
            | Statement::Truncate { .. } => {
                "a statement that changes data (INSERT, UPDATE, DELETE, MERGE, TRUNCATE)"
            }
            Statement::Copy { .. } => "COPY",
            Statement::CreateTable(_)
            | Statement::CreateView { .. }
            | Statement::CreateSchema { .. }
            | Statement::CreateDatabase { .. }
            | Statement::CreateFunction(_)
            | Statement::CreateIndex(_)
            | Statement::Drop { .. }
            | Statement::AlterTable { .. } => "a statement that defines or drops objects (DDL)",
            _ => "a statement that is not a query",
        },
        DfStatement::CreateExternalTable(_) => "CREATE EXTERNAL TABLE (reading files by path)",
        DfStatement::CopyTo(_) => "COPY (writing files)",
        DfStatement::Explain(e) => return refuse_unless_query(&e.statement),
        DfStatement::Reset(_) => "RESET",
    };
    Err(QueryError::Refused(format!(
        "the query service is read-only and runs only SELECT queries: {what} is refused"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_statements_past_the_limits_are_refused_by_name() {
        let sum = format!("SELECT {} FROM decisions", vec!["1"; 5_000].join(" + "));
        let err = check_size(&sum).unwrap_err();
        assert_eq!(err.kind(), "query_too_large");
        assert!(
            err.to_string().contains("tokens; the limit is 8192"),
            "{err}"
        );
        let union = vec!["SELECT 1"; 100].join(" UNION ALL ");
        let err = check_size(&union).unwrap_err();
        assert!(
            err.to_string()
                .contains("100 branches of UNION, INTERSECT or EXCEPT; the limit is 64"),
            "{err}"
        );
        let long = format!("SELECT '{}'", "x".repeat(70_000));
        assert!(
            check_size(&long)
                .unwrap_err()
                .to_string()
                .contains("70009 bytes")
        );
        // An analyst's long query passes: the limits are far above what people write.
        let report = crate::reports::catalog()
            .into_iter()
            .map(|r| {
                r.render(
                    &Default::default(),
                    &Default::default(),
                    chrono::Utc::now(),
                    crate::reports::Form::Served,
                )
                .unwrap()
            })
            .max_by_key(String::len)
            .unwrap();
        check_size(&report).unwrap();
        check_size(&vec!["SELECT 1"; 64].join(" UNION ALL ")).unwrap();
        // A chain of operators is as deep as it is long: 2,000 terms are refused, 120 pass.
        let sum = |n: usize| format!("SELECT {} AS s", vec!["1"; n].join(" + "));
        let err = check_size(&sum(2_000)).unwrap_err().to_string();
        assert!(
            err.contains("chains 1999 operators; the limit is 128"),
            "{err}"
        );
        check_size(&sum(120)).unwrap();
        // The count restarts at commas and parentheses.
        let wide = (0..30)
            .map(|_| format!("({})", vec!["1"; 120].join(" + ")))
            .collect::<Vec<_>>()
            .join(", ");
        check_size(&format!("SELECT {wide}")).unwrap();
    }
}
