//! The slots of a request's concurrency limits, taken all or none with its tokens: refused,
//! it holds nothing and is charged nothing. On the memory store the slots are this process's,
//! taken just before the buckets decide; on Redis they are leases every replica shares, taken
//! by the decision's own script call, renewed while the request is in flight and given back
//! when it ends.

use super::applied::Applied;
use crate::limit::concurrency::{Leased, SlotRequest};
use crate::limit::redis::PendingSlotLeases;
use crate::limit::Held;
use crate::reject::{LimitReport, Reject, Reports};
use crate::runtime::AppliedLimit;
use crate::shared::Shared;
use crate::top::{Share, TopKeys};

/// A request's slot requests, each with its route limit.
pub(crate) type SlotRequests<'r> = Applied<'r, SlotRequest>;

/// A limit's slots as the rate-limit headers tell them: `concurrency` slots, the free ones
/// after this request, a second until one may free up.
fn report<'r>(
    limit: &'r AppliedLimit,
    request: &SlotRequest,
    free: u32,
    refused: bool,
) -> LimitReport<'r> {
    let capacity = f64::from(request.slots);
    LimitReport {
        name: &limit.limit.name,
        capacity,
        rate: capacity,
        cost: 1.0,
        tokens: f64::from(free),
        full_in: if free == request.slots { 0.0 } else { 1.0 },
        wait: if refused { 1.0 } else { 0.0 },
        refused,
        banned: false,
    }
}

/// Reports the slots taken, or the limit that had none free (and counts its refusal, in its
/// metrics and its top keys).
fn settle<'r>(
    requests: &SlotRequests<'r>,
    taken: Result<&[u32], usize>,
    reports: &mut Reports<'r>,
    top: &TopKeys,
) {
    match taken {
        Ok(free) => {
            for ((limit, request), free) in requests.iter().zip(free) {
                reports.push(report(limit, request, *free, false));
            }
        }
        Err(index) => {
            if let Some((limit, request)) = requests.iter().nth(index) {
                limit.metrics.limited.inc();
                if let Some(id) = limit.metrics.top {
                    let key = &request.key.parts;
                    top.record(&[Share {
                        id,
                        key,
                        charged: 0.0,
                        refused: true,
                    }]);
                }
                reports.push(report(limit, request, 0, true));
            }
        }
    }
}

/// Takes the request's slots in this process (the memory store, or `on_store_failure =
/// "local"`): all or none; `None` when its route has no concurrency limit that applies.
pub(crate) fn take_local<'r>(
    shared: &Shared,
    requests: &SlotRequests<'r>,
    reports: &mut Reports<'r>,
) -> Result<Option<Box<Held>>, Reject> {
    if requests.is_empty() {
        return Ok(None);
    }
    match shared.slots.acquire(requests.requests()) {
        Ok((held, free)) => {
            settle(requests, Ok(&free), reports, &shared.metrics.top);
            Ok(Some(Box::new(Held::Local(held))))
        }
        Err(refused) => {
            settle(requests, Err(refused.index), reports, &shared.metrics.top);
            Err(Reject::Limited)
        }
    }
}

/// Reports what the decision did with a request's pending leases, and holds them if it took
/// them.
pub(crate) fn settle_leases<'r>(
    pending: PendingSlotLeases,
    leased: Leased,
    requests: &SlotRequests<'r>,
    reports: &mut Reports<'r>,
    top: &TopKeys,
) -> Option<Box<Held>> {
    match leased {
        Leased::Taken(free) => {
            settle(requests, Ok(&free), reports, top);
            Some(Box::new(Held::Leases(pending.taken(requests.requests()))))
        }
        Leased::NotTaken(refusing) => {
            pending.none_taken();
            if let Some(index) = refusing {
                settle(requests, Err(index), reports, top);
            }
            None
        }
    }
}
