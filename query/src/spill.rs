//! Spilling: a sort or an aggregation that needs more memory than its query may give it
//! writes sorted runs to a local directory the service owns, and merges them back, instead
//! of failing the query.
//!
//! The directory is the operator's ([`Spill::dir`], `verdict query serve --spill-dir`),
//! never one a client names; the service makes a directory of its own inside it at start
//! (`datafusion-…`), removed when the service stops, and all queries together may hold at
//! most [`Spill::max_bytes`] there: past that, the query that needed more ends with
//! `memory_limit`, saying so.
//!
//! Two counts keep the query within its memory limit ([`crate::memory`]): every allocation
//! counts against it, and the operators that can spill (sorts, the final step of a hash
//! aggregation) reserve what they hold from the query's pool. With spilling on, that pool
//! is [`OPERATOR_SHARE`] of the query's limit, so an operator writes to disk while the rest
//! of the query (its batches in flight, the parts of other operators) still has room; with
//! it off, the pool is the whole limit, as before.
//!
//! What was spilled is counted per query from its plan's metrics and shown in the
//! service's metrics ([`SpillCounters`]).

use std::path::PathBuf;

use datafusion::common::Result as DfResult;
use datafusion::execution::disk_manager::{DiskManager, DiskManagerBuilder, DiskManagerMode};
use datafusion::physical_plan::ExecutionPlan;
use prometheus::IntCounter;

/// The part of a query's memory limit its spilling operators may reserve, with spilling on.
pub const OPERATOR_SHARE: f64 = 0.75;

/// Where and how much the service spills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    /// The directory the service spills in (its own directory is made inside it).
    pub dir: PathBuf,
    /// Bytes all queries together may hold there; 0 turns spilling off.
    pub max_bytes: u64,
}

impl Default for Spill {
    /// [`Self::default_dir`], holding at most [`Self::DEFAULT_GIB`] GiB.
    fn default() -> Self {
        Self {
            dir: Self::default_dir(),
            max_bytes: Self::DEFAULT_GIB << 30,
        }
    }
}

impl Spill {
    /// What all queries together may hold in the spill directory by default, GiB.
    pub const DEFAULT_GIB: u64 = 16;

    /// The default directory: `verdict-query-spill` in the system's temporary directory.
    pub fn default_dir() -> PathBuf {
        std::env::temp_dir().join("verdict-query-spill")
    }

    /// The disk manager spilling into this directory (disabled when `max_bytes` is 0).
    pub fn disk_manager(&self) -> DfResult<DiskManager> {
        if self.max_bytes == 0 {
            return DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Disabled)
                .build();
        }
        std::fs::create_dir_all(&self.dir)?;
        DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::Directories(vec![self.dir.clone()]))
            .with_max_temp_directory_size(self.max_bytes)
            .build()
    }
}

/// What one query spilled, from its plan's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Spilled {
    /// Times an operator wrote a run to disk.
    pub spills: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Rows written.
    pub rows: u64,
}

impl Spilled {
    /// What the operators of `plan` (run, or running) spilled.
    pub fn of(plan: &dyn ExecutionPlan) -> Self {
        let own = plan.metrics().map_or_else(Self::default, |m| Self {
            spills: m.spill_count().unwrap_or(0) as u64,
            bytes: m.spilled_bytes().unwrap_or(0) as u64,
            rows: m.spilled_rows().unwrap_or(0) as u64,
        });
        plan.children()
            .into_iter()
            .map(|c| Self::of(c.as_ref()))
            .fold(own, |a, b| Self {
                spills: a.spills + b.spills,
                bytes: a.bytes + b.bytes,
                rows: a.rows + b.rows,
            })
    }
}

/// The service's counts of spilling: `verdict_query_spilled_queries_total`,
/// `verdict_query_spills_total`, `verdict_query_spilled_bytes_total`.
#[derive(Debug, Clone)]
pub struct SpillCounters {
    /// Queries that spilled.
    pub queries: IntCounter,
    /// Runs written.
    pub spills: IntCounter,
    /// Bytes written.
    pub bytes: IntCounter,
}

impl SpillCounters {
    /// Fresh counts (the HTTP service's `/metrics` shows them).
    pub fn new() -> Self {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("a valid name");
        Self {
            queries: counter(
                "verdict_query_spilled_queries_total",
                "Queries whose sorts or aggregations wrote to the spill directory",
            ),
            spills: counter(
                "verdict_query_spills_total",
                "Runs written to the spill directory by queries' operators",
            ),
            bytes: counter(
                "verdict_query_spilled_bytes_total",
                "Bytes written to the spill directory by queries' operators",
            ),
        }
    }

    /// Adds what one query spilled.
    pub fn add(&self, spilled: Spilled) {
        if spilled.spills > 0 {
            self.queries.inc();
            self.spills.inc_by(spilled.spills);
            self.bytes.inc_by(spilled.bytes);
        }
    }
}

impl Default for SpillCounters {
    fn default() -> Self {
        Self::new()
    }
}
