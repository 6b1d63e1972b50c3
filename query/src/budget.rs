//! The service's memory budget: each query has a pool of its own ([`Limits::memory_bytes`]),
//! and every pool draws from one budget the queries share ([`Limits::budget_bytes`]), so
//! twenty queries each within its own limit cannot together take the process past the
//! budget. Admission keeps it so without failing queries half way: at most
//! budget / per-query queries run at once; the next one waits in line up to
//! [`Limits::queue_timeout`], then is refused as busy (503 with `Retry-After`).
//!
//! [`Limits::memory_bytes`]: crate::Limits::memory_bytes
//! [`Limits::budget_bytes`]: crate::Limits::budget_bytes
//! [`Limits::queue_timeout`]: crate::Limits::queue_timeout

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryLimit, MemoryPool, MemoryReservation,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What the budget's refusal says, so the error can be told from a query's own limit.
pub const BUDGET_EXHAUSTED: &str = "the service's shared memory budget is in use";

/// The budget every query's pool draws from, and the line queries wait in.
#[derive(Debug, Clone)]
pub struct Budget {
    shared: Arc<GreedyMemoryPool>,
    slots: Arc<Semaphore>,
    per_query: usize,
    /// What a query's operators may reserve from its pool (`per_query`, or less when they
    /// spill: see [`crate::spill`]).
    operators: usize,
    wait: Duration,
}

impl Budget {
    /// A budget of `budget_bytes`, queries of `per_query` bytes each at most, waiting `wait`
    /// for a place.
    pub fn new(budget_bytes: usize, per_query: usize, wait: Duration) -> Self {
        let per_query = per_query.max(1);
        let budget_bytes = budget_bytes.max(per_query);
        Self {
            shared: Arc::new(GreedyMemoryPool::new(budget_bytes)),
            slots: Arc::new(Semaphore::new((budget_bytes / per_query).max(1))),
            per_query,
            operators: per_query,
            wait,
        }
    }

    /// The same budget, its queries' operators reserving at most `share` of each query's
    /// limit from its pool (the rest of the limit still counts every allocation).
    pub fn with_operator_share(mut self, share: f64) -> Self {
        self.operators = ((self.per_query as f64 * share.clamp(0.0, 1.0)) as usize).max(1);
        self
    }

    /// Queries that may run at once.
    pub fn slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// Bytes the running queries hold now.
    pub fn reserved(&self) -> usize {
        self.shared.reserved()
    }

    /// A place for one query, waiting in line at most the budget's wait; `None` when the
    /// service is still busy then.
    pub async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(self.wait, Arc::clone(&self.slots).acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// The pool of one query.
    pub fn pool(&self) -> QueryPool {
        QueryPool {
            own: GreedyMemoryPool::new(self.operators),
            shared: Arc::clone(&self.shared),
        }
    }
}

/// One query's pool: its own limit, and the shared budget behind it.
#[derive(Debug)]
pub struct QueryPool {
    own: GreedyMemoryPool,
    shared: Arc<GreedyMemoryPool>,
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query({}, shared {})", self.own, self.shared)
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.own.grow(reservation, additional);
        self.shared.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.own.shrink(reservation, shrink);
        self.shared.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.own.try_grow(reservation, additional)?;
        if self.shared.try_grow(reservation, additional).is_err() {
            self.own.shrink(reservation, additional);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{BUDGET_EXHAUSTED} ({} of {} bytes)",
                self.shared.reserved(),
                match self.shared.memory_limit() {
                    MemoryLimit::Finite(n) => n,
                    _ => 0,
                }
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.own.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.own.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::MemoryConsumer;

    use super::*;

    #[test]
    fn each_query_keeps_its_own_limit_and_together_they_keep_the_budget() {
        let budget = Budget::new(300, 200, Duration::from_millis(10));
        assert_eq!(budget.slots(), 1);
        let (a, b): (Arc<dyn MemoryPool>, Arc<dyn MemoryPool>) =
            (Arc::new(budget.pool()), Arc::new(budget.pool()));
        let ra = MemoryConsumer::new("a").register(&a);
        let rb = MemoryConsumer::new("b").register(&b);
        // Over its own limit: refused by it.
        let own = ra.try_grow(201).unwrap_err().to_string();
        assert!(!own.contains(BUDGET_EXHAUSTED), "{own}");
        ra.try_grow(200).unwrap();
        // Within its own limit, past what the budget has left: refused by the budget, and
        // the query's own count is given back.
        let shared = rb.try_grow(150).unwrap_err().to_string();
        assert!(shared.contains(BUDGET_EXHAUSTED), "{shared}");
        assert_eq!(b.reserved(), 0);
        rb.try_grow(100).unwrap();
        assert_eq!(budget.reserved(), 300);
        // Freed memory goes back to both.
        ra.shrink(200);
        assert_eq!((a.reserved(), budget.reserved()), (0, 100));
        rb.try_grow(100).unwrap();
    }

    #[tokio::test]
    async fn past_its_places_a_query_waits_then_is_refused_as_busy() {
        let budget = Budget::new(2 << 20, 1 << 20, Duration::from_millis(50));
        let first = budget.admit().await.expect("a place");
        let _second = budget.admit().await.expect("a place");
        assert!(budget.admit().await.is_none(), "two places only");
        drop(first);
        assert!(budget.admit().await.is_some(), "a freed place is taken");
    }
}
