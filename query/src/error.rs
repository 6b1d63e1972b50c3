//! Why a query did not run or did not finish, for every front end: the HTTP service maps
//! each kind to its status, the PostgreSQL wire to its SQLSTATE, the CLI prints it.

use datafusion::error::DataFusionError;

use crate::limits::Limits;

/// Why a query did not run or did not finish. Messages never carry paths or stack traces.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The statement is not a query (DDL, DML, COPY, …) or is several statements.
    #[error("{0}")]
    Refused(String),
    /// The SQL does not parse or plan, or a parameter is wrong.
    #[error("{0}")]
    Invalid(String),
    /// A named report or table that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The query needed more memory than its pool.
    #[error(
        "the query needs more than its memory limit of {limit_mib} MiB: narrow the time range, \
         filter on date/hour, or aggregate before sorting"
    )]
    MemoryLimit {
        /// The limit.
        limit_mib: usize,
    },
    /// The query needed more memory than its pool, and its operators more of the spill
    /// directory than the service's queries may hold there together (see [`crate::spill`]).
    #[error(
        "the query needs more than its memory limit and the spill directory's {limit_mib} MiB: \
         narrow the time range, filter on date/hour, or aggregate before sorting"
    )]
    SpillLimit {
        /// The spill directory's limit.
        limit_mib: u64,
    },
    /// The query ran past its deadline and was cancelled.
    #[error(
        "the query ran past its time limit of {seconds} s and was cancelled: narrow the time range or filter on date/hour"
    )]
    TimeLimit {
        /// The limit.
        seconds: u64,
    },
    /// The statement is larger than the service takes (bytes, tokens or set-operation
    /// branches); the message names the limit.
    #[error("{0}")]
    TooLarge(String),
    /// A function would make a value larger than the service allows (see
    /// [`crate::bounded_fns`]); the message names the function and the limit.
    #[error("{0}")]
    ValueTooLarge(String),
    /// A JSON answer would carry more rows than allowed.
    #[error(
        "the answer has more than {limit} rows, the limit for JSON: add a LIMIT, aggregate, or \
         ask for format=csv, arrow or parquet, which are streamed"
    )]
    RowLimit {
        /// The limit.
        limit: usize,
    },
    /// A JSON answer would be larger than allowed.
    #[error(
        "the answer is larger than {limit_mib} MiB, the limit for JSON: select fewer or \
         shorter columns, or ask for format=csv, arrow or parquet, which are streamed"
    )]
    AnswerTooLarge {
        /// The limit.
        limit_mib: usize,
    },
    /// Every place for a query is taken, or the shared memory budget is: try again later.
    #[error(
        "the query service is busy (every place for a query, or its shared memory budget, is \
         in use): retry in {retry_after_s} s"
    )]
    Busy {
        /// When to try again, seconds.
        retry_after_s: u64,
    },
    /// Reading the lake or executing failed; the detail is in the service's log.
    #[error("the query failed while reading the data; the service log has the detail")]
    Internal,
}

/// What DataFusion's refusal to spill more says (the limit on the spill directory, an I/O
/// error that would tell the client to change a setting it cannot).
const SPILL_EXHAUSTED: &str = "during the spilling process has exceeded the allowable limit";

impl QueryError {
    /// A short machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Refused(_) => "refused",
            Self::Invalid(_) => "invalid_query",
            Self::TooLarge(_) => "query_too_large",
            Self::ValueTooLarge(_) => "value_too_large",
            Self::NotFound(_) => "not_found",
            Self::MemoryLimit { .. } | Self::SpillLimit { .. } => "memory_limit",
            Self::TimeLimit { .. } => "time_limit",
            Self::RowLimit { .. } => "row_limit",
            Self::AnswerTooLarge { .. } => "answer_too_large",
            Self::Busy { .. } => "busy",
            Self::Internal => "internal",
        }
    }

    /// The SQLSTATE the PostgreSQL front end answers this refusal with.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            // read_only_sql_transaction: DDL, DML and the like
            Self::Refused(_) => "25006",
            Self::Invalid(m) => invalid_sqlstate(m),
            // undefined_table
            Self::NotFound(_) => "42P01",
            // out_of_memory
            Self::MemoryLimit { .. } => "53200",
            // disk_full
            Self::SpillLimit { .. } => "53100",
            // query_canceled
            Self::TimeLimit { .. } => "57014",
            // program_limit_exceeded
            Self::TooLarge(_)
            | Self::ValueTooLarge(_)
            | Self::RowLimit { .. }
            | Self::AnswerTooLarge { .. } => "54000",
            // insufficient_resources
            Self::Busy { .. } => "53000",
            // internal_error
            Self::Internal => "XX000",
        }
    }

    /// The error for a DataFusion error met while planning or running under `limits`.
    pub fn from_datafusion(e: DataFusionError, limits: &Limits) -> Self {
        let root = e.find_root();
        if let Some(problem) = regex_problem(&root.message()) {
            return Self::Invalid(problem);
        }
        if root.message().contains(SPILL_EXHAUSTED) {
            return Self::SpillLimit {
                limit_mib: limits.spill_bytes >> 20,
            };
        }
        match root {
            DataFusionError::ResourcesExhausted(m)
                if m.contains(crate::budget::BUDGET_EXHAUSTED) =>
            {
                Self::Busy { retry_after_s: 5 }
            }
            DataFusionError::ResourcesExhausted(m) => {
                // Which operator asked for more, for the operator of the service.
                tracing::info!(reason = %m, "a query past its memory limit");
                Self::MemoryLimit {
                    limit_mib: limits.memory_bytes >> 20,
                }
            }
            // The parser's own words, not DataFusion's debug form of them.
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Configuration(_) => Self::Invalid(in_words(root)),
            DataFusionError::Execution(m) if m.contains(crate::bounded_fns::REFUSED) => {
                Self::ValueTooLarge(clip(m))
            }
            DataFusionError::Execution(m) if is_user_error(m) => Self::Invalid(clip(m)),
            DataFusionError::ArrowError(a, _) if is_arrow_user_error(a) => {
                Self::Invalid(clip(&a.to_string()))
            }
            DataFusionError::External(x) => match x.downcast_ref::<arrow::error::ArrowError>() {
                Some(a) if is_arrow_user_error(a) => Self::Invalid(clip(&a.to_string())),
                _ => {
                    tracing::warn!(error = %e, "query failed");
                    Self::Internal
                }
            },
            _ => {
                tracing::warn!(error = %e, "query failed");
                Self::Internal
            }
        }
    }
}

