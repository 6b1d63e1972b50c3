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

impl QueryError {
    /// A short machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Refused(_) => "refused",
            Self::Invalid(_) => "invalid_query",
            Self::TooLarge(_) => "query_too_large",
            Self::ValueTooLarge(_) => "value_too_large",
            Self::NotFound(_) => "not_found",
            Self::MemoryLimit { .. } => "memory_limit",
            Self::TimeLimit { .. } => "time_limit",
            Self::RowLimit { .. } => "row_limit",
            Self::AnswerTooLarge { .. } => "answer_too_large",
            Self::Busy { .. } => "busy",
            Self::Internal => "internal",
        }
    }

    /// The error for a DataFusion error met while planning or running under `limits`.
    pub fn from_datafusion(e: DataFusionError, limits: &Limits) -> Self {
        let root = e.find_root();
        match root {
            DataFusionError::ResourcesExhausted(m)
                if m.contains(crate::budget::BUDGET_EXHAUSTED) =>
            {
                Self::Busy { retry_after_s: 5 }
            }
            DataFusionError::ResourcesExhausted(_) => Self::MemoryLimit {
                limit_mib: limits.memory_bytes >> 20,
            },
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Configuration(_) => Self::Invalid(root.message().to_string()),
            DataFusionError::Execution(m) if m.contains(crate::bounded_fns::REFUSED) => {
                Self::ValueTooLarge(m.clone())
            }
            DataFusionError::Execution(m) if is_user_error(m) => Self::Invalid(m.clone()),
            DataFusionError::ArrowError(a, _) if is_arrow_user_error(a) => {
                Self::Invalid(a.to_string())
            }
            _ => {
                tracing::warn!(error = %e, "query failed");
                Self::Internal
            }
        }
    }
}

fn is_user_error(message: &str) -> bool {
    // Errors of the query's own making (a bad cast, a division by zero), not of the store.
    !(message.contains('/') || message.contains("Object") || message.contains("object"))
}

fn is_arrow_user_error(e: &arrow::error::ArrowError) -> bool {
    use arrow::error::ArrowError::*;
    matches!(
        e,
        CastError(_)
            | DivideByZero
            | ArithmeticOverflow(_)
            | ComputeError(_)
            | InvalidArgumentError(_)
    )
}
