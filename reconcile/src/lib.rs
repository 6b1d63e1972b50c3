//! The regional reconcile: every 30 s, each region's share of the global limits of the
//! keys near them, from every region's usage. A job over the regions' Redis and the policy
//! store's PostgreSQL, apart from the lake's jobs (`verdict-jobs`), whose run metrics it
//! shares.
//!
//! - [`reconciler`]: one round and the schedule of rounds ([`Reconciler`]);
//! - [`region_counters`]: a region's near-limit keys and their usage, read from its Redis;
//! - [`share_rounds`]: the shares written to (and read back from) the policy store;
//! - [`round_log`]: the rounds recorded in the lake (`reconcile_rounds`);
//! - [`metrics`]: what it exports.

pub mod metrics;
pub mod reconciler;
pub mod region_counters;
pub mod round_log;
pub mod share_rounds;

pub use metrics::ReconcileMetrics;
pub use reconciler::{ReconcileConfig, ReconcileError, Reconciler, RegionEndpoint, RoundOutcome};