/// What a DataFusion error says, in words: the parser's own message rather than
/// DataFusion's debug form of it (`ParserError("…")`), cut by [`clip`].
pub fn in_words(e: &DataFusionError) -> String {
    match e {
        DataFusionError::SQL(p, _) => clip(&p.to_string()),
        other => clip(&other.message()),
    }
}

/// The most of a message (or of the client's input it quotes) an answer carries.
const MESSAGE_CHARS: usize = 300;

/// `m` cut to [`MESSAGE_CHARS`] characters, marked where cut.
pub fn clip(m: &str) -> String {
    match m.char_indices().nth(MESSAGE_CHARS) {
        Some((at, _)) => format!("{}… (cut at {MESSAGE_CHARS} characters)", &m[..at]),
        None => m.to_owned(),
    }
}

/// What is wrong with a regular expression that does not compile, from the message of the
/// function that tried (the regex crate's words, or its debug form): `None` when `m` is not
/// about a regular expression.
fn regex_problem(m: &str) -> Option<String> {
    let about = m.contains("Regular expression did not compile")
        || m.contains("regex parse error")
        || m.contains("Compiled regex exceeds");
    if !about {
        return None;
    }
    if m.contains("CompiledTooBig") || m.contains("Compiled regex exceeds") {
        return Some(
            "the regular expression compiles to more than the regex engine's size limit: \
             use a simpler pattern"
                .to_owned(),
        );
    }
    // The regex crate ends its message with `error: <what>` (escaped in a debug form).
    let what = m
        .rsplit("error: ")
        .next()
        .map(|w| w.split(['"', '\\', '\n']).next().unwrap_or_default().trim())
        .filter(|w| !w.is_empty() && !w.contains("did not compile"))
        .unwrap_or("not a valid pattern (look-around and backreferences are not supported)");
    Some(clip(&format!(
        "the regular expression does not compile: {what}"
    )))
}

/// The SQLSTATE of a statement refused as invalid, by what its message says.
fn invalid_sqlstate(m: &str) -> &'static str {
    let has = |s: &str| m.contains(s);
    if has("table '") && has("not found") || has("No table named") {
        // undefined_table
        "42P01"
    } else if has("No field named") || has("column") && has("not found") {
        // undefined_column
        "42703"
    } else if has("sql parser error") || has("recursion limit") {
        // syntax_error
        "42601"
    } else if has("regular expression") {
        // invalid_regular_expression
        "2201B"
    } else if has("Divide by zero") || has("divide by zero") {
        // division_by_zero
        "22012"
    } else if has("overflow") || has("out of range") {
        // numeric_value_out_of_range
        "22003"
    } else if has("Cannot cast")
        || has("Cast error")
        || has("Parser error")
        || has("parse")
        || has("parsing")
    {
        // invalid_text_representation (a value that does not read as its type)
        "22P02"
    } else if has("function") && (has("not found") || has("Invalid function")) {
        // undefined_function
        "42883"
    } else {
        // syntax_error_or_access_rule_violation
        "42000"
    }
}

fn is_user_error(message: &str) -> bool {
    // Errors of the query's own making (a bad cast, a division by zero, a date that does
    // not parse, slashes and all), not of the store, whose messages name its objects.
    !(message.contains("://")
        || message.contains("Object")
        || message.contains("object")
        || message.contains(".parquet")
        || message.contains("_delta_log"))
}

