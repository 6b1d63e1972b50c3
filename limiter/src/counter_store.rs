//! Where counters live. A [`CounterStore`] answers one decision per call, atomically: it
//! reads the limit key's state, runs the decision, and writes the new state, all as one
//! step. The Redis store does it in one Lua script on the server; the memory store under
//! one shard lock. The same conformance suite (`conformance.rs`) runs against both.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::algo::{CounterCheck, Limits};
use crate::key::LimitKey;

/// Why a store could not decide, and the limit key it was deciding (when the failure was
/// one decision's, not the connection's at start). What the limiter does then (fallback)
/// is decided in one place, `Limiter::check`. Cloned cheaply: the cause is shared.
#[derive(Debug, Clone)]
pub struct StoreError {
    problem: StoreProblem,
    key: Option<LimitKey>,
}

/// What went wrong in the store.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreProblem {
    /// The store did not answer within the deadline.
    #[error("counter store timed out after {0:?}")]
    Timeout(Duration),
    /// The store answered with an error, or the connection failed: the client's error is
    /// the [`std::error::Error::source`].
    #[error("counter store failed")]
    Backend(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The store answered something that is not a decision.
    #[error("counter store answered {0}")]
    BadReply(String),
    /// So many requests already wait for the store that this one would miss its deadline;
    /// it was not queued.
    #[error("counter store busy: {0} requests already wait on its connection")]
    Busy(usize),
    /// The deadline passed while the request waited in this process, before it was sent:
    /// the process is overloaded, the store may be fine.
    #[error("the deadline of {0:?} passed before the request was sent to the counter store")]
    Overloaded(Duration),
}

impl StoreError {
    /// Every [`StoreError::kind`], in the order of [`StoreProblem`]'s variants.
    pub const KINDS: [&'static str; 5] = ["timeout", "backend", "bad_reply", "busy", "overloaded"];

    /// No answer within `deadline`.
    pub fn timeout(deadline: Duration) -> Self {
        StoreProblem::Timeout(deadline).into()
    }

    /// The store's client failed with `source`.
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StoreProblem::Backend(Arc::from(source.into())).into()
    }

    /// The store answered `what`, which is not a decision.
    pub fn bad_reply(what: impl Into<String>) -> Self {
        StoreProblem::BadReply(what.into()).into()
    }

    /// `waiting` requests already wait on the connection.
    pub fn busy(waiting: usize) -> Self {
        StoreProblem::Busy(waiting).into()
    }

    /// The deadline `deadline` passed before the request was sent.
    pub fn overloaded(deadline: Duration) -> Self {
        StoreProblem::Overloaded(deadline).into()
    }

    /// Whether this process, not the store, kept the request from being decided in time
    /// (it waited past its deadline here, or too many waited already): overload, which
    /// says nothing of the store's health and opens no breaker.
    pub fn is_overload(&self) -> bool {
        matches!(
            self.problem,
            StoreProblem::Busy(_) | StoreProblem::Overloaded(_)
        )
    }

    /// The same error, while deciding `key`.
    #[must_use]
    pub fn deciding(mut self, key: &LimitKey) -> Self {
        self.key = Some(*key);
        self
    }

    /// What went wrong.
    pub fn problem(&self) -> &StoreProblem {
        &self.problem
    }

    /// The limit key the store was deciding, if the failure was one decision's.
    pub fn key(&self) -> Option<&LimitKey> {
        self.key.as_ref()
    }

    /// The error's kind, as the label `kind` of `verdict_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self.problem {
            StoreProblem::Timeout(_) => Self::KINDS[0],
            StoreProblem::Backend(_) => Self::KINDS[1],
            StoreProblem::BadReply(_) => Self::KINDS[2],
            StoreProblem::Busy(_) => Self::KINDS[3],
            StoreProblem::Overloaded(_) => Self::KINDS[4],
        }
    }
}

impl From<StoreProblem> for StoreError {
    fn from(problem: StoreProblem) -> Self {
        Self { problem, key: None }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.problem.fmt(f)?;
        if let Some(k) = &self.key {
            write!(
                f,
                " (deciding key {} on route class {}, tier {}",
                k.key_id, k.route_class.0, k.tier.0
            )?;
            if k.sub_keys > 1 {
                write!(f, ", sub-key {} of {}", k.sub_key, k.sub_keys)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.problem)
    }
}

/// Where a key's counters are, found once per decision ([`CounterStore::locate`]): the
/// limiter picks the shard's breaker by `shard`, and the store reaches the counters by
/// `place`, so the two cannot disagree and neither is computed twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located<P> {
    /// The shard holding the counters, below [`CounterStore::shards`].
    pub shard: usize,
    /// What the store needs beyond the key to reach them (a Redis Cluster's hash slot).
    pub place: P,
}

