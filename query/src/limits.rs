//! What one query may use, and all the running queries together.

use std::time::Duration;

/// What one query may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory for the query's operators (hash tables, sorts), bytes.
    pub memory_bytes: usize,
    /// Wall time from the request to the last row.
    pub timeout: Duration,
    /// Rows a JSON answer may carry (CSV, Arrow and Parquet are streamed, unbounded).
    pub json_rows: usize,
    /// Bytes of Arrow data a JSON answer may be built from (its JSON is about as large):
    /// a few rows of huge strings are bounded too, not only many rows.
    pub json_bytes: usize,
    /// Memory all running queries may use together (see [`crate::budget`]): at most
    /// `budget_bytes / memory_bytes` queries run at once.
    pub budget_bytes: usize,
    /// How long a query waits for a place before it is refused as busy.
    pub queue_timeout: Duration,
    /// Bytes of the named reports' JSON answers kept while what they read is unchanged
    /// (see [`crate::answers`]); 0 keeps none.
    pub answer_cache_bytes: usize,
    /// Bytes of the reports' parts kept while what they read is unchanged (see
    /// [`crate::parts`]); 0 keeps none, and every report reads its whole range.
    pub part_cache_bytes: usize,
    /// Raw Parquet bytes a part of a report's first level is computed from at once; a day
    /// holding more is computed in blocks of whole hours folded together (see
    /// [`PART_BLOCK_BYTES`]).
    pub part_block_bytes: u64,
    /// Connections each front end (HTTP, PostgreSQL) keeps open at once; past it an idle
    /// one is closed to make room, or, when none is idle, the new one is refused.
    pub connections: usize,
    /// How long a connection may wait for its next request before it is closed (HTTP: until
    /// its whole head is in; PostgreSQL: until its startup message is in, a session then
    /// waiting up to [`crate::pg::IDLE_SESSION`] between statements).
    pub idle: Duration,
    /// Bytes all queries together may hold in the spill directory (see [`crate::spill`]);
    /// 0: the engine does not spill. Set by `Engine::with_spill`.
    pub spill_bytes: u64,
}

/// Raw Parquet bytes a part of a report's first level is computed from at once by default:
/// about 5 M decisions in the bench's files (12.8 bytes each). A day of its 33.6 M decisions
/// (61 MB) is computed at once within the 1 GiB a query has; a day of its 134 M (245 MB) is
/// not, and is computed in blocks of whole hours folded together.
pub const PART_BLOCK_BYTES: u64 = 64 << 20;

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            timeout: Duration::from_secs(60),
            json_rows: 100_000,
            json_bytes: 64 << 20,
            budget_bytes: 4 << 30,
            queue_timeout: Duration::from_secs(10),
            answer_cache_bytes: 64 << 20,
            part_cache_bytes: 256 << 20,
            part_block_bytes: PART_BLOCK_BYTES,
            connections: 1_000,
            idle: Duration::from_secs(30),
            spill_bytes: 0,
        }
    }
}
