//! Token-bucket math for all of one request's buckets: a pure function of
//! (stored states, now, parameters, costs) → (verdicts, new states).
//!
//! Tokens are recomputed from elapsed time at decision time (`min(capacity, tokens +
//! elapsed × rate)`), never by a timer. A request is admitted only if every enforcing bucket
//! holds at least its cost; then every bucket that can pay is charged. If one refuses, none
//! is charged. A shadow bucket never refuses: it is charged when it can pay and reports
//! when it could not.
//!
//! A calendar quota is a bucket without refill (`rate` 0) whose tokens belong to one period:
//! a state of another period is a full bucket, and the wait is the time to the period's end.

use super::clock::Timestamp;
use super::Verdicts;

/// What a bucket holds between decisions. A bucket with no state is full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    pub tokens: f64,
    /// When the tokens were counted; for a quota, the end of the period they belong to (Unix
    /// seconds), which is what tells one period's count from the next.
    pub updated: Timestamp,
}

/// One bucket's part in a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charge {
    pub capacity: f64,
    /// Tokens per second; > 0 for a bucket, 0 for a calendar quota.
    pub rate: f64,
    pub cost: f64,
    /// `false` for a limit in shadow mode.
    pub enforce: bool,
    /// For a calendar quota: the period the decision counts in.
    pub period: Option<QuotaPeriod>,
    /// `on_limit = "delay"`: how far below zero a request may book tokens it then waits for
    /// (`rate × max_delay`); 0 refuses at once.
    pub debt: f64,
}

/// The calendar period a quota's decision counts in, as the gateway's clock places it (a
/// store with a clock of its own, Redis, moves to `next_end`'s period once its time is past
/// `end`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaPeriod {
    /// The period's end, Unix seconds: it identifies the period.
    pub end: i64,
    /// The next period's end.
    pub next_end: i64,
    /// Seconds from the decision to `end`.
    pub ends_in: f64,
}

impl Charge {
    /// Seconds until a bucket holding `tokens` holds the cost: for a quota, until its period
    /// ends and the count starts over.
    pub fn wait(&self, tokens: f64) -> f64 {
        match self.period {
            Some(period) if tokens < self.cost => period.ends_in,
            Some(_) => 0.0,
            None if tokens < self.cost => (self.cost - tokens) / self.rate,
            None => 0.0,
        }
    }

    /// Seconds until a bucket holding `tokens` is full again: for a quota, its period's end.
    pub fn full_in(&self, tokens: f64) -> f64 {
        match self.period {
            Some(_) if tokens >= self.capacity => 0.0,
            Some(period) => period.ends_in,
            None => ((self.capacity - tokens) / self.rate).max(0.0),
        }
    }

    /// The same charge with capacity and rate multiplied (an adaptive penalty).
    pub fn scaled(&self, multiplier: f64) -> Charge {
        Charge {
            capacity: self.capacity * multiplier,
            rate: self.rate * multiplier,
            ..*self
        }
    }
}

/// One bucket's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// The bucket held at least the cost (a shadow bucket that did not "would have refused").
    pub sufficient: bool,
    /// Tokens left after this decision (charged or not).
    pub tokens: f64,
    /// Seconds until the bucket holds the cost; 0 when it does now.
    pub wait: f64,
    /// Seconds until the bucket is full again.
    pub full_in: f64,
    /// The capacity and rate in force for this key (reduced by an adaptive penalty).
    pub capacity: f64,
    pub rate: f64,
    /// The store saw this bucket in this decision (a refusal from the replica-local deny
    /// cache knows only the bucket that refused).
    pub observed: bool,
    /// Too few tokens, but within the limit's debt: the request booked them and waits `wait`
    /// before it goes on (`on_limit = "delay"`).
    pub booked: bool,
    /// The key is banned (`[limits.NAME.ban]`): refused whatever it holds; `wait` is what is
    /// left of the ban.
    pub banned: bool,
    /// This decision's refusal began a ban of the key.
    pub ban_began: bool,
}

impl Verdict {
    /// The verdict for a bucket that holds `tokens` after the decision.
    pub fn observed(charge: &Charge, tokens: f64, sufficient: bool) -> Verdict {
        Verdict {
            sufficient,
            tokens,
            wait: if sufficient { 0.0 } else { charge.wait(tokens) },
            full_in: charge.full_in(tokens),
            capacity: charge.capacity,
            rate: charge.rate,
            observed: true,
            booked: false,
            banned: false,
            ban_began: false,
        }
    }

    /// The verdict for a bucket that booked the tokens it lacked and holds `tokens` (below
    /// the cost, perhaps below zero) after the charge: the request waits until they refill.
    pub fn booked(charge: &Charge, tokens: f64) -> Verdict {
        Verdict {
            sufficient: false,
            tokens,
            wait: charge.wait(tokens + charge.cost),
            full_in: charge.full_in(tokens),
            capacity: charge.capacity,
            rate: charge.rate,
            observed: true,
            booked: true,
            banned: false,
            ban_began: false,
        }
    }

