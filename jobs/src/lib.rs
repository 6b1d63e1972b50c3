//! The scheduled jobs that keep storage bounded and the history true: the hourly rollup
//! after its lateness, late-data re-rollups, compaction, retention, the daily overage table
//! for pricing, and the regional reconcile of shares.
