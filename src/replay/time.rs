//! Log timestamps to Unix seconds. Consecutive lines share their day (JSON) or their second
//! (combined), so each parser remembers the last one and reads only what changed; anything
//! out of the usual shape goes to jiff's full parser.

use super::errors::LineError;

/// RFC 3339 timestamps as tollgate's JSON log writes them (`2026-12-02T12:00:00.250000Z`).
#[derive(Default)]
pub(super) struct JsonTime {
    /// The last `YYYY-MM-DDT` seen, and its midnight in Unix seconds.
    day: Option<([u8; 11], i64)>,
}

impl JsonTime {
    pub(super) fn parse(&mut self, text: &str) -> Result<f64, LineError> {
        match self.parse_usual(text.as_bytes()) {
            Some(seconds) => Ok(seconds),
            None => {
                let time = text
                    .parse::<jiff::Timestamp>()
                    .map_err(|error| LineError::Timestamp(error.to_string()))?;
                Ok(time.as_second() as f64 + f64::from(time.subsec_nanosecond()) / 1e9)
            }
        }
    }

    /// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`; `None` for any other shape.
    fn parse_usual(&mut self, text: &[u8]) -> Option<f64> {
        let (day, rest) = text.split_first_chunk::<11>()?;
        let midnight = match self.day {
            Some((known, midnight)) if known == *day => midnight,
            _ => {
                let date = std::str::from_utf8(&day[..10])
                    .ok()?
                    .parse::<jiff::civil::Date>()
                    .ok()?;
                let midnight = date.to_zoned_datetime(jiff::tz::TimeZone::UTC).ok()?;
                let midnight = midnight.timestamp().as_second();
                self.day = Some((*day, midnight));
                midnight
            }
        };
        let (clock, rest) = rest.split_first_chunk::<8>()?;
        let [h1, h2, b':', m1, m2, b':', s1, s2] = *clock else {
            return None;
        };
        let hours = two_digits(h1, h2).filter(|hours| *hours < 24)?;
        let minutes = two_digits(m1, m2).filter(|minutes| *minutes < 60)?;
        let seconds = two_digits(s1, s2).filter(|seconds| *seconds < 61)?;
        let fraction = match rest {
            [b'Z'] => 0.0,
            [b'.', digits @ .., b'Z'] if !digits.is_empty() && digits.len() <= 9 => {
                let mut value = 0u64;
                for digit in digits {
                    value = value * 10 + u64::from(digit.checked_sub(b'0').filter(|d| *d < 10)?);
                }
                value as f64 / 10f64.powi(digits.len() as i32)
            }
            _ => return None,
        };
        Some((midnight + hours * 3600 + minutes * 60 + seconds) as f64 + fraction)
    }
}

fn two_digits(tens: u8, ones: u8) -> Option<i64> {
    let digit = |byte: u8| byte.checked_sub(b'0').filter(|digit| *digit < 10);
    Some(i64::from(digit(tens)?) * 10 + i64::from(digit(ones)?))
}

/// `$time_local` as nginx and Apache write it (`02/Dec/2026:12:00:00 +0000`).
#[derive(Default)]
pub(super) struct CombinedTime {
    last: Option<(String, f64)>,
}

impl CombinedTime {
    pub(super) fn parse(&mut self, text: &str) -> Result<f64, LineError> {
        if let Some((known, seconds)) = &self.last {
            if known == text {
                return Ok(*seconds);
            }
        }
        let time = jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", text)
            .and_then(|parsed| parsed.to_timestamp())
            .map_err(|error| LineError::Time {
                text: text.to_owned(),
                reason: error.to_string(),
            })?;
        let seconds = time.as_second() as f64;
        self.last = Some((text.to_owned(), seconds));
        Ok(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usual_json_timestamps_read_as_jiff_reads_them() {
        let mut time = JsonTime::default();
        for text in [
            "2026-12-02T12:00:00.250000Z",
            "2026-12-02T23:59:59Z",
            "2026-12-03T00:00:00.000001Z",
            "2024-02-29T06:07:08.123456789Z",
            "2026-12-02T12:00:00+01:00",
            "2026-12-02T12:00:00.5-05:30",
        ] {
            let expected = text.parse::<jiff::Timestamp>().unwrap();
            let expected =
                expected.as_second() as f64 + f64::from(expected.subsec_nanosecond()) / 1e9;
            assert_eq!(time.parse(text).unwrap(), expected, "{text}");
        }
    }

    #[test]
    fn malformed_json_timestamps_are_errors() {
        let mut time = JsonTime::default();
        for text in [
            "",
            "yesterday",
            "2026-12-02T25:00:00Z",
            "2026-13-02T12:00:00Z",
            "2026-12-02T12:00:00.Z",
        ] {
            assert!(time.parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn combined_times_carry_their_offset() {
        let mut time = CombinedTime::default();
        assert_eq!(
            time.parse("02/Dec/2026:12:00:00 +0000").unwrap(),
            time.parse("02/Dec/2026:13:00:00 +0100").unwrap()
        );
        assert_eq!(
            time.parse("02/Dec/2026:12:00:00 +0000").unwrap(),
            1_796_212_800.0
        );
        assert!(time.parse("02/Foo/2026:12:00:00 +0000").is_err());
    }
}
