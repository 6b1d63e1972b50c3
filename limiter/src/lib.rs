//! The rate limiter that lives inside the gateway process.
//!
//! - [`algo`]: the decision as a pure function: token bucket + sliding window, both must
//!   pass, a denial consumes nothing.
//! - [`key`]: the limit key and its names in Redis.
//! - [`counter_store`]: the counter-store trait; [`memory`] implements it here, and
//!   `verdict-counters-redis` in Redis, with one Lua script per call on the store's clock.
//! - [`moving`]: moving the counters to a new store (dual-write, then cut over).
//! - [`policy`]: tiers × route classes, overrides, hot keys, kill switches; validated
//!   snapshots swapped atomically, kept fresh from a source ([`sources`]: a file here,
//!   PostgreSQL in `verdict-policy-store`).
//! - [`limiter`]: `Limiter::check`, where the modes, the breaker ([`breaker`]) and the
//!   local fallback meet (what the fallback admits is charged back to the store once it
//!   answers), and one event per decision goes onto the queue ([`events`]; to Kafka with
//!   `verdict-events-kafka`).
//! - [`regions`]: several regions, each enforcing its share of a global limit; the shares
//!   the reconcile job computes, and the near-limit notes it computes them from.
//! - [`http`]: a decision as 429, `Retry-After` and the rate-limit fields.
//! - [`layer`]: the limiter as a tower layer in front of any HTTP service.
//! - [`metrics`]: the Prometheus metrics.
//! - [`clock`]: time through a trait, so tests move a fake clock.
//! - [`periodic`]: the background tasks' ticker (refreshers, reports).

pub mod algo;
pub mod breaker;
mod charge_back;
pub use verdict_schemas::clock;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod counter_store;
pub mod events;
pub mod http;
pub mod in_process;
pub mod key;
pub mod layer;
pub mod limiter;
pub mod memory;
pub mod metrics;
pub mod moving;
pub mod periodic;
pub mod policy;
pub mod regions;
pub mod sources;

pub use algo::{CounterCheck, CounterState, Limits, charge, decide, decide_hits};
pub use clock::{Clock, FakeClock, ScaledClock, SystemClock};
pub use counter_store::{Charge, Checked, CounterStore, Located, StoreError, StoreProblem};
pub use events::{
    ChannelSink, EventQueue, EventReceiver, EventSink, Handoff, event_queue, spawn_drain,
};
pub use http::{HttpAnswer, PROBLEM_JSON, http_answer};
pub use in_process::{RoundCounts, RoundSettings, round_in_process};
pub use key::LimitKey;
pub use layer::{Identity, RateLimit, RateLimitLayer, Refusal, Resolved};
pub use limiter::{Decision, Limiter, LimiterConfig, Regional, RegionalTimings, Request};
pub use memory::MemoryStore;
pub use metrics::LimiterMetrics;
pub use policy::{LimitLookup, Mode, PolicyDocument, PolicyHandle, PolicySnapshot, RegionRow};
pub use regions::{NearLimit, Share, ShareEntry, ShareHandle, ShareKey, ShareRow, ShareSnapshot};
pub use sources::{CachedSource, FileSource, PolicySource, SourceError, spawn_refresher};
