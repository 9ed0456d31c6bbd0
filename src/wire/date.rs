//! The `Date` field of the gateway's responses.

use std::cell::RefCell;
use std::time::UNIX_EPOCH;

/// Calls `write` with the current `date` value (RFC 9110 IMF-fixdate), formatted at most once
/// a second per thread.
pub(crate) fn with_date<R>(write: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = crate::limit::clock::system_time();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    DATE.with_borrow_mut(|(cached_second, date)| {
        if *cached_second != second {
            *cached_second = second;
            *date = httpdate::fmt_http_date(now);
        }
        write(date.as_bytes())
    })
}
