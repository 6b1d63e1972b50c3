//! The lake a maintenance job works on.

use std::sync::Arc;

use object_store::ObjectStore;
use verdict_lake::Clock;

use crate::windows::Windows;

/// The lake a maintenance job works on, as of `now_ms`: its store, the clock its commits
/// are stamped by, and how long each table keeps its partitions.
#[derive(Clone, Copy)]
pub struct Lake<'a> {
    /// The lake's object store.
    pub store: &'a Arc<dyn ObjectStore>,
    /// What the jobs' commits are stamped with.
    pub clock: &'a Clock,
    /// Each table's window.
    pub windows: &'a Windows,
    /// The job's "now" (Unix ms), which the windows are counted back from.
    pub now_ms: i64,
}