fn is_arrow_user_error(e: &arrow::error::ArrowError) -> bool {
    use arrow::error::ArrowError::*;
    matches!(
        e,
        CastError(_)
            | ParseError(_)
            | DivideByZero
            | ArithmeticOverflow(_)
            | ComputeError(_)
            | InvalidArgumentError(_)
    )
}

/// The error of a query whose count passed its limit (`service` false) or the service's
/// budget (true: busy, try again).
pub(crate) fn memory_refusal(service: bool, limits: &Limits) -> QueryError {
    if service {
        QueryError::Busy { retry_after_s: 5 }
    } else {
        QueryError::MemoryLimit {
            limit_mib: limits.memory_bytes >> 20,
        }
    }
}

/// `text` as an error message shows it: quoted, and cut after 40 characters, so a message
/// never carries much of what a caller sent.
pub fn shown(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(e: DataFusionError) -> QueryError {
        QueryError::from_datafusion(e, &Limits::default())
    }

    #[test]
    fn a_regular_expression_that_does_not_compile_is_the_users_mistake() {
        // regexp_like's form (the regex crate's error in debug form) and regexp_replace's
        // (the error itself, wrapped).
        let like = DataFusionError::Execution(
            "Regular expression did not compile: Syntax(\"regex parse error:\\n    (\\n    ^\\nerror: unclosed group\")".into(),
        );
        let e = from(like);
        assert_eq!(e.kind(), "invalid_query");
        assert_eq!(
            e.to_string(),
            "the regular expression does not compile: unclosed group"
        );
        assert_eq!(e.sqlstate(), "2201B");
        let replace = DataFusionError::External(
            "regex parse error:\n    (?=a)\n    ^^^\nerror: look-around, including look-ahead and look-behind, is not supported".into(),
        );
        let e = from(replace);
        assert_eq!(
            e.to_string(),
            "the regular expression does not compile: look-around, including look-ahead and look-behind, is not supported"
        );
        let big = DataFusionError::Execution(
            "Regular expression did not compile: CompiledTooBig(10485760)".into(),
        );
        let e = from(big);
        assert!(!e.to_string().contains("CompiledTooBig"), "{e}");
        assert_eq!(e.kind(), "invalid_query");
    }

    #[test]
    fn a_message_with_slashes_is_not_taken_for_the_stores() {
        let e = from(DataFusionError::Execution(
            "Error parsing timestamp from '2026/13/45': error parsing date".into(),
        ));
        assert_eq!(e.kind(), "invalid_query", "{e:?}");
        assert_eq!(e.sqlstate(), "22P02");
        let store = from(DataFusionError::Execution(
            "Generic LocalFileSystem error: s3://lake/raw/x.parquet".into(),
        ));
        assert_eq!(store.kind(), "internal");
        assert_eq!(store.sqlstate(), "XX000");
    }

    #[test]
    fn parser_errors_are_in_words_and_clipped() {
        let e = from(DataFusionError::SQL(
            Box::new(datafusion::sql::sqlparser::parser::ParserError::RecursionLimitExceeded),
            None,
        ));
        assert_eq!(e.to_string(), "sql parser error: recursion limit exceeded");
        assert_eq!(e.sqlstate(), "42601");
        let long = "x".repeat(60_000);
        let e = from(DataFusionError::SQL(
            Box::new(
                datafusion::sql::sqlparser::parser::ParserError::ParserError(format!(
                    "Expected: end of statement, found: {long}"
                )),
            ),
            None,
        ));
        let text = e.to_string();
        assert!(
            !text.contains("ParserError(") && text.chars().count() < 400,
            "{text}"
        );
        assert!(text.ends_with("(cut at 300 characters)"), "{text}");
    }

    #[test]
    fn each_kind_of_mistake_has_its_sqlstate() {
        let plan = |m: &str| from(DataFusionError::Plan(m.into())).sqlstate();
        assert_eq!(plan("table 'datafusion.public.nope' not found"), "42P01");
        assert_eq!(
            from(DataFusionError::SchemaError(
                Box::new(datafusion::common::SchemaError::FieldNotFound {
                    field: Box::new(datafusion::common::Column::from_name("nope")),
                    valid_fields: vec![],
                }),
                Box::new(None),
            ))
            .sqlstate(),
            "42703"
        );
        assert_eq!(
            from(DataFusionError::ArrowError(
                Box::new(arrow::error::ArrowError::DivideByZero),
                None
            ))
            .sqlstate(),
            "22012"
        );
        assert_eq!(
            QueryError::MemoryLimit { limit_mib: 1024 }.sqlstate(),
            "53200"
        );
        assert_eq!(
            QueryError::ValueTooLarge("repeat".into()).sqlstate(),
            "54000"
        );
    }
}
