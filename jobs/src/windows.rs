//! The time windows every job works in, as configuration.

use std::time::Duration;

/// How long data lives and how long the jobs wait for stragglers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Raw partitions (and quarantine) are deleted once their hour ended this long ago.
    pub raw_keep: Duration,
    /// Rollup and overage partitions are deleted once their hour (day) ended this long ago.
    pub rollup_keep: Duration,
    /// An hour is rolled up (and compacted) once it ended this long ago: events arriving
    /// later are late data, and make the hour due again.
    pub lateness: Duration,
}

/// One day.
pub const DAY: Duration = Duration::from_secs(24 * 3600);

impl Default for Windows {
    fn default() -> Self {
        Self {
            raw_keep: 7 * DAY,
            // Five years, one of them a leap year.
            rollup_keep: (5 * 365 + 1) * DAY,
            lateness: Duration::from_secs(10 * 60),
        }
    }
}

impl Windows {
    /// True for an hour the jobs work on at `now_ms`: over for at least the lateness (so
    /// closed), and still inside the raw window (so its raw files exist and can change).
    pub fn is_workable(&self, hour: &verdict_schemas::HourPartition, now_ms: i64) -> bool {
        let closed = hour.end_ms() + ms(self.lateness) <= now_ms;
        let kept = hour.end_ms() > now_ms - ms(self.raw_keep);
        closed && kept
    }
}

/// The first millisecond of a UTC day, Unix ms.
pub fn day_start_ms(date: chrono::NaiveDate) -> i64 {
    date.and_hms_opt(0, 0, 0)
        .map_or(i64::MIN, |t| t.and_utc().timestamp_millis())
}

/// Milliseconds of a duration, as the partitions count time.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
