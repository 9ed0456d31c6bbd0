//! The slots phase: a request takes a slot of each of its route's concurrency limits, all or
//! none, before any token is charged; refused, it holds nothing and is charged nothing.

use std::sync::Arc;

use smallvec::SmallVec;

use super::reject::{Reject, Reports};
use crate::limit::concurrency::{HeldSlots, SlotRequest, Slots};
use crate::respond::LimitReport;
use crate::runtime::ServedRoute;

/// A request's slot requests, inline for the usual one or two.
pub(super) type SlotRequests = SmallVec<[SlotRequest; 2]>;

/// Takes the request's slots (`None` when its route has no concurrency limit that applies),
/// and reports each limit as the rate-limit headers tell it: `concurrency` slots, the free
/// ones after this request, a second until one may free up.
pub(super) fn take<'r>(
    slots: &Arc<Slots>,
    route: &'r ServedRoute,
    requests: &[SlotRequest],
    reports: &mut Reports<'r>,
) -> Result<Option<HeldSlots>, Reject> {
    if requests.is_empty() {
        return Ok(None);
    }
    let report = |request: &SlotRequest, free: u32, refused: bool| {
        let limit = &route.limits[request.route_limit].limit;
        let capacity = f64::from(request.slots);
        LimitReport {
            name: &limit.name,
            capacity,
            rate: capacity,
            cost: 1.0,
            tokens: f64::from(free),
            full_in: if free == request.slots { 0.0 } else { 1.0 },
            wait: if refused { 1.0 } else { 0.0 },
            refused,
        }
    };
    match slots.acquire(requests) {
        Ok((held, free)) => {
            for (request, free) in requests.iter().zip(free) {
                reports.push(report(request, free, false));
            }
            Ok(Some(held))
        }
        Err(refused) => {
            let request = &requests[refused.index];
            route.limits[request.route_limit].metrics.limited.inc();
            reports.push(report(request, 0, true));
            Err(Reject::Limited)
        }
    }
}
