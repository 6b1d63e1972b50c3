//! The query service: the decision tables registered in one DataFusion context, the named
//! reports that answer "which limits were wrong?", and the read-only HTTP and PostgreSQL-wire
//! front ends.

pub mod answers;
pub mod bounded_fns;
pub mod budget;
pub mod connections;
pub mod distinct;
pub mod engine;
pub mod error;
pub mod format;
pub mod guard;
pub mod http;
pub mod indicator;
pub mod limits;
pub mod memory;
pub mod overflow;
pub mod pack;
pub mod parts;
pub mod pg;
pub mod prove;
pub mod pruning;
pub mod range;
pub mod ranks;
pub mod recommend;
pub mod recommendation;
pub mod reports;
pub mod rules;
pub mod shares;
pub mod spill;
pub mod stored;
pub mod tables;
pub mod view;
pub mod weights;
pub mod whatif;
pub mod yielding;

pub use engine::{Collected, Engine, Json, QueryStream, RunOptions};
pub use error::QueryError;
pub use limits::Limits;
pub use tables::PoliciesTable;
pub use view::{AsOf, ReaderView};
