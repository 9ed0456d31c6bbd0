//! The Redis servers' clocks as the gateway estimates them, so that a call can carry its
//! deadline in the server's time, and the calls that ran after it (charging nothing).

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};

use prometheus::IntCounter;
use tokio::time::Instant;

use crate::limit::{clock, StoreError};

/// How long a call given up on is still listened to: a script that runs later is counted
/// late (it charged nothing), and its reply keeps the clock's estimate fresh.
const LATE_LISTEN: std::time::Duration = std::time::Duration::from_secs(30);

/// Unknown offset.
const NONE: i64 = i64::MIN;

/// The gateway's estimate of a server's clock, from the latest reply: the server's `TIME`
/// when the script ran, against the gateway's clock when the reply arrived. A deadline moved
/// into the server's time by that offset is the last moment at which a script's reply still
/// reaches the gateway in time (the reply's way back is in the offset).
///
/// A Cluster's nodes each have a clock: an estimate is kept per slot (a slot's calls go to one
/// node, and follow it when the slot moves), and a slot not yet called borrows the latest
/// estimate of any node (nodes' clocks agree as far as their NTP does).
#[derive(Debug)]
pub(crate) struct ServerClock {
    origin: std::time::Instant,
    /// Per slot (one for a single node): server microseconds minus the gateway's microseconds
    /// since `origin`.
    offsets: Box<[AtomicI64]>,
    latest: AtomicI64,
}

impl ServerClock {
    /// For a single node (`slots` = 1) or a Cluster (16384).
    pub(crate) fn new(slots: usize) -> ServerClock {
        ServerClock {
            origin: clock::instant(),
            offsets: (0..slots.max(1)).map(|_| AtomicI64::new(NONE)).collect(),
            latest: AtomicI64::new(NONE),
        }
    }

    fn micros(&self, at: std::time::Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    fn slot(&self, slot: u16) -> &AtomicI64 {
        &self.offsets[usize::from(slot) % self.offsets.len()]
    }

    /// How far the servers' clock is ahead of this machine's wall clock (seconds), from the
    /// latest reply; 0 before any.
    pub(crate) fn skew(&self) -> f64 {
        let offset = self.latest.load(Ordering::Relaxed);
        if offset == NONE {
            return 0.0;
        }
        let server = (offset + self.micros(clock::instant())) as f64 / 1e6;
        let local = clock::system_time()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        server - local
    }

    /// Notes a reply from `slot`'s node that arrived now, with the server's time when its
    /// script ran.
    pub(crate) fn observe(&self, slot: u16, server_time: f64) {
        let offset = server_time as i64 - self.micros(clock::instant());
        self.slot(slot).store(offset, Ordering::Relaxed);
        self.latest.store(offset, Ordering::Relaxed);
    }

    /// `deadline` in the time of `slot`'s server, in microseconds; 0 (none) before any reply.
    pub(crate) fn deadline(&self, slot: u16, deadline: Instant) -> u64 {
        let offset = match self.slot(slot).load(Ordering::Relaxed) {
            NONE => self.latest.load(Ordering::Relaxed),
            known => known,
        };
        if offset == NONE {
            return 0;
        }
        u64::try_from(self.micros(deadline.into_std()).saturating_add(offset)).unwrap_or(0)
    }
}

/// Calls whose script ran after the gateway gave up on them, and charged nothing.
#[derive(Debug, Clone)]
pub(crate) struct LateCalls(IntCounter);

impl LateCalls {
    pub(crate) fn counted_by(counter: IntCounter) -> LateCalls {
        LateCalls(counter)
    }

    pub(crate) fn count(&self) {
        self.0.inc();
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.get()
    }

    /// Waits for `call`'s reply until `deadline`. A call given up on goes on being listened
    /// to, for a while and in a task of its own (spawned only then: a task per call cost the
    /// usual call more than a box); `read` notes what its reply says and whether it ran late,
    /// which is then counted.
    pub(crate) async fn wait<T: Send + 'static>(
        &self,
        mut call: impl Future<Output = redis::RedisResult<T>> + Unpin + Send + 'static,
        deadline: Instant,
        read: impl FnOnce(T) -> bool + Send + 'static,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline, &mut call).await {
            Ok(reply) => reply.map_err(|error| StoreError::Redis(error.to_string())),
            Err(_) => {
                let late = self.clone();
                tokio::spawn(async move {
                    if let Ok(Ok(reply)) = tokio::time::timeout(LATE_LISTEN, call).await {
                        if read(reply) {
                            late.count();
                        }
                    }
                });
                Err(StoreError::Timeout)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(clock: &ServerClock, millis: u64) -> Instant {
        Instant::from_std(clock.origin) + std::time::Duration::from_millis(millis)
    }

    #[test]
    fn deadlines_move_into_the_servers_time_once_a_reply_gave_its_clock() {
        let clock = ServerClock::new(1);
        let deadline = at(&clock, 1500);
        assert_eq!(
            clock.deadline(0, deadline),
            0,
            "no estimate yet: no deadline"
        );
        // The server said 1e15 µs when the gateway's clock read about 0 µs since its origin.
        clock.observe(0, 1e15);
        let moved = clock.deadline(0, deadline);
        let expected = 1e15 as u64 + 1_500_000;
        assert!(
            moved <= expected && moved > expected - 1_000_000,
            "{moved} against {expected}"
        );
    }

    #[test]
    fn each_slot_keeps_its_nodes_clock_and_an_unknown_slot_borrows_the_latest() {
        let clock = ServerClock::new(16384);
        let deadline = at(&clock, 0);
        clock.observe(7, 1e15);
        clock.observe(9000, 2e15);
        let near = |moved: u64, server: f64| {
            let expected = server as u64;
            moved <= expected && moved > expected - 1_000_000
        };
        assert!(near(clock.deadline(7, deadline), 1e15));
        assert!(near(clock.deadline(9000, deadline), 2e15));
        assert!(
            near(clock.deadline(100, deadline), 2e15),
            "the latest estimate"
        );
    }
}
