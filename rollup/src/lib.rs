//! The hourly rollup: one closed hour of the raw table grouped by (hour, key, route class,
//! tier, region), keeping only groups with at least one denial or would-deny, written whole
//! and deterministically to `rollup/denied_hourly/date=…/hour=…/`.
//!
//! [`sources`] takes an hour's raw files from the raw Delta table's snapshot (one version,
//! so a compaction or a flush committing meanwhile never doubles or hides a row); [`fold`]
//! groups their rows as
//! [`ROLLUP_SQL`] defines; [`hour`] writes the rollup object, and [`demand`] the histogram of
//! every key's demand beside it.

pub mod demand;
pub mod fold;
pub mod hour;
pub mod sources;

pub use demand::{DEMAND_FILE, DEMAND_SQL, demand_path};
pub use hour::{
    Footer, ROLLUP_FILE, ROLLUP_SQL, Rollup, RollupError, RollupReport, RollupState, conform,
    encode_parquet, read_footer, rollup_path,
};
pub use sources::{
    HourFiles, RawFile, fingerprint, hour_files, hour_files_in, hour_of, hours_in, raw_object,
};
