//! The limiter's counters in Redis (or Redis Cluster).
//!
//! - [`redis_store`]: [`RedisStore`], the shared [`verdict_limiter::CounterStore`]: both
//!   algorithms in one Lua script (`redis.lua`) per call, on the store's clock, batched per
//!   connection.
//! - [`layout`]: how limit keys are laid out: groups of key ids per hash, a field per
//!   limit key.
//! - `shards`: a cluster's masters as shards, each with connections of its own, swapped
//!   for the promoted replica's after a failover.
//! - [`packed`]: a limit key's stored state, for readers other than the script.
//! - [`near_limit`]: the gateway's near-limit notes, reported to the region's Redis.

pub mod layout;
pub mod near_limit;
pub mod packed;
pub mod redis_store;
mod shards;

pub use layout::{DEFAULT_GROUPS, KEYS_PER_GROUP, Layout, LayoutError};
pub use near_limit::spawn_near_limit_reporter;
pub use redis_store::{DECISION_SCRIPT, DEFAULT_CONNECTIONS, RedisStore, RedisStoreConfig};
