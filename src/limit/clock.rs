//! Every read of the time (clippy.toml forbids them elsewhere). Decisions read a [`Clock`]:
//! monotonic in production, advanced by hand in tests. What only measures or bounds I/O —
//! latencies in metrics and logs, connection guards, deadlines of calls — reads [`instant`],
//! [`elapsed`], [`deadline_in`] or [`system_time`], and decides no limit.
#![allow(clippy::disallowed_methods)]

use std::cell::Cell;
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

/// The wall clock since the Unix epoch.
pub fn unix_time() -> Duration {
    unix_duration(SystemTime::now())
}

/// Whole seconds since the Unix epoch, for token expiry (`exp`, `nbf`).
pub fn unix_seconds() -> u64 {
    unix_time().as_secs()
}

/// A request's one reading of the clock, taken as it is answered: what its decision, its
/// request id and its `Date` are stamped with, instead of a read at each of them (as nginx
/// reads its time once per turn of its loop).
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    instant: Instant,
    /// The wall clock at `instant`, since the Unix epoch.
    unix: Duration,
}

/// How long a thread derives the wall clock from the monotonic one before reading it again:
/// a step of the wall clock shows within it, and a slew drifts by well under a millisecond.
const WALL_ANCHOR_FOR: Duration = Duration::from_secs(1);

impl Reading {
    /// Reads the monotonic clock; the wall clock is derived from this thread's last reading of
    /// it, read again at most once a second.
    pub fn now() -> Reading {
        thread_local! {
            static WALL_ANCHOR: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
        }
        let instant = Instant::now();
        let unix = WALL_ANCHOR.with(|anchor| {
            if let Some((at, unix)) = anchor.get() {
                if let Some(since) = instant.checked_duration_since(at) {
                    if since < WALL_ANCHOR_FOR {
                        return unix + since;
                    }
                }
            }
            let unix = unix_duration(SystemTime::now());
            anchor.set(Some((instant, unix)));
            unix
        });
        Reading { instant, unix }
    }

    pub fn instant(&self) -> Instant {
        self.instant
    }

    /// The wall clock, since the Unix epoch.
    pub fn unix(&self) -> Duration {
        self.unix
    }

    /// The time since the reading, for a latency.
    pub fn elapsed(&self) -> Duration {
        self.instant.elapsed()
    }
}

fn unix_duration(time: SystemTime) -> Duration {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
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
            Clock::Monotonic(_) => unix_time().as_secs_f64(),
            Clock::Manual(nanos) => nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// The clock's reading at `reading`: a monotonic clock's time of it, a manual clock's own.
    pub fn at(&self, reading: &Reading) -> Timestamp {
        match self {
            Clock::Monotonic(origin) => Timestamp(
                u64::try_from(
                    reading
                        .instant
                        .saturating_duration_since(*origin)
                        .as_nanos(),
                )
                .unwrap_or(u64::MAX),
            ),
            Clock::Manual(nanos) => Timestamp(nanos.load(Ordering::Relaxed)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_derives_the_wall_clock_from_the_monotonic_one() {
        let before = unix_time();
        let first = Reading::now();
        let second = Reading::now();
        let after = unix_time();
        // Derived from an anchor read at most a second before, it lies where the wall clock
        // does (up to a slew's drift, far below the millisecond allowed here).
        let slack = Duration::from_millis(1);
        for reading in [first, second] {
            assert!(reading.unix() + slack >= before && reading.unix() <= after + slack);
        }
        let on_the_wall = second.unix().saturating_sub(first.unix());
        let on_the_monotonic = second.instant().duration_since(first.instant());
        assert!(
            on_the_wall.abs_diff(on_the_monotonic) <= slack,
            "{on_the_wall:?} apart on the wall clock, {on_the_monotonic:?} on the monotonic"
        );
    }

    #[test]
    fn a_clock_at_a_reading_is_its_monotonic_time_or_a_manual_clocks_own() {
        let monotonic = Clock::monotonic();
        let reading = Reading::now();
        let at = monotonic.at(&reading);
        assert!(at <= monotonic.now());
        let manual = Clock::manual_at(1_000);
        assert_eq!(manual.at(&reading), Timestamp(1_000_000_000_000));
    }
}
