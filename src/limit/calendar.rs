//! Calendar periods of quotas: the hour, day, ISO week (from Monday) or month that holds a
//! moment, in UTC or an IANA time zone, so that a quota restarts at midnight where its users
//! are (and a day with a daylight-saving change is 23 or 25 hours long). Pure.

use std::sync::Arc;

use jiff::tz::TimeZone;
use parking_lot::Mutex;

use super::QuotaPeriod;
use jiff::{ToSpan, ZonedDateTime};

/// How long a quota's count lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Hour,
    Day,
    /// An ISO week: Monday 00:00 to the next Monday 00:00.
    Week,
    /// From the 1st, 00:00, to the next month's 1st.
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }
}

/// A quota's period in its zone.
#[derive(Debug, Clone)]
pub struct Calendar {
    pub period: Period,
    /// The IANA name, or `"UTC"`.
    pub zone_name: String,
    pub zone: TimeZone,
    /// The latest period asked for and the next one's end: nearly every request falls in it,
    /// and finding a period in a zone costs about half a microsecond.
    latest: Arc<Mutex<Option<(PeriodSpan, i64)>>>,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.period == other.period && self.zone_name == other.zone_name
    }
}

/// One period, in Unix seconds: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodSpan {
    pub start: i64,
    pub end: i64,
}

impl PeriodSpan {
    /// Seconds from `unix` to the period's end.
    pub fn ends_in(&self, unix: f64) -> f64 {
        (self.end as f64 - unix).max(0.0)
    }
}

/// A zone name that names no IANA time zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IANA time zone, such as \"Europe/Rome\" or \"America/New_York\"")]
pub struct UnknownZone(pub String);

impl Calendar {
    /// A calendar in the named zone (`None`: UTC).
    pub fn new(period: Period, zone: Option<&str>) -> Result<Calendar, UnknownZone> {
        let (zone_name, zone) = match zone {
            None | Some("UTC") => ("UTC".to_owned(), TimeZone::UTC),
            Some(name) => (
                name.to_owned(),
                TimeZone::get(name).map_err(|_| UnknownZone(name.to_owned()))?,
            ),
        };
        Ok(Calendar {
            period,
            zone_name,
            zone,
            latest: Arc::default(),
        })
    }

    /// The period a quota's decision at `unix` counts in, with the next one's end (for a store
    /// whose clock has already passed into it).
    pub fn quota_period(&self, unix: f64) -> QuotaPeriod {
        let cached = *self.latest.lock();
        let (span, next_end) = match cached {
            Some((span, next_end)) if (span.start as f64) <= unix && unix < span.end as f64 => {
                (span, next_end)
            }
            _ => {
                let span = self.period_at(unix);
                let next_end = self.period_at(span.end as f64).end;
                *self.latest.lock() = Some((span, next_end));
                (span, next_end)
            }
        };
        QuotaPeriod {
            end: span.end,
            next_end,
            ends_in: span.ends_in(unix),
        }
    }

    /// The period that holds the moment `unix` (seconds since the epoch).
    pub fn period_at(&self, unix: f64) -> PeriodSpan {
        // Years beyond ±9999 are out of the calendar's range: kept to it, never a panic.
        let second = (unix.floor() as i64).clamp(-300_000_000_000, 250_000_000_000);
        self.span(second).unwrap_or(PeriodSpan {
            start: second - second.rem_euclid(3600),
            end: second - second.rem_euclid(3600) + 3600,
        })
    }

