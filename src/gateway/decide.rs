//! The decide phase: one decision for all of a request's buckets and concurrency slots, from
//! the store, or as the limits' `on_store_failure` says when the store fails; counted in the
//! limits' metrics. The proxy's requests and those the decision service is asked about (by
//! forward-auth and by gRPC) are decided here alike.

use std::cell::Cell;
use std::sync::Arc;

use smallvec::SmallVec;

use super::access_log::{self, Exchange};
use super::accounting::{self, BucketAccount};
use super::slots;
use super::{Buckets, Gateway, Requested};
use crate::config::StoreFailurePolicy;
use crate::limit::concurrency::{Leased, Leasing};
use crate::limit::redis::PendingSlotLeases;
use crate::limit::{clock, BucketRequest, Held, Reading, Store, StoreError, StoreVerdict};
use crate::metrics::{Outcome, SharedIntCounter};
use crate::reject::{banned, refusing, Reject, Reports};
use crate::runtime::{AppliedLimit, ServedRoute};
use crate::top::{self, TopKeys};

/// A request its limits let through, and on what grounds.
pub(crate) struct Admission<'r> {
    pub(crate) outcome: Outcome,
    pub(crate) decider: Decider,
    /// Seconds to hold the request for tokens it booked (`on_limit = "delay"`), and the
    /// route limits whose buckets the decision charged (their cost, zero too).
    pub(crate) delay: f64,
    pub(crate) charged: SmallVec<[&'r AppliedLimit; 4]>,
    /// The slots of its concurrency limits, held until its response ends (boxed: the
    /// admission of every request is moved, and few hold slots).
    pub(crate) slots: Option<Box<Held>>,
}

/// Which store took a request's decision (and so receives its response hooks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decider {
    Store,
    /// The in-process buckets of `on_store_failure = "local"`.
    Local,
    /// No bucket applied, or the store failed on an `allow` route.
    Nobody,
}

/// Told each observed bucket's share of a decision, with the bucket's position among the
/// request's buckets: what a gRPC answer says of each descriptor.
pub(crate) trait Observer<'r> {
    fn observe(&mut self, position: usize, share: &BucketAccount<&'r AppliedLimit>);
}

/// The proxy's requests: their shares go to the metrics only.
pub(crate) struct NoObserver;

impl Observer<'_> for NoObserver {
    #[inline(always)]
    fn observe(&mut self, _: usize, _: &BucketAccount<&AppliedLimit>) {}
}

impl<'r, F: FnMut(usize, &BucketAccount<&'r AppliedLimit>)> Observer<'r> for F {
    fn observe(&mut self, position: usize, share: &BucketAccount<&'r AppliedLimit>) {
        self(position, share)
    }
}

