//! The bucket math against an injected clock: examples, and properties over any schedule.

use super::*;
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

fn charge(capacity: f64, rate: f64, cost: f64) -> Charge {
    Charge {
        capacity,
        rate,
        cost,
        enforce: true,
        period: None,
        debt: 0.0,
    }
}

fn at(seconds: f64) -> Timestamp {
    Timestamp((seconds * SECOND as f64) as u64)
}

fn run(charges: &[Charge], states: &mut [Option<BucketState>], now: Timestamp) -> (bool, Verdicts) {
    let mut verdicts = Verdicts::new();
    let admitted = decide(charges, states, now, &mut verdicts);
    (admitted, verdicts)
}

#[test]
fn a_new_bucket_admits_its_burst_then_refuses() {
    let charges = [charge(5.0, 1.0 / 30.0, 1.0)];
    let mut states = [None];
    for remaining in (0..5).rev() {
        let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
        assert!(admitted);
        assert_eq!(verdicts[0].tokens, remaining as f64);
    }
    let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
    assert!(!admitted);
    assert!((verdicts[0].wait - 30.0).abs() < 1e-9);
    assert!((verdicts[0].full_in - 150.0).abs() < 1e-9);
}

#[test]
fn refill_is_computed_from_elapsed_time_and_capped() {
    let charges = [charge(10.0, 2.0, 1.0)];
    let mut states = [Some(BucketState {
        tokens: 0.0,
        updated: at(0.0),
    })];
    let (admitted, verdicts) = run(&charges, &mut states, at(0.25));
    assert!(!admitted, "0.5 tokens after 250ms is not enough");
    assert!((verdicts[0].wait - 0.25).abs() < 1e-9);
    let (admitted, verdicts) = run(&charges, &mut states, at(0.5));
    assert!(admitted);
    assert!(verdicts[0].tokens.abs() < 1e-9);
    let (_, verdicts) = run(&charges, &mut states, at(1000.0));
    assert_eq!(
        verdicts[0].tokens, 9.0,
        "capped at capacity before the charge"
    );
}

#[test]
fn cost_is_charged_and_wait_covers_the_whole_cost() {
    let charges = [charge(300.0, 5.0, 100.0)];
    let mut states = [None];
    for _ in 0..3 {
        assert!(run(&charges, &mut states, at(0.0)).0);
    }
    let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
    assert!(!admitted);
    assert_eq!(verdicts[0].wait, 20.0);
}

#[test]
fn a_delaying_bucket_books_within_its_debt_and_later_requests_queue_behind() {
    // Capacity 2, 2 tokens a second, up to a second of delay: 2 tokens of debt.
    let delaying = Charge {
        debt: 2.0,
        ..charge(2.0, 2.0, 1.0)
    };
    let mut states = [None];
    let waits: Vec<(bool, bool, f64)> = (0..5)
        .map(|_| {
            let (admitted, verdicts) = run(&[delaying], &mut states, at(0.0));
            (admitted, verdicts[0].booked, verdicts[0].wait)
        })
        .collect();
    assert_eq!(
        waits,
        [
            (true, false, 0.0),
            (true, false, 0.0),
            (true, true, 0.5),
            (true, true, 1.0),
            (false, false, 1.5)
        ]
    );
    assert_eq!(
        states[0].unwrap().tokens,
        -2.0,
        "the refused one booked nothing"
    );
    // Half a second on, the debt has shrunk by a token: one more is booked, a second wait.
    let (admitted, verdicts) = run(&[delaying], &mut states, at(0.5));
    assert!(admitted && verdicts[0].booked && verdicts[0].wait == 1.0);
    assert_eq!(
        verdicts[0],
        Verdict::booked(&delaying, -2.0),
        "a store that reports only the tokens after (Redis) makes the same verdict"
    );
    // A bucket that refuses does not book, and a request it refuses books nowhere.
    let refusing = charge(2.0, 2.0, 1.0);
    let mut states = [
        None,
        Some(BucketState {
            tokens: 0.0,
            updated: at(0.0),
        }),
    ];
    let (admitted, verdicts) = run(&[delaying, refusing], &mut states, at(0.0));
    assert!(!admitted && !verdicts[0].booked);
    assert_eq!(states[0].unwrap().tokens, 2.0);
}

