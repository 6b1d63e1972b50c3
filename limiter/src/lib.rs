//! The rate limiter that lives inside the gateway process.
//!
//! - [`algo`]: the decision as a pure function: token bucket + sliding window, both must
//!   pass, a denial consumes nothing.
//! - [`key`]: the limit key and its names in Redis.
//! - [`store`]: the counter-store trait; [`memory`] and [`redis_store`] implement it, the
//!   latter with one Lua script per decision on the store's clock.
//! - [`policy`]: tiers × route classes, overrides, hot keys, kill switches; validated
//!   snapshots swapped atomically.
//! - [`clock`]: time through a trait, so tests move a fake clock.

pub mod algo;
pub mod clock;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod key;
pub mod memory;
pub mod policy;
pub mod redis_store;
pub mod store;

pub use algo::{CounterState, Limits, Outcome, decide};
pub use clock::{Clock, FakeClock, SystemClock};
pub use key::LimitKey;
pub use memory::MemoryStore;
pub use redis_store::{RedisStore, RedisStoreConfig};
pub use store::{CounterStore, StoreError};