impl Gateway {
    /// One decision for all of the request's buckets and concurrency slots: from the store,
    /// or, when the store fails, as the limits' `on_store_failure` says. Counts it in the
    /// limits' metrics; `route` names the route in the log.
    pub(crate) async fn decide<'r>(
        &self,
        route: &str,
        requested: &Requested<'r>,
        exchange: &mut Exchange<'_>,
        reports: &mut Reports<'r>,
        mut observer: impl Observer<'r>,
    ) -> Result<Admission<'r>, Reject> {
        let Requested {
            buckets,
            slots: slot_requests,
            overridden,
            scan_key: _,
        } = requested;
        if access_log::enabled() {
            exchange.keys = Some(access_log::keys(buckets.requests()));
            if !overridden.is_empty() {
                exchange.overridden = Some(overridden.join(","));
            }
        }
        let refused =
            |exchange: &mut Exchange<'_>, reports: &Reports<'r>| refusal(route, exchange, reports);
        // On Redis, slots are leases the decision's call takes; otherwise this process's,
        // taken first (a request refused by one is charged no token, and one refused by a
        // bucket gives its slots back, dropped with `slots`).
        let leases = match &self.shared.store {
            Store::Redis(redis) if !slot_requests.is_empty() => {
                Some(PendingSlotLeases::new(redis, slot_requests.requests()))
            }
            _ => None,
        };
        let mut held = match leases {
            Some(_) => None,
            None => slots::take_local(&self.shared, slot_requests, reports)
                .map_err(|_| refused(exchange, reports))?,
        };
        if buckets.is_empty() && leases.is_none() {
            return Ok(Admission::unlimited(Outcome::Allowed, held));
        }
        let leasing = leases
            .as_ref()
            .map(|leases| leases.leasing(slot_requests.requests()));
        let decision = self.store_decision(buckets.requests(), leasing.as_ref(), &exchange.now);
        let store_span =
            (exchange.trace.as_ref()).and_then(|trace| trace.store(self.shared.store.backend()));
        let decision = decision.await;
        if let (Some(span), Err(error)) = (&store_span, &decision) {
            span.failed(error);
        }
        drop(store_span);
        let (decision, decided, decider) = match decision {
            Ok((decision, leased)) => {
                if let Some(leases) = leases {
                    let top = &self.shared.metrics.top;
                    held = slots::settle_leases(leases, leased, slot_requests, reports, top);
                }
                (decision, None, Decider::Store)
            }
            Err(error) => {
                if let (Some(leases), StoreError::Unavailable) = (leases, &error) {
                    leases.none_taken();
                }
                count_degraded(requested);
                match in_force(requested) {
                    StoreFailurePolicy::Allow => {
                        return Ok(Admission::unlimited(Outcome::DegradedAllowed, held))
                    }
                    StoreFailurePolicy::Deny => return Err(Reject::StoreUnavailable),
                    StoreFailurePolicy::Local => {
                        if held.is_none() {
                            held = slots::take_local(&self.shared, slot_requests, reports)
                                .map_err(|_| refused(exchange, reports))?;
                        }
                        let local = local_buckets(buckets);
                        (
                            self.shared.local.decide(local.requests()),
                            Some(local),
                            Decider::Local,
                        )
                    }
                }
            }
        };
        let decided = decided.as_ref().unwrap_or(buckets);
        let top = &self.shared.metrics.top;
        admission(
            &decision,
            decider,
            decided,
            held,
            reports,
            &mut observer,
            top,
        )
        .ok_or_else(|| refused(exchange, reports))
    }

    /// The store's decision, at `now` for the memory store; timed (the memory store's one
    /// call in [`MEMORY_TIMED_EVERY`]), and a failure counted and logged here (an open circuit,
    /// which made no call, only timed).
    // Inlined into the request path (1.9 % fewer instructions per refusal than when called).
    #[inline(always)]
    async fn store_decision(
        &self,
        buckets: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        now: &Reading,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        let store = &self.shared.store;
        let calls = &self.shared.store_calls;
        let timed = !matches!(store, Store::Memory(_)) || memory_call_timed();
        let started = timed.then(clock::instant);
        let result = match (store, leasing) {
            (Store::Redis(redis), Some(_)) => {
                Box::pin(redis.decide_leasing(buckets, leasing)).await
            }
            _ => store
                .decide(buckets, now)
                .await
                .map(|decision| (decision, Leased::NotTaken(None))),
        };
        if let Some(started) = started {
            calls
                .duration
                .observe(clock::elapsed(started).as_secs_f64());
        }
        match &result {
            Err(StoreError::Unavailable) | Ok(_) => {}
            Err(error) => {
                calls.errors.inc();
                tracing::warn!(backend = store.backend(), %error, "store call failed");
            }
        }
        result
    }
}

/// A refusal by the limits, logged (at debug level: metrics count refusals) and named in the
/// access log: a ban's, or a bucket's.
/// The memory store's decisions are timed one in this many per thread (the first of each):
/// they take a microsecond, far below the histogram's first bound, and timing each would add
/// two clock reads to a refusal's one.
const MEMORY_TIMED_EVERY: u32 = 64;

/// Whether this thread's next memory-store decision is one of those timed.
fn memory_call_timed() -> bool {
    thread_local! {
        static CALLS: Cell<u32> = const { Cell::new(0) };
    }
    CALLS.with(|calls| {
        let count = calls.get();
        calls.set((count + 1) % MEMORY_TIMED_EVERY);
        count == 0
    })
}

fn refusal(route: &str, exchange: &mut Exchange<'_>, reports: &Reports<'_>) -> Reject {
    if access_log::enabled() {
        exchange.limit = Some(refusing(reports));
    }
    tracing::debug!(route, limits = %refusing(reports), "refused");
    if banned(reports) {
        Reject::Banned
    } else {
        Reject::Limited
    }
}

impl<'r> Admission<'r> {
    /// Counts the request as admitted with its outcome until it is answered (a client that
    /// leaves before then is counted so on drop).
    pub(crate) fn count_in(&self, route: &'r ServedRoute, exchange: &mut Exchange<'r>) {
        exchange.outcome = Some(self.outcome);
        exchange.admitted_as = Some(route.metrics.outcome(self.outcome));
    }

