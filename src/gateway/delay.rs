//! The delay phase (`on_limit = "delay"`): a request that booked tokens it lacked waits for
//! them before it goes upstream. Held, it counts as in flight; a client that leaves while held
//! (the request's future is dropped) gives back every token the request was charged.

use std::sync::Arc;
use std::time::Duration;

use super::applied;
use super::decide::{Admission, Decider};
use super::Buckets;
use crate::limit::{BucketRequest, MemoryStore, OutcomeRequest, RedisStore, Refund, Store};
use crate::shared::Shared;

/// Tokens a held request was charged, given back unless it goes on.
struct Booked<'a> {
    pending: Option<Pending<'a>>,
}

enum Pending<'a> {
    /// Charged in process memory (the memory store, or the local fallback): given back at once.
    Local(&'a MemoryStore, Vec<OutcomeRequest<'a>>),
    /// Charged in Redis: given back by a call in the background, as a drop cannot wait.
    Redis(Arc<RedisStore>, Refund),
}

impl Drop for Booked<'_> {
    fn drop(&mut self) {
        match self.pending.take() {
            Some(Pending::Local(store, refund)) => {
                store.record_outcomes(&refund);
            }
            Some(Pending::Redis(redis, refund)) => {
                // Without a runtime (the process is ending) the tokens refill on their own.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if let Err(error) = redis.give_back(refund).await {
                            tracing::debug!(%error, "giving a held request's tokens back failed");
                        }
                    });
                }
            }
            None => {}
        }
    }
}

/// Holds the request for its admission's delay, the time its booked tokens take to come.
/// Every bucket the decision charged gives its tokens back if the request is dropped while
/// held.
pub(crate) async fn hold(shared: &Arc<Shared>, buckets: &Buckets<'_>, admission: &Admission<'_>) {
    let (charged, delay) = (&admission.charged, admission.delay);
    let local = admission.decider == Decider::Local;
    let charged = buckets
        .iter()
        .filter(|(limit, _)| charged.iter().any(|charged| applied::same(charged, limit)))
        .map(|(_, bucket)| bucket);
    let pending = match &shared.store {
        Store::Redis(redis) if !local => Pending::Redis(redis.clone(), redis.refund_of(charged)),
        Store::Memory(memory) if !local => Pending::Local(memory, refunds(charged)),
        _ => Pending::Local(&shared.local, refunds(charged)),
    };
    let mut booked = Booked {
        pending: Some(pending),
    };
    shared.metrics.delay_seconds.observe(delay);
    tokio::time::sleep(Duration::from_secs_f64(delay.clamp(0.0, 60.0))).await;
    // Waited out: the request goes on and keeps its tokens.
    booked.pending = None;
}

/// Outcomes that give back each bucket's cost.
fn refunds<'a>(buckets: impl Iterator<Item = &'a BucketRequest<'a>>) -> Vec<OutcomeRequest<'a>> {
    buckets
        .map(|bucket| OutcomeRequest {
            key: bucket.key.clone(),
            charge: crate::limit::Charge {
                cost: -bucket.charge.cost,
                ..bucket.charge
            },
            adaptive: bucket.adaptive,
            error: false,
        })
        .collect()
}