#[test]
fn all_or_nothing_across_buckets() {
    let charges = [charge(10.0, 1.0, 1.0), charge(1.0, 1.0, 1.0)];
    let mut states = [
        None,
        Some(BucketState {
            tokens: 0.0,
            updated: at(0.0),
        }),
    ];
    let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
    assert!(!admitted);
    assert!(verdicts[0].sufficient && !verdicts[1].sufficient);
    assert_eq!(
        states[0].unwrap().tokens,
        10.0,
        "the bucket that could pay was not charged"
    );
    let (admitted, _) = run(&charges, &mut states, at(1.0));
    assert!(admitted);
    assert_eq!(states[0].unwrap().tokens, 9.0);
    assert_eq!(states[1].unwrap().tokens, 0.0);
}

#[test]
fn shadow_buckets_never_refuse_and_are_charged_only_when_they_can_pay() {
    let shadow = Charge {
        enforce: false,
        period: None,
        debt: 0.0,
        ..charge(1.0, 1.0, 1.0)
    };
    let charges = [charge(10.0, 1.0, 1.0), shadow];
    let mut states = [None, None];
    let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
    assert!(admitted && verdicts[1].sufficient);
    let (admitted, verdicts) = run(&charges, &mut states, at(0.0));
    assert!(admitted, "a shadow limit never refuses");
    assert!(!verdicts[1].sufficient, "but it reports that it would have");
    assert_eq!(verdicts[1].tokens, 0.0);
    assert_eq!(states[0].unwrap().tokens, 8.0);
}

#[test]
fn a_quota_counts_per_period_never_refills_and_waits_for_the_next() {
    let quota = |end: i64, ends_in: f64| Charge {
        period: Some(QuotaPeriod {
            end,
            next_end: end + 3600,
            ends_in,
        }),
        ..charge(3.0, 0.0, 1.0)
    };
    let mut state = [None];
    let mut verdicts = Verdicts::new();
    for (second, left) in [(0.0, 2.0), (10.0, 1.0), (3000.0, 0.0)] {
        assert!(decide(
            &[quota(3600, 3600.0 - second)],
            &mut state,
            at(second),
            &mut verdicts
        ));
        assert_eq!(verdicts[0].tokens, left, "no refill at {second} s");
        assert_eq!(verdicts[0].full_in, 3600.0 - second);
    }
    assert!(!decide(
        &[quota(3600, 500.0)],
        &mut state,
        at(3100.0),
        &mut verdicts
    ));
    assert_eq!(verdicts[0].wait, 500.0, "until the period ends");
    assert_eq!(
        state[0].unwrap().updated,
        Timestamp(3600),
        "the period's end names it"
    );
    // The next period starts full, whatever the previous one left.
    assert!(decide(
        &[quota(7200, 3599.0)],
        &mut state,
        at(3601.0),
        &mut verdicts
    ));
    assert_eq!(verdicts[0].tokens, 2.0);
    assert_eq!(
        charge_after(state[0], &quota(7200, 3000.0), 5.0, at(4000.0)).tokens,
        -3.0
    );
}

#[test]
fn outcome_charges_may_go_into_debt_down_to_minus_capacity() {
    let c = charge(10.0, 1.0, 1.0);
    let state = charge_after(
        Some(BucketState {
            tokens: 2.0,
            updated: at(0.0),
        }),
        &c,
        5.0,
        at(0.0),
    );
    assert_eq!(state.tokens, -3.0);
    let (admitted, verdicts) = run(&[c], &mut [Some(state)], at(3.5));
    assert!(!admitted, "the debt refills first");
    assert!((verdicts[0].wait - 0.5).abs() < 1e-9);
    let floor = charge_after(Some(state), &c, 100.0, at(0.0));
    assert_eq!(floor.tokens, -10.0);
}

