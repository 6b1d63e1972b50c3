//! The named reports: documented queries with parameters, answering "which limits were
//! wrong?". Each renders to plain SQL over the four tables (the same SQL runs in DuckDB for
//! the benchmark), with parameters checked and rendered as literals: names are looked up in
//! the policy in force and become ids, a key must be 32 hex digits, times must parse.
//!
//! Each report is a file of its own (its parameters, documentation and SQL), listed by
//! [`catalog`]; [`params`] holds what a report is and takes, [`levels`] the first levels of
//! the reports over raw decisions (kept in parts by [`crate::parts`]), and `review` what the
//! limit review's two reports share.

mod catalog;
pub mod levels;
pub mod params;
mod review;

mod degraded;
mod demand_history;
mod denial_rate;
mod limit_outliers;
mod overage;
mod policy_changes;
mod shadow_impact;
mod top_denied;
mod wrong_limits;

pub use catalog::{catalog, find};
pub use denial_rate::RAW_DAYS;
pub use params::{Form, Names, ParamKind, ParamSpec, Report};
