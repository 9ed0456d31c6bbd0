//! A circuit breaker for the shared store: after repeated failures, stop calling it for a
//! backoff so that every request does not pay the timeout during an outage; then let one
//! probe through, and close again as soon as a call succeeds.
//!
//! A permitted call is a [`Call`] guard. The probe's outcome decides whether the circuit
//! closes, and the probe lives in a request's future, which a client that goes away drops:
//! a probe dropped without an outcome hands the probe to the next call instead of leaving
//! the circuit probing (and the store unused) for good.

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

/// The circuit's state as operators and tests see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    /// Calls are refused until the backoff ends.
    Open,
    /// One call is out to find whether the store answers again.
    Probing,
}

#[derive(Debug)]
pub struct Breaker {
    state: Mutex<State>,
    clock: Clock,
}

/// A call the breaker let through. Record its outcome with [`Call::success`] or
/// [`Call::failure`]; dropped without one, a probe is handed to the next call.
#[derive(Debug)]
#[must_use = "a call's outcome must be recorded"]
pub struct Call<'a> {
    breaker: &'a Breaker,
    probe: bool,
}

impl Call<'_> {
    pub fn success(mut self) {
        self.probe = false;
        self.breaker.success();
    }

    pub fn failure(mut self) {
        self.probe = false;
        self.breaker.failure();
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.abandon_probe();
        }
    }
}

impl Breaker {
    pub fn new(clock: Clock) -> Breaker {
        Breaker {
            state: Mutex::new(State::Closed { failures: 0 }),
            clock,
        }
    }

    /// A call may go to the store now, or `None`: the circuit is open, decide without it.
    pub fn permit(&self) -> Option<Call<'_>> {
        let mut state = self.state.lock();
        let probe = match *state {
            State::Closed { .. } => false,
            State::Open { until, backoff } if self.clock.now() >= until => {
                *state = State::Probing { backoff };
                true
            }
            State::Open { .. } | State::Probing { .. } => return None,
        };
        Some(Call {
            breaker: self,
            probe,
        })
    }

    fn success(&self) {
        let mut state = self.state.lock();
        if *state != (State::Closed { failures: 0 }) {
            if !matches!(*state, State::Closed { .. }) {
                tracing::info!("store answers again: circuit closed");
            }
            *state = State::Closed { failures: 0 };
        }
    }

    fn failure(&self) {
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

    /// The probe's request went away before its outcome was known: the next call probes.
    fn abandon_probe(&self) {
        let mut state = self.state.lock();
        if let State::Probing { backoff } = *state {
            *state = State::Open {
                until: self.clock.now(),
                backoff,
            };
        }
    }

    /// Closes the circuit: the store answered a check made outside any request (see
    /// `RedisStore::probe_if_open`).
    pub fn close(&self) {
        self.success();
    }

    pub fn state(&self) -> CircuitState {
        match *self.state.lock() {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { .. } => CircuitState::Open,
            State::Probing { .. } => CircuitState::Probing,
        }
    }

    /// Whether the circuit is open (or probing).
    pub fn is_open(&self) -> bool {
        self.state() != CircuitState::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(breaker: &Breaker) {
        breaker.permit().expect("a call is permitted").failure();
    }

    #[test]
    fn opens_after_repeated_failures_then_probes_and_closes() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        fail(&breaker);
        fail(&breaker);
        assert_eq!(
            breaker.state(),
            CircuitState::Closed,
            "two failures are not an outage"
        );
        fail(&breaker);
        assert!(breaker.permit().is_none());
        clock.advance(FIRST_BACKOFF);
        let probe = breaker.permit().expect("one probe after the backoff");
        assert_eq!(breaker.state(), CircuitState::Probing);
        assert!(breaker.permit().is_none(), "only one");
        probe.success();
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert!(breaker.permit().is_some());
    }

    #[test]
    fn a_failed_probe_doubles_the_backoff_up_to_a_bound() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        for _ in 0..3 {
            fail(&breaker);
        }
        let mut backoff = FIRST_BACKOFF;
        for _ in 0..8 {
            clock.advance(backoff - Duration::from_millis(1));
            assert!(breaker.permit().is_none());
            clock.advance(Duration::from_millis(1));
            fail(&breaker);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        assert_eq!(backoff, MAX_BACKOFF);
        assert!(breaker.is_open());
    }

    #[test]
    fn a_probe_dropped_without_an_outcome_hands_the_probe_to_the_next_call() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        for _ in 0..3 {
            fail(&breaker);
        }
        clock.advance(FIRST_BACKOFF);
        // The probing request's client went away: its future, and the call, are dropped.
        drop(breaker.permit().expect("the probe"));
        assert_eq!(breaker.state(), CircuitState::Open);
        let probe = breaker
            .permit()
            .expect("the next call probes at once, without another backoff");
        assert!(breaker.permit().is_none(), "still one probe at a time");
        probe.success();
        assert_eq!(breaker.state(), CircuitState::Closed);
    }

    #[test]
    fn a_store_that_answers_a_check_closes_the_circuit_before_its_backoff_ends() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        for _ in 0..3 {
            fail(&breaker);
        }
        for _ in 0..4 {
            clock.advance(MAX_BACKOFF);
            fail(&breaker);
        }
        assert!(breaker.permit().is_none(), "in a long backoff");
        breaker.close();
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert!(breaker.permit().is_some());
    }

    #[test]
    fn an_ordinary_call_dropped_without_an_outcome_changes_nothing() {
        let clock = Clock::manual();
        let breaker = Breaker::new(clock.clone());
        fail(&breaker);
        fail(&breaker);
        drop(breaker.permit());
        fail(&breaker);
        assert_eq!(
            breaker.state(),
            CircuitState::Open,
            "the dropped call neither failed nor reset the count"
        );
    }
}
