//! The Redis server's clock as the gateway estimates it, so that a call can carry its deadline
//! in the server's time.

use std::sync::atomic::{AtomicI64, Ordering};

use tokio::time::Instant;

use crate::limit::clock;

/// The gateway's estimate of the Redis server's clock, from the latest reply: the server's
/// `TIME` when the script ran, against the gateway's clock when the reply arrived. A deadline
/// moved into the server's time by that offset is the last moment at which a script's reply
/// still reaches the gateway in time (the reply's way back is in the offset).
#[derive(Debug)]
pub(crate) struct ServerClock {
    origin: std::time::Instant,
    /// Server microseconds minus the gateway's microseconds since `origin`; `i64::MIN` until
    /// the first reply.
    offset: AtomicI64,
}

impl ServerClock {
    pub(crate) fn new() -> ServerClock {
        ServerClock {
            origin: clock::instant(),
            offset: AtomicI64::new(i64::MIN),
        }
    }

    fn micros(&self, at: std::time::Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    /// Notes a reply that arrived now, with the server's time when its script ran.
    pub(crate) fn observe(&self, server_time: f64) {
        let offset = server_time as i64 - self.micros(clock::instant());
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// `deadline` in the server's time, in microseconds; 0 (none) before the first reply.
    pub(crate) fn deadline(&self, deadline: Instant) -> u64 {
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == i64::MIN {
            return 0;
        }
        u64::try_from(self.micros(deadline.into_std()).saturating_add(offset)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_move_into_the_servers_time_once_a_reply_gave_its_clock() {
        let clock = ServerClock::new();
        let deadline = Instant::from_std(clock.origin) + std::time::Duration::from_millis(1500);
        assert_eq!(clock.deadline(deadline), 0, "no estimate yet: no deadline");
        // The server said 1e15 µs when the gateway's clock read about 0 µs since its origin.
        clock.observe(1e15);
        let moved = clock.deadline(deadline);
        let expected = 1e15 as u64 + 1_500_000;
        assert!(
            moved <= expected && moved > expected - 1_000_000,
            "{moved} against {expected}"
        );
    }
}
