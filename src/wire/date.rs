//! The `Date` field of the gateway's responses.

use std::cell::RefCell;
use std::time::{Duration, UNIX_EPOCH};

/// Calls `write` with the `date` value (RFC 9110 IMF-fixdate) of `unix` (the wall clock
/// since the Unix epoch), formatted at most once a second per thread.
pub(crate) fn with_date<R>(unix: Duration, write: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let second = unix.as_secs();
    DATE.with_borrow_mut(|(cached_second, date)| {
        if *cached_second != second {
            *cached_second = second;
            *date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(second));
        }
        write(date.as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_the_second_it_is_given() {
        let written = |unix| with_date(unix, |date| String::from_utf8(date.to_vec()).unwrap());
        // RFC 9110's example date.
        let example = Duration::from_secs(784_111_777);
        assert_eq!(written(example), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            written(example + Duration::from_millis(999)),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            written(example + Duration::from_secs(1)),
            "Sun, 06 Nov 1994 08:49:38 GMT"
        );
    }
}
