//! A circuit breaker for the shared store: after repeated failures, stop calling it for a
//! backoff so that every request does not pay the timeout during an outage; then let one
//! probe through, and close again as soon as a call succeeds.

use std::time::Duration;

use parking_lot::Mutex;

use super::clock::{Clock, Timestamp};

/// Consecutive failures that open the circuit.
const FAILURES_TO_OPEN: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Timestamp,
        backoff: Duration,
    },
    /// One probe is out; everyone else waits for its result.
    Probing {
        backoff: Duration,
    },
}

#[derive(Debug)]
pub struct Breaker {
    state: Mutex<State>,
    clock: Clock,
}

/// Whether a call may go to the store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    Call,
    /// The circuit is open: decide without the store.
    Refused,
}

impl Breaker {
    pub fn new(clock: Clock) -> Breaker {
        Breaker {
            state: Mutex::new(State::Closed { failures: 0 }),
            clock,
        }
    }

    pub fn permit(&self) -> Permit {
        let mut state = self.state.lock();
        match *state {
            State::Closed { .. } => Permit::Call,
            State::Open { until, backoff } if self.clock.now() >= until => {
                *state = State::Probing { backoff };
                Permit::Call
            }
            State::Open { .. } | State::Probing { .. } => Permit::Refused,
        }
    }

    pub fn success(&self) {
        let mut state = self.state.lock();
        if *state != (State::Closed { failures: 0 }) {
            if !matches!(*state, State::Closed { .. }) {
                tracing::info!("store answers again: circuit closed");
            }
            *state = State::Closed { failures: 0 };
        }
    }

    pub fn failure(&self) {
        let mut state = self.state.lock();
        let now = self.clock.now();
        *state = match *state {
            State::Closed { failures } if failures + 1 < FAILURES_TO_OPEN => State::Closed {
                failures: failures + 1,
            },
            State::Closed { .. } => {
                tracing::warn!(backoff = ?FIRST_BACKOFF, "store failing: circuit opened, deciding without it");
                State::Open {
                    until: now.after(FIRST_BACKOFF.as_secs_f64()),
                    backoff: FIRST_BACKOFF,
                }
            }
            State::Probing { backoff } | State::Open { backoff, .. } => {
                let backoff = (backoff * 2).min(MAX_BACKOFF);
                State::Open {
                    until: now.after(backoff.as_secs_f64()),
                    backoff,
                }
            }
        };
    }

    /// Whether the circuit is open (or probing).
    pub fn is_open(&self) -> bool {
        !matches!(*self.state.lock(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_repeated_failures_then_probes_and_closes() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        breaker.failure();
        breaker.failure();
        assert_eq!(
            breaker.permit(),
            Permit::Call,
            "two failures are not an outage"
        );
        breaker.failure();
        assert_eq!(breaker.permit(), Permit::Refused);
        clock.advance(FIRST_BACKOFF);
        assert_eq!(
            breaker.permit(),
            Permit::Call,
            "one probe after the backoff"
        );
        assert_eq!(breaker.permit(), Permit::Refused, "only one");
        breaker.success();
        assert_eq!(breaker.permit(), Permit::Call);
        assert!(!breaker.is_open());
    }

    #[test]
    fn a_failed_probe_doubles_the_backoff_up_to_a_bound() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        for _ in 0..3 {
            breaker.failure();
        }
        let mut backoff = FIRST_BACKOFF;
        for _ in 0..8 {
            clock.advance(backoff - Duration::from_millis(1));
            assert_eq!(breaker.permit(), Permit::Refused);
            clock.advance(Duration::from_millis(1));
            assert_eq!(breaker.permit(), Permit::Call);
            breaker.failure();
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        assert_eq!(backoff, MAX_BACKOFF);
        assert!(breaker.is_open());
    }
}
