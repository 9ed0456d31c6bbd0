//! The delay phase (`on_limit = "delay"`): a request that booked tokens it lacked waits for
//! them before it goes upstream. Held, it counts as in flight; a client that leaves while held
//! (the request's future is dropped) gives back every token the request was charged.

use std::time::Duration;

use crate::limit::{BucketRequest, MemoryStore, OutcomeRequest, Store};
use crate::shared::Shared;

/// Tokens a held request was charged, given back unless it goes on.
struct Booked<'a> {
    store: Option<&'a MemoryStore>,
    refund: Vec<OutcomeRequest<'a>>,
}

impl Drop for Booked<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store {
            if !self.refund.is_empty() {
                store.record_outcomes(&self.refund);
            }
        }
    }
}

/// Holds the request `delay` seconds, the time its booked tokens take to come. `charged`
/// names the buckets (by their route limit) that the decision charged, all of which go back
/// if the request is dropped while held; `local`: the in-process buckets decided it.
pub(super) async fn hold(
    shared: &Shared,
    local: bool,
    buckets: &[BucketRequest<'_>],
    charged: &[usize],
    delay: f64,
) {
    let store = match &shared.store {
        _ if local => Some(&shared.local),
        Store::Memory(memory) => Some(memory),
        // Configuration keeps delays to the memory store.
        Store::Redis(_) => None,
    };
    let mut booked = Booked {
        store,
        refund: buckets
            .iter()
            .filter(|bucket| charged.contains(&bucket.route_limit))
            .map(|bucket| OutcomeRequest {
                key: bucket.key.clone(),
                charge: crate::limit::Charge {
                    cost: -bucket.charge.cost,
                    ..bucket.charge
                },
                adaptive: bucket.adaptive,
                error: false,
                route_limit: bucket.route_limit,
            })
            .collect(),
    };
    shared.metrics.delay_seconds.observe(delay);
    tokio::time::sleep(Duration::from_secs_f64(delay.clamp(0.0, 60.0))).await;
    // Waited out: the request goes on and keeps its tokens.
    booked.refund.clear();
}
