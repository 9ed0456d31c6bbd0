//! Human forms of durations (`"30s"`), sizes (`"64KiB"`) and rates (`"5/s"`, `"1/30s"`).

use std::fmt;
use std::time::Duration;

/// A refill rate: `tokens` every `period`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub tokens: f64,
    pub period: Duration,
}

impl Rate {
    /// Tokens added per second.
    pub fn per_second(&self) -> f64 {
        self.tokens / self.period.as_secs_f64()
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_millis() {
            1_000 => "s".to_owned(),
            60_000 => "min".to_owned(),
            3_600_000 => "h".to_owned(),
            86_400_000 => "d".to_owned(),
            _ => humantime::format_duration(self.period).to_string(),
        };
        write!(f, "{}/{unit}", self.tokens)
    }
}

/// The largest token count the bucket math holds exactly: every integer up to 2^53 is an f64.
pub const MAX_EXACT_TOKENS: f64 = 9_007_199_254_740_992.0;

/// The longest an empty bucket may take to fill (so that every announced wait is a number a
/// client can use): 10 years.
pub const MAX_REFILL_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// What a rate's error message lists as valid.
const EXPECTED_RATE: &str = "expected \"<tokens>/<period>\" such as \"5/s\", \"100/min\", \"1/30s\" or \"0.5/s\": tokens a decimal number, the period s, min, h or d, or a whole number of ms, s, min, h or d";

/// Why a rate, duration or size as written in the file is not one; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("invalid rate {text:?}: {EXPECTED_RATE}")]
    RateShape { text: String },
    #[error(
        "invalid rate {text:?}: token count {tokens:?} is not a decimal number; {EXPECTED_RATE}"
    )]
    RateTokens { text: String, tokens: String },
    #[error("invalid rate {text:?}: the token count must be greater than zero")]
    RateNotPositive { text: String },
    #[error("invalid rate {text:?}: the token count is at most 2^53 (9007199254740992)")]
    RateTooMany { text: String },
    #[error("invalid rate {text:?}: period {period:?} is not a unit or a whole number of one; {EXPECTED_RATE}")]
    RatePeriod { text: String, period: String },
    #[error("invalid rate {text:?}: the period must be longer than zero")]
    RateZeroPeriod { text: String },
    #[error("invalid rate {text:?}: the period is at least 1ms (write \"1000/s\" rather than \"1/1ms\")")]
    RateShortPeriod { text: String },
    #[error("invalid duration {text:?} ({reason}): expected a duration such as \"50ms\", \"30s\", \"2m\" or \"1h\"")]
    Duration { text: String, reason: String },
    #[error("duration {text:?} is longer than the longest allowed, 10 years")]
    DurationTooLong { text: String },
    #[error(
        "invalid size {text:?}: expected bytes such as 16384, \"64KiB\", \"1MiB\" or \"512KB\""
    )]
    Size { text: String },
}

/// Parses `"<tokens>/<period>"`: tokens a decimal number (`5`, `0.5`), the period a unit
/// (`s`, `min`, `h`, `d`) or a whole number of a unit (`30s`, `2min`, `500ms`, `2h`, `7d`):
/// exactly what the error message lists. Zero and negative rates are refused, and so are token
/// counts over 2^53 and periods under a millisecond (no clock here is that fine).
pub fn parse_rate(text: &str) -> Result<Rate, UnitError> {
    let owned = || text.to_owned();
    let (tokens, period) = text
        .split_once('/')
        .ok_or_else(|| UnitError::RateShape { text: owned() })?;
    let decimal = |text: &str| {
        let mut parts = text.splitn(2, '.');
        let whole = parts.next().unwrap_or_default();
        let fraction = parts.next();
        !whole.is_empty()
            && whole.bytes().all(|byte| byte.is_ascii_digit())
            && fraction.is_none_or(|digits| {
                !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit())
            })
    };
    let tokens_text = tokens.trim();
    let tokens: f64 = tokens_text
        .parse()
        .ok()
        // A negative count is a number, refused below for its sign.
        .filter(|_| decimal(tokens_text.strip_prefix('-').unwrap_or(tokens_text)))
        .ok_or_else(|| UnitError::RateTokens {
            text: owned(),
            tokens: tokens.to_owned(),
        })?;
    if !tokens.is_finite() || tokens <= 0.0 {
        return Err(UnitError::RateNotPositive { text: owned() });
    }
    if tokens > MAX_EXACT_TOKENS {
        return Err(UnitError::RateTooMany { text: owned() });
    }
    let period_text = period.trim();
    let period = rate_period(period_text).ok_or_else(|| UnitError::RatePeriod {
        text: owned(),
        period: period_text.to_owned(),
    })?;
    if period.is_zero() {
        return Err(UnitError::RateZeroPeriod { text: owned() });
    }
    if period < Duration::from_millis(1) {
        return Err(UnitError::RateShortPeriod { text: owned() });
    }
    Ok(Rate { tokens, period })
}

