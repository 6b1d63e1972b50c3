//! The counter store a gateway decides with: Redis in production, memory for the embedded
//! default (one process, no services), or two Redis during a move.

use std::sync::Arc;

use verdict_counters_redis::RedisStore;
use verdict_limiter::moving::MovingStore;
use verdict_limiter::{Charge, Checked, CounterStore, LimitKey, Limits, Located, MemoryStore};

/// The store, chosen at start.
#[derive(Debug, Clone)]
pub enum GatewayStore {
    /// Redis (or Redis Cluster): shared by every gateway instance.
    Redis(RedisStore),
    /// In-process memory: this instance only.
    Memory(Arc<MemoryStore>),
    /// Redis, moving to another Redis (dual-write, then cut over).
    Moving(Arc<MovingStore<RedisStore, RedisStore>>),
}

/// A key's place is Redis's (its hash slot); memory and a move have none.
impl CounterStore for GatewayStore {
    type Place = u16;

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        match self {
            Self::Redis(r) => r.check(key, limits, hits).await,
            Self::Memory(m) => m.check(key, limits, hits).await,
            Self::Moving(m) => m.check(key, limits, hits).await,
        }
    }

    async fn check_located(
        &self,
        key: &LimitKey,
        place: Self::Place,
        limits: &Limits,
        hits: u32,
    ) -> Checked {
        match self {
            Self::Redis(r) => r.check_located(key, place, limits, hits).await,
            Self::Memory(m) => m.check(key, limits, hits).await,
            Self::Moving(m) => m.check(key, limits, hits).await,
        }
    }

    /// A cluster's masters, so that the limiter keeps a breaker per master; a move is one
    /// shard (its two stores do not share a layout).
    fn shards(&self) -> usize {
        match self {
            Self::Redis(r) => r.shards(),
            Self::Memory(m) => m.shards(),
            Self::Moving(m) => m.shards(),
        }
    }

    fn locate(&self, key: &LimitKey) -> Located<u16> {
        let shard = match self {
            Self::Redis(r) => return r.locate(key),
            Self::Memory(m) => m.locate(key).shard,
            Self::Moving(m) => m.locate(key).shard,
        };
        Located { shard, place: 0 }
    }

    fn charge(&self, charges: Vec<Charge<u16>>) -> Vec<Charge<u16>> {
        let unplaced = |v: Vec<Charge<u16>>| v.into_iter().map(|c| c.at(())).collect();
        let placed = |v: Vec<Charge<()>>| v.into_iter().map(|c| c.at(0)).collect();
        match self {
            Self::Redis(r) => r.charge(charges),
            Self::Memory(m) => placed(m.charge(unplaced(charges))),
            Self::Moving(m) => placed(m.charge(unplaced(charges))),
        }
    }

    fn can_fail(&self) -> bool {
        match self {
            Self::Redis(r) => r.can_fail(),
            Self::Memory(m) => m.can_fail(),
            Self::Moving(m) => m.can_fail(),
        }
    }
}
