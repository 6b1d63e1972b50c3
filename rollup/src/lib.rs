//! The hourly rollup: one closed hour of the raw table grouped by (hour, key, route class,
//! tier, region), keeping only groups with at least one denial or would-deny, replacing the
//! hour in the `denied_hourly` Delta table (`rollup/denied_hourly/`) in one commit.
//!
//! [`sources`] takes an hour's raw files from the raw Delta table's snapshot (one version,
//! so a compaction or a flush committing meanwhile never doubles or hides a row); [`fold`]
//! groups their rows as [`ROLLUP_SQL`] defines, and computes the histogram of every key's
//! demand ([`demand`], [`DEMAND_SQL`]) in the same reading; [`hour`] writes and commits the
//! rollup file and the histogram beside it, in the `demand_hourly` table, as [`output`]
//! encodes them; [`error`] says why a rollup failed.

pub mod demand;
pub mod error;
pub mod fold;
pub mod hour;
pub mod output;
pub mod sources;

pub use fold::Folded;

pub use demand::DEMAND_SQL;
pub use error::RollupError;
pub use hour::{
    DEMAND_FILE, HourRollup, Progress, ROLLUP_APP_ID, ROLLUP_FILE, ROLLUP_SQL, Rollup,
    RollupReport, RollupState, hour_dir, state_in,
};
pub use output::conform;
pub use sources::{HourFiles, RawFile, hour_files, hour_files_in, hour_of, hours_in, raw_object};
