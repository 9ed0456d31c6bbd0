//! The decide phase: one decision for all of a request's buckets and concurrency slots, from
//! the store, or as the route's `on_store_failure` says when the store fails; counted in the
//! limits' metrics.

use smallvec::SmallVec;

use super::access_log::{self, Exchange};
use super::accounting::{self, BucketAccount};
use super::slots::{self, SlotRequests};
use super::{Buckets, Gateway};
use crate::config::StoreFailurePolicy;
use crate::limit::concurrency::{Leased, Leasing};
use crate::limit::redis::PendingSlotLeases;
use crate::limit::{clock, BucketRequest, Held, Store, StoreError, StoreVerdict};
use crate::metrics::Outcome;
use crate::reject::{Reject, Reports};
use crate::runtime::{AppliedLimit, ServedRoute};

/// A request its limits let through, and on what grounds.
pub(super) struct Admission<'r> {
    pub(super) outcome: Outcome,
    pub(super) decider: Decider,
    /// Seconds to hold the request for tokens it booked (`on_limit = "delay"`), and the
    /// route limits whose buckets the decision charged (their cost, zero too).
    pub(super) delay: f64,
    pub(super) charged: SmallVec<[&'r AppliedLimit; 4]>,
    /// The slots of its concurrency limits, held until its response ends.
    pub(super) slots: Option<Held>,
}

/// Which store took a request's decision (and so receives its response hooks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decider {
    Store,
    /// The in-process buckets of `on_store_failure = "local"`.
    Local,
    /// No bucket applied, or the store failed on an `allow` route.
    Nobody,
}

impl Gateway {
    /// One decision for all of the request's buckets and concurrency slots: from the store,
    /// or as the route's `on_store_failure` says when the store fails. Counts it in the
    /// limits' metrics.
    pub(super) async fn decide<'r>(
        &self,
        route: &'r ServedRoute,
        buckets: &Buckets<'r>,
        slot_requests: &SlotRequests<'r>,
        exchange: &mut Exchange<'_>,
        reports: &mut Reports<'r>,
    ) -> Result<Admission<'r>, Reject> {
        let refused = |exchange: &mut Exchange<'_>, reports: &Reports<'r>| {
            if access_log::enabled() {
                exchange.limit = Some(accounting::refusing(reports));
            }
            tracing::debug!(route = %route.route.name, limits = %accounting::refusing(reports), "refused");
            if accounting::banned(reports) {
                Reject::Banned
            } else {
                Reject::Limited
            }
        };
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
        let admitted_unlimited = |outcome, slots| Admission {
            outcome,
            decider: Decider::Nobody,
            delay: 0.0,
            charged: SmallVec::new(),
            slots,
        };
        if buckets.is_empty() && leases.is_none() {
            return Ok(admitted_unlimited(Outcome::Allowed, held));
        }
        let leasing = leases
            .as_ref()
            .map(|leases| leases.leasing(slot_requests.requests()));
        let decision = self.store_decision(buckets.requests(), leasing.as_ref());
        let (decision, decider) = match decision.await {
            Ok((decision, leased)) => {
                if let Some(leases) = leases {
                    held = slots::settle_leases(leases, leased, slot_requests, reports);
                }
                (decision, Decider::Store)
            }
            Err(error) => {
                if let (Some(leases), StoreError::Unavailable) = (leases, &error) {
                    leases.none_taken();
                }
                route.metrics.degraded.inc();
                match route.route.on_store_failure {
                    StoreFailurePolicy::Allow => {
                        return Ok(admitted_unlimited(Outcome::DegradedAllowed, held))
                    }
                    StoreFailurePolicy::Deny => return Err(Reject::StoreUnavailable),
                    StoreFailurePolicy::Local => {
                        if held.is_none() {
                            held = slots::take_local(&self.shared, slot_requests, reports)
                                .map_err(|_| refused(exchange, reports))?;
                        }
                        (self.shared.local.decide(buckets.requests()), Decider::Local)
                    }
                }
            }
        };
        admission(&decision, decider, buckets, held, reports)
            .ok_or_else(|| refused(exchange, reports))
    }

    /// The store's decision; a failure is timed, counted and logged here (an open circuit,
    /// which made no call, only timed).
    // Inlined into the request path as before the gRPC path shared it (1.9 % fewer
    // instructions per refusal than when called).
    #[inline(always)]
    pub(super) async fn store_decision(
        &self,
        buckets: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        let store = &self.shared.store;
        let calls = &self.shared.store_calls;
        let started = clock::instant();
        let result = match (store, leasing) {
            (Store::Redis(redis), Some(_)) => {
                Box::pin(redis.decide_leasing(buckets, leasing)).await
            }
            _ => store
                .decide(buckets)
                .await
                .map(|decision| (decision, Leased::NotTaken(None))),
        };
        calls
            .duration
            .observe(clock::elapsed(started).as_secs_f64());
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

/// What `decision` means for the request: each bucket's share recorded in its limit's metrics,
/// and the request's admission, or `None` when an enforcing limit refused it (its `slots` are
/// then given back).
fn admission<'r>(
    decision: &StoreVerdict,
    decider: Decider,
    buckets: &Buckets<'r>,
    slots: Option<Held>,
    reports: &mut Reports<'r>,
) -> Option<Admission<'r>> {
    let mut charged = SmallVec::new();
    let accounting = accounting::account(buckets.iter(), decision, reports, |share| {
        if share.paid {
            charged.push(share.limit);
        }
        record_share(share)
    });
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
pub(super) fn record_share(share: BucketAccount<&AppliedLimit>) {
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
