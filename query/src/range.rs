//! Time ranges as the reports take them: `from` and `to` parameters parsed and checked,
//! the SQL condition a range puts on a partitioned table, and a range cut at midnights, the
//! pieces the kept parts are computed over. Pure: no engine, no I/O.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};

use crate::error::{QueryError, shown};

/// `t` on the hour: its minutes, seconds and fraction dropped.
pub fn start_of_hour(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp().div_euclid(3_600) * 3_600, 0).unwrap_or(t)
}

/// A UTC time range `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Start, inclusive.
    pub from: DateTime<Utc>,
    /// End, exclusive.
    pub to: DateTime<Utc>,
}

impl Range {
    /// The range of `from` and `to` parameters (see [`parse_time`]); without `to`, the hour
    /// after `now`'s; without `from`, `default_days` before `to`.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        now: DateTime<Utc>,
        default_days: i64,
    ) -> Result<Self, QueryError> {
        let to = match to {
            Some(t) => parse_time("to", t)?,
            None => start_of_hour(now) + Duration::hours(1),
        };
        let from = match from {
            Some(t) => parse_time("from", t)?,
            None => to - Duration::days(default_days),
        };
        if from >= to {
            return Err(QueryError::Invalid(format!(
                "parameters from/to: the range is empty ({from} is not before {to})"
            )));
        }
        // The lake's times are nanoseconds since 1970, which end in 2262: nothing lies past
        // that, so a range reaching further (`from=1970-01-01&to=9999-12-31`, "all of it")
        // ends there rather than failing where its end is cast to a timestamp.
        let last = NaiveDate::from_ymd_opt(2262, 4, 11)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default();
        let to = to.min(last);
        if from >= to {
            return Err(QueryError::Invalid(
                "parameters from/to: the range lies past the times the lake can hold \
                 (they end on 2262-04-11)"
                    .to_owned(),
            ));
        }
        Ok(Self { from, to })
    }

    pub(crate) fn ts(t: DateTime<Utc>) -> String {
        format!("TIMESTAMP '{}'", t.format("%Y-%m-%d %H:%M:%S%.3f"))
    }

    pub(crate) fn date(d: NaiveDate) -> String {
        format!("DATE '{}'", d.format("%Y-%m-%d"))
    }

    /// The SQL condition on a table with a `date` partition column and a time column.
    ///
    /// When the range falls on whole days (or, with an `hour` partition column, whole
    /// hours), the partition columns say it all: the condition is on them only, so it
    /// prunes folders and costs nothing per row. Otherwise the time column bounds it too.
    pub(crate) fn sql(&self, time_column: &str, hour_partitions: bool) -> String {
        let whole = |t: DateTime<Utc>| {
            t.timestamp_subsec_nanos() == 0
                && t.second() == 0
                && t.minute() == 0
                && (hour_partitions || t.hour() == 0)
        };
        if whole(self.from) && whole(self.to) {
            let bound = |t: DateTime<Utc>, after: bool| {
                let d = Self::date(t.date_naive());
                match (t.hour(), after) {
                    (0, true) => format!("date >= {d}"),
                    (0, false) => format!("date < {d}"),
                    (h, true) => format!("(date > {d} OR (date = {d} AND hour >= {h}))"),
                    (h, false) => format!("(date < {d} OR (date = {d} AND hour < {h}))"),
                }
            };
            return format!("{} AND {}", bound(self.from, true), bound(self.to, false));
        }
        let last = self.to - Duration::milliseconds(1);
        format!(
            "date >= {} AND date <= {} AND {time_column} >= {} AND {time_column} < {}",
            Self::date(self.from.date_naive()),
            Self::date(last.date_naive()),
            Self::ts(self.from),
            Self::ts(self.to),
        )
    }
}

/// Parses a time parameter: a UTC time in the years 1970 to 9999 (so that the default
/// ranges and the partition bounds derived from it can never overflow).
pub fn parse_time(name: &str, text: &str) -> Result<DateTime<Utc>, QueryError> {
    let t = parse_any_time(name, text)?;
    if !(1970..=9999).contains(&t.year()) {
        return Err(QueryError::Invalid(format!(
            "parameter {name}: the year {} is outside 1970 to 9999",
            t.year()
        )));
    }
    Ok(t)
}

fn parse_any_time(name: &str, text: &str) -> Result<DateTime<Utc>, QueryError> {
    let t = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(t) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(t, format) {
            return Ok(Utc.from_utc_datetime(&t));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists")));
    }
    Err(QueryError::Invalid(format!(
        "parameter {name}: {} is not a time; use RFC 3339 (2026-11-30T14:00:00Z), \
         2026-11-30T14:00 (UTC) or a date (2026-11-30)",
        shown(text)
    )))
}

