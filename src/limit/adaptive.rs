//! Adaptive penalties for one key of one limit: a pure state machine.
//!
//! Upstream answers in `on_status` count as errors for the request's key. When `threshold`
//! errors fall within `window`, the key *trips*: its capacity and rate are multiplied by
//! `factor` (compounding on further trips, never below `min_capacity`), and the error count
//! starts over. The reduction lasts until `hold` has passed without a further error; then the
//! key is back to the configured limit.

use std::collections::VecDeque;

use super::clock::Timestamp;

/// A limit's `[adaptive]` table, in the units the math needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveParams {
    pub threshold: u32,
    /// Seconds.
    pub window: f64,
    /// In (0, 1].
    pub factor: f64,
    pub min_capacity: f64,
    /// Seconds.
    pub hold: f64,
}

/// The adaptive part of a bucket's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdaptiveState {
    /// How many times the key tripped while the reduction lasted (0: no reduction).
    pub level: u32,
    /// When the reduction ends, unless another error extends it.
    pub hold_until: Timestamp,
    /// The latest errors inside the window, oldest first (at most `threshold`).
    pub errors: VecDeque<Timestamp>,
}

impl AdaptiveState {
    /// The level in force at `now` (0 once the hold has passed).
    pub fn level_at(&self, now: Timestamp) -> u32 {
        if now >= self.hold_until {
            0
        } else {
            self.level
        }
    }

    /// What capacity and rate are multiplied by at `now`.
    pub fn multiplier(&self, params: &AdaptiveParams, capacity: f64, now: Timestamp) -> f64 {
        multiplier(params, capacity, self.level_at(now))
    }

    /// Records an error at `now`; returns whether the key tripped.
    pub fn record_error(&mut self, params: &AdaptiveParams, now: Timestamp) -> bool {
        self.level = self.level_at(now);
        let window_start = Timestamp(now.0.saturating_sub(seconds_to_nanos(params.window)));
        while self
            .errors
            .front()
            .is_some_and(|error| *error < window_start)
        {
            self.errors.pop_front();
        }
        self.errors.push_back(now);
        while self.errors.len() > params.threshold as usize {
            self.errors.pop_front();
        }
        let tripped = self.errors.len() >= params.threshold as usize;
        if tripped {
            self.level = self.level.saturating_add(1);
            self.errors.clear();
        }
        if self.level > 0 {
            self.hold_until = now.after(params.hold);
        }
        tripped
    }

    /// Until when this state still matters (a bucket holding it must be kept).
    pub fn relevant_until(&self, params: &AdaptiveParams) -> Timestamp {
        let last_error = self
            .errors
            .back()
            .map_or(Timestamp(0), |error| error.after(params.window));
        if self.level > 0 {
            last_error.max(self.hold_until)
        } else {
            last_error
        }
    }
}

/// `factor^level`, but never below `min_capacity / capacity` (and never above 1).
pub fn multiplier(params: &AdaptiveParams, capacity: f64, level: u32) -> f64 {
    if level == 0 {
        return 1.0;
    }
    let floor = (params.min_capacity / capacity).min(1.0);
    params.factor.powi(level.min(1024) as i32).max(floor)
}

fn seconds_to_nanos(seconds: f64) -> u64 {
    let nanos = (seconds * 1e9).round();
    if nanos >= u64::MAX as f64 {
        u64::MAX
    } else {
        nanos.max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: AdaptiveParams = AdaptiveParams {
        threshold: 3,
        window: 60.0,
        factor: 0.5,
        min_capacity: 2.0,
        hold: 120.0,
    };

    fn at(seconds: f64) -> Timestamp {
        Timestamp((seconds * 1e9) as u64)
    }

    #[test]
    fn trips_on_the_threshold_th_error_within_the_window() {
        let mut state = AdaptiveState::default();
        assert!(!state.record_error(&PARAMS, at(0.0)));
        assert!(!state.record_error(&PARAMS, at(10.0)));
        assert_eq!(state.multiplier(&PARAMS, 10.0, at(10.0)), 1.0);
        assert!(state.record_error(&PARAMS, at(20.0)));
        assert_eq!(state.level_at(at(20.0)), 1);
        assert_eq!(state.multiplier(&PARAMS, 10.0, at(20.0)), 0.5);
        assert!(
            state.errors.is_empty(),
            "the count starts over after a trip"
        );
    }

    #[test]
    fn the_window_slides() {
        let mut state = AdaptiveState::default();
        state.record_error(&PARAMS, at(0.0));
        state.record_error(&PARAMS, at(50.0));
        // The first error is older than 60 s at t=61: two errors in the window, no trip.
        assert!(!state.record_error(&PARAMS, at(61.0)));
        assert!(
            state.record_error(&PARAMS, at(100.0)),
            "50, 61, 100 are within 60 s"
        );
    }

    #[test]
    fn trips_compound_down_to_the_floor() {
        let mut state = AdaptiveState::default();
        let mut now = 0.0;
        let mut multipliers = Vec::new();
        for _ in 0..4 {
            for _ in 0..3 {
                now += 1.0;
                state.record_error(&PARAMS, at(now));
            }
            multipliers.push(state.multiplier(&PARAMS, 10.0, at(now)));
        }
        // 0.5, 0.25, then the floor: min_capacity 2 of capacity 10.
        assert_eq!(multipliers, [0.5, 0.25, 0.2, 0.2]);
        assert_eq!(state.level, 4);
    }

    #[test]
    fn the_reduction_expires_after_hold_without_errors() {
        let mut state = AdaptiveState::default();
        for second in [0.0, 1.0, 2.0] {
            state.record_error(&PARAMS, at(second));
        }
        // A later error (below the threshold) extends the hold.
        state.record_error(&PARAMS, at(100.0));
        assert_eq!(state.level_at(at(219.0)), 1);
        assert_eq!(state.level_at(at(220.0)), 0);
        assert_eq!(state.multiplier(&PARAMS, 10.0, at(220.0)), 1.0);
        // After expiry, a new trip starts from level 1 again.
        for second in [300.0, 301.0, 302.0] {
            state.record_error(&PARAMS, at(second));
        }
        assert_eq!(state.level_at(at(302.0)), 1);
    }

    #[test]
    fn state_stays_relevant_while_errors_or_a_reduction_last() {
        let mut state = AdaptiveState::default();
        state.record_error(&PARAMS, at(5.0));
        assert_eq!(state.relevant_until(&PARAMS), at(65.0));
        state.record_error(&PARAMS, at(6.0));
        state.record_error(&PARAMS, at(7.0));
        assert_eq!(state.relevant_until(&PARAMS), at(127.0));
    }
}
