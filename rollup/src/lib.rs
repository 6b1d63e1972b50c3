//! The hourly rollup: one closed hour of the raw table grouped by (hour, key, route class,
//! tier, region), keeping only groups with at least one denial or would-deny, written whole
//! and deterministically to `rollup/denied_hourly/date=…/hour=…/`.