    fn span(&self, second: i64) -> Result<PeriodSpan, jiff::Error> {
        let moment = jiff::Timestamp::from_second(second)?.to_zoned_datetime(self.zone.clone());
        let start: ZonedDateTime = match self.period {
            Period::Hour => moment
                .with()
                .minute(0)
                .second(0)
                .subsec_nanosecond(0)
                .build()?,
            Period::Day => moment.start_of_day()?,
            Period::Week => {
                let back = i64::from(moment.weekday().to_monday_zero_offset());
                moment
                    .start_of_day()?
                    .checked_sub(back.days())?
                    .start_of_day()?
            }
            Period::Month => moment.first_of_month()?.start_of_day()?,
        };
        let end = match self.period {
            // An hour is 3600 s even across a daylight-saving change.
            Period::Hour => start.checked_add(1.hour())?,
            Period::Day => start.checked_add(1.day())?.start_of_day()?,
            Period::Week => start.checked_add(1.week())?.start_of_day()?,
            Period::Month => start.checked_add(1.month())?.start_of_day()?,
        };
        Ok(PeriodSpan {
            start: start.timestamp().as_second(),
            end: end.timestamp().as_second(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(text: &str) -> f64 {
        text.parse::<jiff::Timestamp>().unwrap().as_second() as f64
    }

    fn span(period: Period, zone: Option<&str>, at: &str) -> (i64, i64) {
        let span = Calendar::new(period, zone).unwrap().period_at(unix(at));
        (span.start, span.end)
    }

    fn at(text: &str) -> i64 {
        unix(text) as i64
    }

    #[test]
    fn utc_periods_start_on_the_hour_the_day_monday_and_the_first() {
        let moment = "2026-12-02T10:42:45Z"; // a Wednesday
        assert_eq!(
            span(Period::Hour, None, moment),
            (at("2026-12-02T10:00:00Z"), at("2026-12-02T11:00:00Z"))
        );
        assert_eq!(
            span(Period::Day, None, moment),
            (at("2026-12-02T00:00:00Z"), at("2026-12-03T00:00:00Z"))
        );
        assert_eq!(
            span(Period::Week, None, moment),
            (at("2026-11-30T00:00:00Z"), at("2026-12-07T00:00:00Z"))
        );
        assert_eq!(
            span(Period::Month, None, moment),
            (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            span(Period::Month, None, "2028-02-29T23:59:59Z"),
            (at("2028-02-01T00:00:00Z"), at("2028-03-01T00:00:00Z")),
            "a leap February"
        );
        let start = span(Period::Day, None, "2026-12-03T00:00:00Z");
        assert_eq!(
            start.0,
            at("2026-12-03T00:00:00Z"),
            "the first second opens it"
        );
    }

    #[test]
    fn a_zone_moves_midnight_and_daylight_saving_changes_the_length_of_a_day() {
        // 23:30 UTC on 1 December is 00:30 on 2 December in Rome (UTC+1).
        assert_eq!(
            span(Period::Day, Some("Europe/Rome"), "2026-12-01T23:30:00Z"),
            (at("2026-12-01T23:00:00Z"), at("2026-12-02T23:00:00Z"))
        );
        assert_eq!(
            span(Period::Month, Some("Europe/Rome"), "2026-11-30T23:30:00Z"),
            (at("2026-11-30T23:00:00Z"), at("2026-12-31T23:00:00Z")),
            "December in Rome began an hour before December in UTC"
        );
        let (start, end) = span(Period::Day, Some("Europe/Rome"), "2026-03-29T12:00:00Z");
        assert_eq!(end - start, 23 * 3600, "the spring change");
        let (start, end) = span(
            Period::Day,
            Some("America/New_York"),
            "2026-11-01T12:00:00Z",
        );
        assert_eq!(end - start, 25 * 3600, "the autumn change");
        let (start, end) = span(Period::Hour, Some("Asia/Kolkata"), "2026-12-02T10:42:45Z");
        assert_eq!(
            (start, end - start),
            (at("2026-12-02T10:30:00Z"), 3600),
            "UTC+5:30"
        );
    }

    #[test]
    fn a_quota_period_names_this_period_and_the_next_from_any_moment() {
        let calendar = Calendar::new(Period::Day, Some("Europe/Rome")).unwrap();
        let first = calendar.quota_period(unix("2026-12-01T22:59:00Z"));
        assert_eq!(first.end, at("2026-12-01T23:00:00Z"));
        assert_eq!(first.next_end, at("2026-12-02T23:00:00Z"));
        assert_eq!(first.ends_in, 60.0);
        // Past the period the last call remembered, and back before it: each moment its own.
        let next = calendar.quota_period(unix("2026-12-01T23:00:00Z"));
        assert_eq!(
            (next.end, next.ends_in),
            (at("2026-12-02T23:00:00Z"), 86_400.0)
        );
        assert_eq!(
            calendar.quota_period(unix("2026-12-01T22:59:30Z")).ends_in,
            30.0
        );
    }

    #[test]
    fn unknown_zones_are_refused_and_extreme_moments_do_not_panic() {
        assert!(Calendar::new(Period::Day, Some("Mars/Olympus")).is_err());
        let calendar = Calendar::new(Period::Month, None).unwrap();
        for moment in [f64::MAX, -1e18, 1e18, f64::NAN] {
            let span = calendar.period_at(moment);
            assert!(span.end > span.start || moment.is_nan());
        }
    }
}
