//! The policy in PostgreSQL, for the gateways, the operator and the jobs.
//!
//! - [`pg`]: [`PgSource`], the limiter's [`verdict_limiter::PolicySource`] over the tables
//!   of `migrations/` (the schema, [`MIGRATION_0001`] and [`MIGRATION_0002`]), and
//!   [`PgConn`], the connection every part here shares.
//! - [`edits`]: the operator's changes (`verdict policy …`), validated on the document in
//!   force before written.
//! - [`shares`]: the regional shares, as a region's gateways read them
//!   ([`spawn_share_refresher`]).
//! - [`error`]: why the store could not answer.

pub mod edits;
pub mod error;
pub mod pg;
pub mod shares;

pub use edits::{Applied, Edit, LimitChange};
pub use error::PolicyStoreError;
pub use pg::{MIGRATION_0001, MIGRATION_0002, PgConn, PgSource};
pub use shares::{PgShares, spawn_share_refresher};
