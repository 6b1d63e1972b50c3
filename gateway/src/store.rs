//! The counter store a gateway decides with: Redis in production, memory for the embedded
//! default (one process, no services).

use verdict_limiter::{
    CounterStore, LimitKey, Limits, MemoryStore, Outcome, RedisStore, StoreError,
};

/// Either store, chosen at start.
#[derive(Debug, Clone)]
pub enum GatewayStore {
    /// Redis (or Redis Cluster): shared by every gateway instance.
    Redis(RedisStore),
    /// In-process memory: this instance only.
    Memory(std::sync::Arc<MemoryStore>),
}

impl CounterStore for GatewayStore {
    async fn check(&self, key: &LimitKey, limits: &Limits) -> Result<Outcome, StoreError> {
        match self {
            Self::Redis(r) => r.check(key, limits).await,
            Self::Memory(m) => m.check(key, limits).await,
        }
    }
}
