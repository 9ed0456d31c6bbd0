//! Every read of the time (clippy.toml forbids them elsewhere). Decisions read a [`Clock`]:
//! monotonic in production, advanced by hand in tests. What only measures or bounds I/O —
//! latencies in metrics and logs, connection guards, deadlines of calls — reads [`instant`],
//! [`elapsed`], [`deadline_in`] or [`system_time`], and decides no limit.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Now, for a latency or a guard.
pub fn instant() -> Instant {
    Instant::now()
}

/// The time since `since`, for a latency or a guard.
pub fn elapsed(since: Instant) -> Duration {
    since.elapsed()
}

/// The moment `after` from now, as a deadline for tokio's timers.
pub fn deadline_in(after: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + after
}

/// The wall clock, for the `Date` field.
pub fn system_time() -> SystemTime {
    SystemTime::now()
}

/// Whole seconds since the Unix epoch, for token expiry (`exp`, `nbf`).
pub fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Nanoseconds since the clock's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn saturating_elapsed_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    pub fn after(self, seconds: f64) -> Timestamp {
        let nanos = (seconds.max(0.0) * 1e9).ceil();
        Timestamp(self.0.saturating_add(if nanos >= u64::MAX as f64 {
            u64::MAX
        } else {
            nanos as u64
        }))
    }
}

/// Where decisions read the time.
#[derive(Debug, Clone)]
pub enum Clock {
    Monotonic(Instant),
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn monotonic() -> Clock {
        Clock::Monotonic(Instant::now())
    }

    /// A clock that only moves when [`Clock::advance`] is called.
    pub fn manual() -> Clock {
        Clock::Manual(Arc::new(AtomicU64::new(0)))
    }

    /// A manual clock whose calendar time starts at `unix` seconds (a manual clock's reading
    /// is its Unix time in nanoseconds).
    pub fn manual_at(unix: u64) -> Clock {
        Clock::Manual(Arc::new(AtomicU64::new(unix.saturating_mul(1_000_000_000))))
    }

    /// Seconds since the Unix epoch, for calendar quotas: the wall clock, or a manual clock's
    /// reading.
    pub fn unix(&self) -> f64 {
        match self {
            Clock::Monotonic(_) => SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64()),
            Clock::Manual(nanos) => nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    pub fn now(&self) -> Timestamp {
        match self {
            Clock::Monotonic(origin) => {
                Timestamp(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
            }
            Clock::Manual(nanos) => Timestamp(nanos.load(Ordering::Relaxed)),
        }
    }

    /// Moves a manual clock forward; a monotonic clock ignores it.
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(nanos) = self {
            let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            nanos.fetch_add(by, Ordering::Relaxed);
        }
    }
}