#[test]
fn a_clock_that_goes_backwards_adds_nothing() {
    let charges = [charge(2.0, 1.0, 1.0)];
    let mut states = [Some(BucketState {
        tokens: 0.5,
        updated: at(10.0),
    })];
    let (admitted, _) = run(&charges, &mut states, at(5.0));
    assert!(!admitted);
    assert_eq!(
        states[0].unwrap().updated,
        at(10.0),
        "the moment stays where it was"
    );
    // Back at the stored moment, the interval 5..10 is not refilled a second time.
    let (admitted, verdicts) = run(&charges, &mut states, at(10.0));
    assert!(!admitted);
    assert_eq!(verdicts[0].tokens, 0.5);
    let after = charge_after(states[0], &charges[0], 0.25, at(1.0));
    assert_eq!(after.updated, at(10.0));
}

#[test]
fn a_log_alternating_between_two_moments_is_refilled_once() {
    // Capacity 1, a token per 100 s, 20 requests alternating between t and t + 100 s: the
    // bucket allows 2 (the full bucket, and one token 100 s later).
    let charges = [charge(1.0, 0.01, 1.0)];
    let mut states = [None];
    let admitted = (0..20)
        .filter(|request| {
            let now = at(if request % 2 == 0 { 1000.0 } else { 1100.0 });
            run(&charges, &mut states, now).0
        })
        .count();
    assert_eq!(admitted, 2);
}

proptest! {
    /// Over any schedule, even one whose clock goes back and forth (a log read out of
    /// order, a clock stepped back), admitted cost never exceeds capacity + rate ×
    /// (latest − earliest moment seen).
    #[test]
    fn never_admits_more_than_capacity_plus_refill_in_any_order(
        capacity in 1u32..50,
        rate in 0.01f64..20.0,
        cost in 1u32..5,
        moments in proptest::collection::vec(0u64..20_000_000_000, 1..200),
    ) {
        let cost = cost.min(capacity) as f64;
        let charges = [charge(capacity as f64, rate, cost)];
        let mut states = [None];
        let mut admitted_cost = 0.0;
        let (mut earliest, mut latest) = (u64::MAX, 0);
        for moment in moments {
            earliest = earliest.min(moment);
            latest = latest.max(moment);
            if run(&charges, &mut states, Timestamp(moment)).0 {
                admitted_cost += cost;
            }
            let span = (latest - earliest) as f64 / SECOND as f64;
            let bound = capacity as f64 + rate * span;
            prop_assert!(admitted_cost <= bound + 1e-6, "{admitted_cost} > {bound}");
        }
    }

    /// Over any schedule, admitted cost never exceeds capacity + rate × elapsed.
    #[test]
    fn never_admits_more_than_capacity_plus_refill(
        capacity in 1u32..50,
        rate in 0.01f64..20.0,
        cost in 1u32..5,
        steps in proptest::collection::vec(0u64..2_000_000_000, 1..200),
    ) {
        let cost = cost.min(capacity) as f64;
        let charges = [charge(capacity as f64, rate, cost)];
        let mut states = [None];
        let mut now = 0u64;
        let mut admitted_cost = 0.0;
        for step in steps {
            now += step;
            if run(&charges, &mut states, Timestamp(now)).0 {
                admitted_cost += cost;
            }
            let bound = capacity as f64 + rate * now as f64 / SECOND as f64;
            prop_assert!(admitted_cost <= bound + 1e-6, "{admitted_cost} > {bound}");
        }
    }

    /// The announced wait is exact: refused just before it, admitted at it.
    #[test]
    fn announced_wait_is_exact(
        capacity in 1u32..50,
        rate in 0.01f64..20.0,
        cost in 1u32..50,
        spent in 0u32..50,
    ) {
        let cost = cost.min(capacity) as f64;
        let charges = [charge(capacity as f64, rate, cost)];
        let tokens = (capacity as f64 - spent as f64).max(0.0);
        let start = BucketState { tokens, updated: Timestamp(0) };
        let mut states = [Some(start)];
        let (admitted, verdicts) = run(&charges, &mut states, Timestamp(0));
        prop_assume!(!admitted);
        let wait = verdicts[0].wait;
        let mut before = [Some(start)];
        let early = Timestamp(0).after(wait * 0.999 - 1e-6);
        prop_assert!(!run(&charges, &mut before, early).0);
        let mut at_wait = [Some(start)];
        prop_assert!(run(&charges, &mut at_wait, Timestamp(0).after(wait)).0);
    }
}
