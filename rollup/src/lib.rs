//! The hourly rollup: one closed hour of the raw table grouped by (hour, key, route class,
//! tier, region), keeping only groups with at least one denial or would-deny, written whole
//! and deterministically to `rollup/denied_hourly/date=…/hour=…/`.
//!
//! [`sources`] decides which raw files a reader takes (covered files are left out, so a
//! compaction in progress never doubles a row); [`fold`] groups their rows as
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
pub use sources::{HourFiles, RawFile, effective, fingerprint, hour_files};
