//! Where objects live in the store, as pure functions: the hour partition of an event time
//! and the tables' partition prefixes.
//!
//! ```text
//! raw/date=2026-11-30/hour=14/<file>.parquet          (the raw Delta table, raw/_delta_log/)
//! rollup/denied_hourly/date=2026-11-30/hour=14/
//! ```

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Timelike, Utc};

/// Prefix of the raw decisions table.
pub const RAW_PREFIX: &str = "raw";
/// Prefix of the denied-only hourly rollup.
pub const DENIED_HOURLY_PREFIX: &str = "rollup/denied_hourly";
/// Prefix of the hourly histogram of per-key demand.
pub const DEMAND_HOURLY_PREFIX: &str = "rollup/demand_hourly";
/// Prefix of the daily overage table.
pub const OVERAGE_PREFIX: &str = "overage";
/// Prefix of the regional reconcile's record of its rounds.
pub const RECONCILE_ROUNDS_PREFIX: &str = "reconcile_rounds";
/// Prefix of the ingest's quarantine of bad records: JSON lines by day of ingestion, not a
/// table.
pub const QUARANTINE_PREFIX: &str = "quarantine";
/// File extension of every table file.
pub const PARQUET_EXT: &str = "parquet";

const MS_PER_HOUR: i64 = 3_600_000;

/// Why a time, path or file name does not fit the layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The time cannot be a calendar hour (outside chrono's range).
    #[error("event time {0} ms is outside the representable calendar")]
    TimeOutOfRange(i64),
    /// An hour given as text does not parse.
    #[error("hour {input:?} is not of the form YYYY-MM-DDTHH (UTC), e.g. 2026-11-30T14")]
    BadHour {
        /// The text given.
        input: String,
    },
    /// A path does not hold `date=YYYY-MM-DD/hour=HH`.
    #[error("path {path:?} has no date=YYYY-MM-DD/hour=HH partition: {reason}")]
    BadPartitionPath {
        /// The path given.
        path: String,
        /// What was wrong.
        reason: &'static str,
    },
}

/// One UTC hour: the unit of raw partitioning and of the rollup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HourPartition {
    date: NaiveDate,
    hour: u8,
}

impl HourPartition {
    /// The hour holding `date` at `hour`, `None` if `hour > 23`.
    pub fn new(date: NaiveDate, hour: u8) -> Option<Self> {
        (hour < 24).then_some(Self { date, hour })
    }

    /// The hour holding an event time (Unix ms, UTC).
    pub fn from_event_time_ms(ms: i64) -> Result<Self, LayoutError> {
        let t =
            DateTime::<Utc>::from_timestamp_millis(ms).ok_or(LayoutError::TimeOutOfRange(ms))?;
        Ok(Self {
            date: t.date_naive(),
            // Always < 24.
            hour: t.hour() as u8,
        })
    }

    /// The calendar date.
    pub fn date(&self) -> NaiveDate {
        self.date
    }

    /// The hour of the day, 0–23.
    pub fn hour(&self) -> u8 {
        self.hour
    }

    /// The first millisecond of the hour, Unix ms UTC.
    pub fn start_ms(&self) -> i64 {
        let start = NaiveDateTime::from(self.date)
            .with_hour(u32::from(self.hour))
            .unwrap_or_default();
        start.and_utc().timestamp_millis()
    }

    /// The first millisecond after the hour.
    pub fn end_ms(&self) -> i64 {
        self.start_ms() + MS_PER_HOUR
    }

    /// The next hour.
    pub fn next(&self) -> Option<Self> {
        Self::from_event_time_ms(self.end_ms()).ok()
    }

    /// `date=YYYY-MM-DD/hour=HH`, the Hive partition path of this hour.
    pub fn partition_path(&self) -> String {
        format!(
            "date={}/hour={:02}",
            self.date.format("%Y-%m-%d"),
            self.hour
        )
    }

    /// `raw/date=YYYY-MM-DD/hour=HH`, the raw table's folder for this hour.
    pub fn raw_prefix(&self) -> String {
        format!("{RAW_PREFIX}/{}", self.partition_path())
    }

    /// `rollup/denied_hourly/date=YYYY-MM-DD/hour=HH`, the rollup's folder for this hour.
    pub fn denied_hourly_prefix(&self) -> String {
        format!("{DENIED_HOURLY_PREFIX}/{}", self.partition_path())
    }

    /// `rollup/demand_hourly/date=YYYY-MM-DD/hour=HH`, the demand histogram's folder.
    pub fn demand_hourly_prefix(&self) -> String {
        format!("{DEMAND_HOURLY_PREFIX}/{}", self.partition_path())
    }

    /// Finds `date=YYYY-MM-DD/hour=HH` among the segments of an object path.
    pub fn from_path(path: &str) -> Result<Self, LayoutError> {
        let bad = |reason| LayoutError::BadPartitionPath {
            path: path.to_owned(),
            reason,
        };
        let mut segments = path.split('/');
        let date = segments
            .by_ref()
            .find_map(|s| s.strip_prefix("date="))
            .ok_or_else(|| bad("no date= segment"))?;
        let hour = segments
            .next()
            .and_then(|s| s.strip_prefix("hour="))
            .ok_or_else(|| bad("no hour= segment after date="))?;
        let date = NaiveDate::parse_from_str(date, "%Y-%m-%d")
            .map_err(|_| bad("date is not YYYY-MM-DD"))?;
        let hour = parse_hour_value(hour).ok_or_else(|| bad("hour is not 0-23"))?;
        Ok(Self { date, hour })
    }
}