    /// Admitted without a bucket's word: none applied, or the store failed and the limits
    /// allow.
    fn unlimited(outcome: Outcome, slots: Option<Box<Held>>) -> Self {
        Admission {
            outcome,
            decider: Decider::Nobody,
            delay: 0.0,
            charged: SmallVec::new(),
            slots,
        }
    }
}

/// What the limits of a request say to do without the store: `deny` if any of them says so
/// (503), else `local` if any does (in-process buckets decide those limits), else `allow`. A
/// route's limits all say what the route says; a gRPC call's each say their rule's.
fn in_force(requested: &Requested<'_>) -> StoreFailurePolicy {
    let policies = || {
        let buckets = requested.buckets.iter().map(|(limit, _)| limit);
        buckets.chain(requested.slots.iter().map(|(limit, _)| limit))
    };
    let says = |policy| policies().any(|limit| limit.on_store_failure == policy);
    if says(StoreFailurePolicy::Deny) {
        StoreFailurePolicy::Deny
    } else if says(StoreFailurePolicy::Local) {
        StoreFailurePolicy::Local
    } else {
        StoreFailurePolicy::Allow
    }
}

/// Counts a decision taken without the store, once for each of its limits' counters (a
/// route's limits share the route's).
fn count_degraded(requested: &Requested<'_>) {
    let mut counted: SmallVec<[&Arc<SharedIntCounter>; 4]> = SmallVec::new();
    let buckets = requested.buckets.iter().map(|(limit, _)| limit);
    for limit in buckets.chain(requested.slots.iter().map(|(limit, _)| limit)) {
        if !counted
            .iter()
            .any(|seen| Arc::ptr_eq(seen, &limit.degraded))
        {
            limit.degraded.inc();
            counted.push(&limit.degraded);
        }
    }
}

/// The buckets of limits that say `local`: the in-process buckets decide them.
fn local_buckets<'r>(buckets: &Buckets<'r>) -> Buckets<'r> {
    let mut local = Buckets::new();
    for (limit, bucket) in buckets.iter() {
        if limit.on_store_failure == StoreFailurePolicy::Local {
            local.push(limit, bucket.clone());
        }
    }
    local
}

/// What `decision` means for the request: each bucket's share recorded in its limit's metrics,
/// and the request's admission, or `None` when an enforcing limit refused it (its `slots` are
/// then given back).
fn admission<'r>(
    decision: &StoreVerdict,
    decider: Decider,
    buckets: &Buckets<'r>,
    slots: Option<Box<Held>>,
    reports: &mut Reports<'r>,
    observer: &mut impl Observer<'r>,
    top: &TopKeys,
) -> Option<Admission<'r>> {
    let mut charged = SmallVec::new();
    let mut top_shares: SmallVec<[top::Share<'_>; 4]> = SmallVec::new();
    let requests = buckets.requests();
    let accounting = accounting::account(buckets.iter(), decision, reports, |share| {
        if share.paid {
            charged.push(share.limit);
        }
        observer.observe(share.position, &share);
        if let Some(id) = share.limit.metrics.top {
            top_shares.push(top::Share {
                id,
                key: &requests[share.position].key.parts,
                charged: share.charged,
                refused: share.refused,
            });
        }
        record_share(share)
    });
    top.record(&top_shares);
    if !accounting.admitted {
        return None;
    }
    let outcome = match decider {
        Decider::Local => Outcome::DegradedAllowed,
        _ if accounting.shadow_refused => Outcome::ShadowLimited,
        _ => Outcome::Allowed,
    };
    Some(Admission {
        outcome,
        decider,
        delay: accounting.delay,
        charged,
        slots,
    })
}

/// Records a bucket's share of a decision in the metrics of its limit.
#[inline(always)]
fn record_share(share: BucketAccount<&AppliedLimit>) {
    let metrics = &share.limit.metrics;
    metrics.fill_ratio.observe(share.fill_ratio);
    if share.charged > 0.0 {
        metrics.tokens_consumed.inc_by(share.charged);
    }
    if share.refused {
        metrics.limited.inc();
    }
    if let (true, Some(bans)) = (share.ban_began, &metrics.bans) {
        bans.inc();
    }
    if share.delayed {
        if let Some(delayed) = &metrics.delayed {
            delayed.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_times_the_first_of_each_run_of_its_memory_store_decisions() {
        let timed = std::thread::spawn(|| {
            (0..200)
                .filter(|_| memory_call_timed())
                .collect::<Vec<u32>>()
        })
        .join()
        .unwrap();
        assert_eq!(timed, [0, 64, 128, 192]);
    }
}
