//! What the demo runs, and the query its summary suggests.

use std::path::PathBuf;

/// The query the summary suggests trying on the query service.
pub const EXAMPLE_SQL: &str = "SELECT tier, verdict, COUNT(*) AS n FROM decisions GROUP BY tier, verdict ORDER BY tier, verdict";

/// What the demo runs: how long, how fast, how many keys, and where it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoConfig {
    /// Folder that plays the object store: the raw table goes to `<out>/raw/`, the rollup to
    /// `<out>/rollup/`, the policy and the key directory the gateway used to
    /// `<out>/policy.toml` and `<out>/keys.csv`.
    pub out: PathBuf,
    /// Real seconds of traffic.
    pub seconds: u64,
    /// How much faster than real time the limiter's clock runs.
    pub speed: u32,
    /// Requests per real second the traffic aims at (the limits are set for it).
    pub rate: u32,
    /// Requests in flight at most.
    pub concurrency: u16,
    /// Distinct API keys.
    pub keys: u32,
    /// Seed of the traffic: the same seed sends the same keys in the same order.
    pub seed: u64,
    /// Partitions of the in-process queue.
    pub partitions: u16,
    /// Replace a raw table already in `out` (otherwise the demo refuses to touch it).
    pub overwrite: bool,
}

impl Default for DemoConfig {
    /// A minute of traffic at 3,000 requests/s into `verdict-data`: an hour on the demo's
    /// clock.
    fn default() -> Self {
        Self {
            out: PathBuf::from("verdict-data"),
            seconds: 60,
            speed: 60,
            rate: 3_000,
            concurrency: 32,
            keys: 2_000,
            seed: 42,
            partitions: 4,
            overwrite: false,
        }
    }
}