    /// The verdict for a banned key's bucket, `left` seconds of the ban to go: nothing charged.
    pub fn banned(charge: &Charge, tokens: f64, left: f64) -> Verdict {
        Verdict {
            sufficient: false,
            wait: left,
            banned: true,
            ..Verdict::observed(charge, tokens, false)
        }
    }

    /// `charge` with the capacity and rate that were in force for this bucket.
    pub fn in_force(&self, charge: &Charge) -> Charge {
        Charge {
            capacity: self.capacity,
            rate: self.rate,
            ..*charge
        }
    }

    /// A bucket the decision did not look at.
    pub fn unobserved() -> Verdict {
        Verdict {
            sufficient: true,
            tokens: 0.0,
            wait: 0.0,
            full_in: 0.0,
            capacity: 0.0,
            rate: 0.0,
            observed: false,
            booked: false,
            banned: false,
            ban_began: false,
        }
    }
}

/// The tokens a bucket holds at `now`.
pub fn tokens_at(state: Option<BucketState>, charge: &Charge, now: Timestamp) -> f64 {
    match (state, charge.period) {
        (None, _) => charge.capacity,
        (Some(state), Some(period)) if state.updated == period_stamp(period) => {
            state.tokens.min(charge.capacity)
        }
        // Another period's count: this period's starts full.
        (Some(_), Some(_)) => charge.capacity,
        (Some(state), None) => {
            let elapsed = now.saturating_elapsed_since(state.updated).as_secs_f64();
            (state.tokens + elapsed * charge.rate).min(charge.capacity)
        }
    }
}

/// What a quota's state records as its `updated`: the end of its period.
fn period_stamp(period: QuotaPeriod) -> Timestamp {
    Timestamp(u64::try_from(period.end).unwrap_or(0))
}

/// The state a bucket holds `tokens` in after a decision at `now`, which followed `before`.
/// A bucket's moment only moves forward: a decision whose clock is behind the stored moment
/// (a log read out of order, a store whose clock was stepped back) counts at the stored one,
/// so that no interval is refilled twice.
fn counted(
    charge: &Charge,
    tokens: f64,
    now: Timestamp,
    before: Option<BucketState>,
) -> BucketState {
    let moment = match before {
        Some(before) if before.updated > now => before.updated,
        _ => now,
    };
    BucketState {
        tokens,
        updated: charge.period.map_or(moment, period_stamp),
    }
}

/// Decides a request against all of its buckets and updates their states in place.
/// `states[i]` belongs to `charges[i]`; verdicts are written to `verdicts` in the same order.
/// Returns whether the request is admitted.
pub fn decide(
    charges: &[Charge],
    states: &mut [Option<BucketState>],
    now: Timestamp,
    verdicts: &mut Verdicts,
) -> bool {
    debug_assert_eq!(charges.len(), states.len());
    verdicts.clear();
    let mut admitted = true;
    for (charge, state) in charges.iter().zip(states.iter()) {
        let tokens = tokens_at(*state, charge, now);
        let sufficient = tokens >= charge.cost;
        // Booked: the tokens it lacks come within the limit's delay; later requests find the
        // debt and queue behind it.
        let booked = !sufficient && charge.enforce && tokens - charge.cost >= -charge.debt;
        admitted &= sufficient || booked || !charge.enforce;
        let wait = charge.wait(tokens);
        verdicts.push(Verdict {
            sufficient,
            tokens,
            wait,
            full_in: 0.0,
            capacity: charge.capacity,
            rate: charge.rate,
            observed: true,
            booked,
            banned: false,
            ban_began: false,
        });
    }
    for ((charge, state), verdict) in charges
        .iter()
        .zip(states.iter_mut())
        .zip(verdicts.iter_mut())
    {
        verdict.booked &= admitted;
        if admitted && (verdict.sufficient || verdict.booked) {
            verdict.tokens -= charge.cost;
        }
        verdict.full_in = charge.full_in(verdict.tokens);
        *state = Some(counted(charge, verdict.tokens, now, *state));
    }
    admitted
}

/// What a bucket of no capacity (that refills at `charge`'s rate and never refuses) owes after
/// a request of `charge` at `now`: the smallest capacity that would never have refused the
/// requests so far is the most it ever owed. Decided by the rule every decision follows
/// (`tokens_at`, `counted`), so a replay's suggestion holds when replayed.
pub fn owed(state: Option<BucketState>, charge: &Charge, now: Timestamp) -> BucketState {
    let owing = Charge {
        capacity: 0.0,
        ..*charge
    };
    let tokens = tokens_at(state, &owing, now) - charge.cost;
    counted(&owing, tokens, now, state)
}

/// Charges `extra` tokens after the response (`charge_on_status`). The bucket may go into
/// debt, down to `-capacity`: an expensive outcome is not free because the bucket was nearly
/// empty, and the debt must refill before the next admit. A negative `extra` gives tokens
/// back (a delayed request whose client left), never beyond the capacity.
pub fn charge_after(
    state: Option<BucketState>,
    charge: &Charge,
    extra: f64,
    now: Timestamp,
) -> BucketState {
    let tokens = tokens_at(state, charge, now);
    counted(
        charge,
        (tokens - extra).max(-charge.capacity).min(charge.capacity),
        now,
        state,
    )
}

#[cfg(test)]
mod tests;
