//! The slots phase: a request takes a slot of each of its route's concurrency limits, all or
//! none, before any token is charged; refused, it holds nothing and is charged nothing. On
//! the memory store the slots are this process's; on Redis they are leases every replica
//! shares, renewed while the request is in flight and given back when it ends.

use std::sync::Arc;

use smallvec::SmallVec;

use super::reject::{Reject, Reports};
use crate::config::StoreFailurePolicy;
use crate::limit::concurrency::{HeldSlots, SlotRequest};
use crate::limit::{RedisStore, Store, StoreError};
use crate::respond::LimitReport;
use crate::runtime::ServedRoute;
use crate::shared::Shared;

/// A request's slot requests, inline for the usual one or two.
pub(super) type SlotRequests = SmallVec<[SlotRequest; 2]>;

/// A request's slots, given back when dropped (with the response body that carries them).
#[derive(Debug)]
pub(crate) enum Held {
    Local(#[allow(dead_code)] HeldSlots),
    Leases(#[allow(dead_code)] Leases),
}

/// Takes the request's slots (`None` when its route has no concurrency limit that applies),
/// and reports each limit as the rate-limit headers tell it: `concurrency` slots, the free
/// ones after this request, a second until one may free up.
pub(super) async fn take<'r>(
    shared: &Arc<Shared>,
    route: &'r ServedRoute,
    requests: &[SlotRequest],
    reports: &mut Reports<'r>,
) -> Result<Option<Held>, Reject> {
    if requests.is_empty() {
        return Ok(None);
    }
    let taken = match &shared.store {
        Store::Redis(redis) => match take_leases(shared, redis, requests).await {
            Ok(taken) => taken.map(|(leases, free)| (Held::Leases(leases), free)),
            Err(error) => {
                route.metrics.degraded.inc();
                tracing::warn!(%error, "store call failed (concurrency slots)");
                match route.route.on_store_failure {
                    StoreFailurePolicy::Allow => return Ok(None),
                    StoreFailurePolicy::Deny => return Err(Reject::StoreUnavailable),
                    StoreFailurePolicy::Local => take_local(shared, requests),
                }
            }
        },
        Store::Memory(_) => take_local(shared, requests),
    };
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
    match taken {
        Ok((held, free)) => {
            for (request, free) in requests.iter().zip(free) {
                reports.push(report(request, free, false));
            }
            Ok(Some(held))
        }
        Err(index) => {
            let request = &requests[index];
            route.limits[request.route_limit].metrics.limited.inc();
            reports.push(report(request, 0, true));
            Err(Reject::Limited)
        }
    }
}

/// Slots free after this request, per request; or the index of the one that had none.
type Taken<T> = Result<(T, SmallVec<[u32; 2]>), usize>;

fn take_local(shared: &Shared, requests: &[SlotRequest]) -> Taken<Held> {
    shared
        .slots
        .acquire(requests)
        .map(|(held, free)| (Held::Local(held), free))
        .map_err(|refused| refused.index)
}

/// Leases of one request in Redis, renewed every third of a lease until dropped; dropping
/// gives them back.
pub(crate) struct Leases {
    shared: Arc<Shared>,
    id: String,
    keys: SmallVec<[(String, Option<prometheus::IntGauge>); 2]>,
    renewing: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("id", &self.id)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

async fn take_leases(
    shared: &Arc<Shared>,
    redis: &RedisStore,
    requests: &[SlotRequest],
) -> Result<Taken<Leases>, StoreError> {
    let mut leases = Leases {
        shared: shared.clone(),
        id: lease_id(),
        keys: SmallVec::new(),
        renewing: None,
    };
    let mut free = SmallVec::new();
    for (index, request) in requests.iter().enumerate() {
        let key = redis.slot_key(&request.key);
        // A refusal or failure here drops `leases`, which gives back what was taken.
        match redis.take_slot(&key, request.slots, &leases.id).await? {
            Some(in_use) => {
                free.push(request.slots.saturating_sub(in_use));
                if let Some(gauge) = &request.in_use {
                    gauge.inc();
                }
                leases.keys.push((key, request.in_use.clone()));
            }
            None => return Ok(Err(index)),
        }
    }
    let (renewer, id, keys) = (
        Arc::downgrade(shared),
        leases.id.clone(),
        leases
            .keys
            .iter()
            .map(|(key, _)| key.clone())
            .collect::<Vec<_>>(),
    );
    let every = redis.lease() / 3;
    leases.renewing = Some(
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = renewer.upgrade() else {
                    return;
                };
                if let Store::Redis(redis) = &shared.store {
                    for key in &keys {
                        if let Err(error) = redis.renew_slot(key, &id).await {
                            tracing::debug!(%error, "renewing a concurrency slot failed");
                        }
                    }
                }
            }
        })
        .abort_handle(),
    );
    Ok(Ok((leases, free)))
}

impl Drop for Leases {
    fn drop(&mut self) {
        if let Some(renewing) = &self.renewing {
            renewing.abort();
        }
        let keys = std::mem::take(&mut self.keys);
        if keys.is_empty() {
            return;
        }
        for (_, gauge) in &keys {
            if let Some(gauge) = gauge {
                gauge.dec();
            }
        }
        let (shared, id) = (self.shared.clone(), std::mem::take(&mut self.id));
        // Given back in the background: a drop cannot wait. Without a runtime (the process is
        // ending), the leases expire on their own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Store::Redis(redis) = &shared.store {
                    for (key, _) in &keys {
                        if let Err(error) = redis.give_back_slot(key, &id).await {
                            tracing::debug!(%error, "giving a concurrency slot back failed; it expires with its lease");
                        }
                    }
                }
            });
        }
    }
}

/// A lease's name in the sorted sets: random, so that no two requests of any replica share
/// one.
fn lease_id() -> String {
    let mut random = [0u8; 12];
    let _ = getrandom::getrandom(&mut random);
    let mut text = [0u8; 24];
    crate::hex::write_hex(&random, &mut text);
    String::from_utf8_lossy(&text).into_owned()
}