/// A rate's period: `s`, `min`, `h`, `d`, or a whole number of `ms`, `s`, `min`, `h`, `d`.
fn rate_period(text: &str) -> Option<Duration> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (count, unit) = text.split_at(digits);
    let millis: u64 = match unit {
        "ms" if digits > 0 => 1,
        "s" => 1000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    let count: u64 = if count.is_empty() {
        1
    } else {
        count.parse().ok()?
    };
    Some(Duration::from_millis(count.checked_mul(millis)?))
}

/// Parses `"50ms"`, `"30s"`, `"2m"`, `"1h"` (and combinations such as `"1m 30s"`), at most
/// [`MAX_REFILL_SECONDS`]: a duration can end up in a `Retry-After`, which must stay a number a
/// client can use.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let duration = humantime::parse_duration(text.trim()).map_err(|error| UnitError::Duration {
        text: text.to_owned(),
        reason: error.to_string(),
    })?;
    if duration.as_secs_f64() > MAX_REFILL_SECONDS {
        return Err(UnitError::DurationTooLong {
            text: text.to_owned(),
        });
    }
    Ok(duration)
}

/// Parses a byte size such as `"64KiB"`, `"1MiB"`, `"512KB"` or `"4096"`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let invalid = || UnitError::Size {
        text: text.to_owned(),
    };
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        _ => return Err(invalid()),
    };
    let bytes = number * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(invalid());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_their_human_forms() {
        let cases = [
            ("5/s", 5.0),
            ("100/min", 100.0 / 60.0),
            ("1/30s", 1.0 / 30.0),
            ("0.5/s", 0.5),
            ("3600/h", 1.0),
            ("1/120s", 1.0 / 120.0),
            ("10/2min", 10.0 / 120.0),
            ("1000/500ms", 2000.0),
            ("86400/d", 1.0),
            (" 2 / s ", 2.0),
        ];
        for (text, per_second) in cases {
            let rate = parse_rate(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(
                (rate.per_second() - per_second).abs() < 1e-12,
                "{text}: {} != {per_second}",
                rate.per_second()
            );
        }
    }

    #[test]
    fn zero_negative_and_malformed_rates_are_refused() {
        for text in [
            "0/s",
            "-1/s",
            "5",
            "five/s",
            "5/fortnight",
            "5/0s",
            "NaN/s",
            "inf/s",
            "/s",
            "5/sec",
            "5/ms",
            "1e3/s",
            "5/second",
            "5/m",
            "5/1.5s",
            "+5/s",
            ".5/s",
        ] {
            assert!(parse_rate(text).is_err(), "{text} should be refused");
        }
        assert!(parse_rate("0/s")
            .unwrap_err()
            .to_string()
            .contains("greater than zero"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("10").is_err());
        // Every duration can end up in a Retry-After: bounded, as rates are.
        assert_eq!(
            parse_duration("3650d"),
            Ok(Duration::from_secs(3650 * 86_400))
        );
        assert!(parse_duration("3651d").is_err());
        assert!(parse_duration("5000000000y").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("1MiB"), Ok(1_048_576));
        assert_eq!(parse_size("512KB"), Ok(512_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        for text in ["", "KiB", "12 parsecs", "-1KiB", "0.3B"] {
            assert!(parse_size(text).is_err(), "{text} should be refused");
        }
    }
}