/// `t` as the reports pass it to a level's table function.
pub fn literal(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The range cut at midnights (UTC): whole days, and the pieces of days at its ends.
pub fn pieces(range: Range) -> Vec<Range> {
    let mut out = Vec::new();
    let mut from = range.from;
    while from < range.to {
        let midnight = from.date_naive().and_hms_opt(0, 0, 0).map(|t| t.and_utc());
        let next = midnight.map_or(range.to, |m| m + Duration::days(1));
        let to = next.min(range.to);
        out.push(Range { from, to });
        from = to;
    }
    out
}

/// The range cut at the hours: whole hours, and the pieces of hours at its ends.
pub fn hours(range: &Range) -> Vec<Range> {
    let mut out = Vec::new();
    let mut from = range.from;
    while from < range.to {
        let to = (start_of_hour(from) + Duration::hours(1)).min(range.to);
        out.push(Range { from, to });
        from = to;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> DateTime<Utc> {
        parse_time("t", text).unwrap()
    }

    #[test]
    fn a_range_is_cut_at_each_midnight() {
        let range = Range {
            from: t("2026-11-23T10:30:00Z"),
            to: t("2026-11-26T02:00:00Z"),
        };
        let got: Vec<(String, String)> = pieces(range)
            .into_iter()
            .map(|p| (literal(p.from), literal(p.to)))
            .collect();
        let want = [
            ("2026-11-23T10:30:00.000Z", "2026-11-24T00:00:00.000Z"),
            ("2026-11-24T00:00:00.000Z", "2026-11-25T00:00:00.000Z"),
            ("2026-11-25T00:00:00.000Z", "2026-11-26T00:00:00.000Z"),
            ("2026-11-26T00:00:00.000Z", "2026-11-26T02:00:00.000Z"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        // Within one day: one piece, the range itself.
        let day = Range {
            from: t("2026-11-23T01:00:00Z"),
            to: t("2026-11-23T05:00:00Z"),
        };
        assert_eq!(pieces(day), vec![day]);
        // Whole days: one piece each.
        let week = Range {
            from: t("2026-11-23"),
            to: t("2026-11-30"),
        };
        let got = pieces(week);
        assert_eq!(got.len(), 7);
        assert!(
            got.iter()
                .all(|p| p.to - p.from == Duration::days(1) && p.from.time() == Default::default())
        );
    }

    #[test]
    fn a_literal_is_read_back_as_the_same_time() {
        let at = t("2026-11-23T10:30:00.250Z");
        assert_eq!(parse_time("from", &literal(at)).unwrap(), at);
    }

    #[test]
    fn a_range_past_what_the_lake_holds_is_cut_to_it() {
        let now = Utc::now();
        let all = Range::parse(Some("1970-01-01"), Some("9999-12-31"), now, 1).unwrap();
        assert_eq!(
            (all.from.to_rfc3339(), all.to.to_rfc3339()),
            (
                "1970-01-01T00:00:00+00:00".to_owned(),
                "2262-04-11T00:00:00+00:00".to_owned()
            )
        );
        let e = Range::parse(Some("2300-01-01"), Some("2400-01-01"), now, 1).unwrap_err();
        assert!(e.to_string().contains("past the times"), "{e}");
    }

    #[test]
    fn a_range_is_cut_at_each_hour_the_first_and_last_cut_to_it() {
        let piece = Range {
            from: t("2026-11-29T22:30:00Z"),
            to: t("2026-11-30T00:00:00Z"),
        };
        let cut: Vec<(String, String)> = hours(&piece)
            .iter()
            .map(|h| (literal(h.from), literal(h.to)))
            .collect();
        assert_eq!(
            cut,
            [
                (
                    literal(t("2026-11-29T22:30:00Z")),
                    literal(t("2026-11-29T23:00:00Z"))
                ),
                (
                    literal(t("2026-11-29T23:00:00Z")),
                    literal(t("2026-11-30T00:00:00Z"))
                ),
            ]
        );
        let day = Range {
            from: t("2026-11-29T00:00:00Z"),
            to: t("2026-11-30T00:00:00Z"),
        };
        let cut = hours(&day);
        assert_eq!(cut.len(), 24);
        assert_eq!((cut[0].from, cut[23].to), (day.from, day.to));
        assert!(cut.windows(2).all(|w| w[0].to == w[1].from));
        let inside = Range {
            from: t("2026-11-29T10:15:00Z"),
            to: t("2026-11-29T10:45:00Z"),
        };
        assert_eq!(hours(&inside), [inside]);
    }
}
