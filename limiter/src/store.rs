//! Where counters live. A [`CounterStore`] answers one decision per call, atomically: it
//! reads the limit key's state, runs the decision, and writes the new state, all as one
//! step. The Redis store does it in one Lua script on the server; the memory store under
//! one shard lock. The same conformance suite (`tests/conformance.rs`) runs against both.

use std::future::Future;

use crate::algo::{Limits, Outcome};
use crate::key::LimitKey;

/// Why a store could not decide. What the limiter does then (fallback) is decided in one
/// place, `Limiter::check`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within the deadline.
    #[error("counter store timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The store answered with an error, or the connection failed.
    #[error("counter store failed: {0}")]
    Backend(String),
    /// The store answered something that is not a decision.
    #[error("counter store answered {0}")]
    BadReply(String),
    /// So many requests already wait for the store that this one would miss its deadline;
    /// it was not queued.
    #[error("counter store busy: {0} requests already wait on its connection")]
    Busy(usize),
}

impl StoreError {
    /// Every [`StoreError::kind`], in the order of the variants.
    pub const KINDS: [&'static str; 4] = ["timeout", "backend", "bad_reply", "busy"];

    /// The error's kind, as the label `kind` of `verdict_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => Self::KINDS[0],
            StoreError::Backend(_) => Self::KINDS[1],
            StoreError::BadReply(_) => Self::KINDS[2],
            StoreError::Busy(_) => Self::KINDS[3],
        }
    }
}

/// One atomic read-decide-write per call.
pub trait CounterStore: Send + Sync + 'static {
    /// Decides one request of `key` under `limits`.
    fn check(
        &self,
        key: &LimitKey,
        limits: &Limits,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;
}