/// `overage/date=YYYY-MM-DD`, the overage table's folder for a day.
pub fn overage_prefix(date: NaiveDate) -> String {
    format!("{OVERAGE_PREFIX}/date={}", date.format("%Y-%m-%d"))
}

/// The day of a `date=YYYY-MM-DD` path segment.
pub fn parse_date_segment(segment: &str) -> Option<NaiveDate> {
    let date = segment.strip_prefix("date=")?;
    NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()
}

/// The hour of an `hour=HH` path segment.
pub fn parse_hour_segment(segment: &str) -> Option<u8> {
    parse_hour_value(segment.strip_prefix("hour=")?)
}

fn parse_hour(s: &str) -> Option<u8> {
    if s.len() != 2 {
        return None;
    }
    parse_hour_value(s)
}

/// An hour as a path spells it: verdict writes two digits (`hour=09`); another engine
/// writing the table (Spark's OPTIMIZE, DELETE) spells the partition value as it is,
/// `hour=9`.
fn parse_hour_value(s: &str) -> Option<u8> {
    if !(1..=2).contains(&s.len()) || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|h| *h < 24)
}

impl fmt::Display for HourPartition {
    /// `YYYY-MM-DDTHH`, as the CLI takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}T{:02}", self.date.format("%Y-%m-%d"), self.hour)
    }
}

impl FromStr for HourPartition {
    type Err = LayoutError;

    /// Parses `YYYY-MM-DDTHH` (UTC).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || LayoutError::BadHour {
            input: s.to_owned(),
        };
        let (date, hour) = s.split_once('T').ok_or_else(bad)?;
        let date = NaiveDate::parse_from_str(date, "%Y-%m-%d").map_err(|_| bad())?;
        let hour = parse_hour(hour).ok_or_else(bad)?;
        Ok(Self { date, hour })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour(s: &str) -> HourPartition {
        s.parse().unwrap()
    }

    #[test]
    fn event_time_maps_to_its_utc_hour_folder() {
        // 2026-11-30T14:59:59.999Z and the next millisecond.
        let h = HourPartition::from_event_time_ms(1_796_050_799_999).unwrap();
        assert_eq!(h.raw_prefix(), "raw/date=2026-11-30/hour=14");
        let next = HourPartition::from_event_time_ms(1_796_050_800_000).unwrap();
        assert_eq!(next.raw_prefix(), "raw/date=2026-11-30/hour=15");
        assert_eq!(h.next(), Some(next));
        assert_eq!(h.end_ms(), next.start_ms());
        assert_eq!(h.start_ms(), 1_796_047_200_000);
    }

    #[test]
    fn times_before_the_epoch_and_at_midnight() {
        let h = HourPartition::from_event_time_ms(-1).unwrap();
        assert_eq!(h.to_string(), "1969-12-31T23");
        let h = HourPartition::from_event_time_ms(1_796_083_200_000).unwrap();
        assert_eq!(
            h.denied_hourly_prefix(),
            "rollup/denied_hourly/date=2026-12-01/hour=00"
        );
    }

    #[test]
    fn absurd_times_are_an_error_not_a_panic() {
        assert_eq!(
            HourPartition::from_event_time_ms(i64::MAX),
            Err(LayoutError::TimeOutOfRange(i64::MAX))
        );
        assert!(HourPartition::from_event_time_ms(i64::MIN).is_err());
    }

    #[test]
    fn hour_text_round_trips_and_rejects_nonsense() {
        assert_eq!(hour("2026-11-30T14").to_string(), "2026-11-30T14");
        for bad in [
            "2026-11-30T24",
            "2026-11-30",
            "2026-11-30T4",
            "2026-13-01T00",
            "x",
            "2026-11-30T+1",
        ] {
            assert!(bad.parse::<HourPartition>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn partition_is_found_in_a_full_object_path() {
        let p = "raw/date=2026-11-30/hour=07/verdict.decisions.v1+00000+00000000000000000000+00000000000000000009.parquet";
        assert_eq!(HourPartition::from_path(p).unwrap(), hour("2026-11-30T07"));
        assert!(matches!(
            HourPartition::from_path("raw/date=2026-11-30/x.parquet"),
            Err(LayoutError::BadPartitionPath { .. })
        ));
        assert!(HourPartition::from_path("raw/date=2026-11-30/hour=99/").is_err());
        // Another engine spells the hour as the partition value is: unpadded.
        assert_eq!(
            HourPartition::from_path("raw/date=2026-11-30/hour=7/part-0.snappy.parquet").unwrap(),
            hour("2026-11-30T07")
        );
        assert!(HourPartition::from_path("raw/date=2026-11-30/hour=007/").is_err());
    }
}