/// Requests of one key admitted by the local fallback, to be counted by the store once it
/// answers again ([`CounterStore::charge`]), so that its window and bucket see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge<P> {
    /// The limit key.
    pub key: LimitKey,
    /// Where the key's counters are ([`CounterStore::locate`]).
    pub place: P,
    /// The limits the fallback decided under (the store's, not the fallback's part).
    pub limits: Limits,
    /// Requests admitted.
    pub count: u32,
    /// When the first of them was admitted (the limiter's clock, ms).
    pub first_ms: i64,
}

impl<P> Charge<P> {
    /// The same charge at another store's place for its key.
    pub fn at<Q>(self, place: Q) -> Charge<Q> {
        Charge {
            key: self.key,
            place,
            limits: self.limits,
            count: self.count,
            first_ms: self.first_ms,
        }
    }
}

/// A decision of the counters, or why there is none.
pub type Checked = Result<CounterCheck, StoreError>;

/// One atomic read-decide-write per call.
pub trait CounterStore: Send + Sync + 'static {
    /// What [`Self::locate`] finds of a key beyond its shard, handed back to
    /// [`Self::check_located`]: a Redis Cluster's hash slot; `()` for a store with one place.
    type Place: Copy + Default + Send + Sync + 'static;

    /// Decides one request of `key` under `limits`, counting as `hits` requests
    /// ([`crate::algo::decide_hits`]: 1 for a request, 0 checks without counting).
    fn check(
        &self,
        key: &LimitKey,
        limits: &Limits,
        hits: u32,
    ) -> impl Future<Output = Checked> + Send;

    /// The same, for a key already located at `place` ([`Self::locate`]): what the limiter
    /// calls, having located the key for its breaker. A store whose place costs nothing to
    /// find need not override it.
    fn check_located(
        &self,
        key: &LimitKey,
        place: Self::Place,
        limits: &Limits,
        hits: u32,
    ) -> impl Future<Output = Checked> + Send {
        let _ = place;
        self.check(key, limits, hits)
    }

    /// How many shards the counters are spread over, each of which can fail on its own (the
    /// masters of a Redis Cluster). The limiter keeps a breaker per shard, so a shard that
    /// fails sends only its own keys to the local fallback.
    fn shards(&self) -> usize {
        1
    }

    /// Where `key`'s counters are: its shard, below [`Self::shards`], and its place.
    fn locate(&self, key: &LimitKey) -> Located<Self::Place> {
        let _ = key;
        Located {
            shard: 0,
            place: Self::Place::default(),
        }
    }

    /// Counts requests the local fallback admitted ([`crate::algo::charge`]: tokens taken
    /// down to empty, the window's count raised), without waiting: the store takes them to
    /// apply with its next call and keeps them through a failure, up to its own bounds.
    /// Returns the charges it could not take now (the limiter keeps them for later). A store
    /// that cannot fail is never charged; by default a store takes none.
    fn charge(&self, charges: Vec<Charge<Self::Place>>) -> Vec<Charge<Self::Place>> {
        charges
    }

    /// Whether a call can fail, so that the limiter keeps its local fallback ready to take
    /// over (seeded from the store's answers). The memory store's calls cannot.
    fn can_fail(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use verdict_schemas::{KeyId, RouteClassId, TierId};

    use super::*;

    #[test]
    fn an_error_names_the_key_it_was_deciding_and_keeps_its_cause() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let key = LimitKey::new(KeyId([0xab; 16]), RouteClassId(2), TierId(1)).split(4, b"ip");
        let e = StoreError::backend(cause).deciding(&key);
        assert_eq!(e.kind(), "backend");
        assert_eq!(e.key(), Some(&key));
        assert_eq!(
            e.to_string(),
            format!(
                "counter store failed (deciding key {} on route class 2, tier 1, sub-key {} of 4)",
                KeyId([0xab; 16]),
                key.sub_key
            )
        );
        assert_eq!(e.source().unwrap().to_string(), "connection reset");
        // Cloned, the cause is shared, not lost.
        assert_eq!(e.clone().source().unwrap().to_string(), "connection reset");
        assert_eq!(
            StoreError::timeout(Duration::from_millis(5)).to_string(),
            "counter store timed out after 5ms"
        );
    }
}
