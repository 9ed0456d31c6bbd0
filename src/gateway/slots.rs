//! The slots of a request's concurrency limits, taken all or none with its tokens: refused,
//! it holds nothing and is charged nothing. On the memory store the slots are this process's,
//! taken just before the buckets decide; on Redis they are leases every replica shares, taken
//! by the decision's own script call, renewed while the request is in flight and given back
//! when it ends.

use std::sync::Arc;

use smallvec::SmallVec;

use super::reject::{Reject, Reports};
use crate::limit::concurrency::{HeldSlots, Leased, Leasing, SlotRequest};
use crate::limit::{RedisStore, Store};
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

/// A limit's slots as the rate-limit headers tell them: `concurrency` slots, the free ones
/// after this request, a second until one may free up.
fn report<'r>(
    route: &'r ServedRoute,
    request: &SlotRequest,
    free: u32,
    refused: bool,
) -> LimitReport<'r> {
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
}

/// Reports the slots taken, or the limit that had none free (and counts its refusal).
fn settle<'r>(
    route: &'r ServedRoute,
    requests: &[SlotRequest],
    taken: Result<&[u32], usize>,
    reports: &mut Reports<'r>,
) {
    match taken {
        Ok(free) => {
            for (request, free) in requests.iter().zip(free) {
                reports.push(report(route, request, *free, false));
            }
        }
        Err(index) => {
            let request = &requests[index];
            route.limits[request.route_limit].metrics.limited.inc();
            reports.push(report(route, request, 0, true));
        }
    }
}

/// Takes the request's slots in this process (the memory store, or `on_store_failure =
/// "local"`): all or none; `None` when its route has no concurrency limit that applies.
pub(super) fn take_local<'r>(
    shared: &Shared,
    route: &'r ServedRoute,
    requests: &[SlotRequest],
    reports: &mut Reports<'r>,
) -> Result<Option<Held>, Reject> {
    if requests.is_empty() {
        return Ok(None);
    }
    match shared.slots.acquire(requests) {
        Ok((held, free)) => {
            settle(route, requests, Ok(&free), reports);
            Ok(Some(Held::Local(held)))
        }
        Err(refused) => {
            settle(route, requests, Err(refused.index), reports);
            Err(Reject::Limited)
        }
    }
}

/// Leases a decision is about to take in Redis. Until the decision says what became of them,
/// they may have been taken (a call given up on may still run): dropped unsettled, they are
/// given back.
pub(super) struct PendingLeases {
    shared: Arc<Shared>,
    name: String,
    keys: SmallVec<[String; 2]>,
    settled: bool,
}

impl PendingLeases {
    pub(super) fn new(
        shared: &Arc<Shared>,
        redis: &RedisStore,
        requests: &[SlotRequest],
    ) -> PendingLeases {
        PendingLeases {
            shared: shared.clone(),
            name: lease_name(),
            keys: requests
                .iter()
                .map(|request| redis.slot_key(&request.key))
                .collect(),
            settled: false,
        }
    }

    pub(super) fn leasing<'a>(&'a self, requests: &'a [SlotRequest]) -> Leasing<'a> {
        Leasing {
            name: &self.name,
            slots: requests,
        }
    }

    /// What the decision did with them: taken, they are held (and renewed) until dropped.
    pub(super) fn settle<'r>(
        mut self,
        leased: Leased,
        route: &'r ServedRoute,
        requests: &[SlotRequest],
        reports: &mut Reports<'r>,
    ) -> Option<Held> {
        self.settled = true;
        match leased {
            Leased::Taken(free) => {
                settle(route, requests, Ok(&free), reports);
                let keys = std::mem::take(&mut self.keys)
                    .into_iter()
                    .zip(requests)
                    .map(|(key, request)| {
                        if let Some(gauge) = &request.in_use {
                            gauge.inc();
                        }
                        (key, request.in_use.clone())
                    })
                    .collect();
                Some(Held::Leases(Leases::renewed(
                    &self.shared,
                    std::mem::take(&mut self.name),
                    keys,
                )))
            }
            Leased::NotTaken(refusing) => {
                if let Some(index) = refusing {
                    settle(route, requests, Err(index), reports);
                }
                None
            }
        }
    }

    /// No call was made (the circuit is open): nothing to give back.
    pub(super) fn not_sent(mut self) {
        self.settled = true;
    }
}

impl Drop for PendingLeases {
    fn drop(&mut self) {
        if !self.settled {
            give_back(
                self.shared.clone(),
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.keys),
            );
        }
    }
}

/// Gives a request's leases back in the background: a drop cannot wait. Without a runtime
/// (the process is ending), the leases expire on their own.
fn give_back(shared: Arc<Shared>, name: String, keys: impl IntoIterator<Item = String>) {
    let keys: SmallVec<[String; 2]> = keys.into_iter().collect();
    if keys.is_empty() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            if let Store::Redis(redis) = &shared.store {
                for key in &keys {
                    if let Err(error) = redis.give_back_slot(key, &name).await {
                        tracing::debug!(%error, "giving a concurrency slot back failed; it expires with its lease");
                    }
                }
            }
        });
    }
}

/// Leases of one request in Redis, renewed every third of a lease until dropped; dropping
/// gives them back.
pub(crate) struct Leases {
    shared: Arc<Shared>,
    name: String,
    keys: SmallVec<[(String, Option<prometheus::IntGauge>); 2]>,
    renewing: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("name", &self.name)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// Leases taken, renewed from now on by a task of their own.
    fn renewed(
        shared: &Arc<Shared>,
        name: String,
        keys: SmallVec<[(String, Option<prometheus::IntGauge>); 2]>,
    ) -> Leases {
        let Store::Redis(redis) = &shared.store else {
            unreachable!("leases are Redis's");
        };
        let every = redis.lease() / 3;
        let (renewer, renewed_name) = (Arc::downgrade(shared), name.clone());
        let renewed_keys: Vec<String> = keys.iter().map(|(key, _)| key.clone()).collect();
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = renewer.upgrade() else {
                    return;
                };
                if let Store::Redis(redis) = &shared.store {
                    for key in &renewed_keys {
                        if let Err(error) = redis.renew_slot(key, &renewed_name).await {
                            tracing::debug!(%error, "renewing a concurrency slot failed");
                        }
                    }
                }
            }
        })
        .abort_handle();
        Leases {
            shared: shared.clone(),
            name,
            keys,
            renewing,
        }
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.renewing.abort();
        let keys = std::mem::take(&mut self.keys);
        for gauge in keys.iter().filter_map(|(_, gauge)| gauge.as_ref()) {
            gauge.dec();
        }
        give_back(
            self.shared.clone(),
            std::mem::take(&mut self.name),
            keys.into_iter().map(|(key, _)| key),
        );
    }
}

/// A lease's name in the sorted sets: random, so that no two requests of any replica share
/// one.
fn lease_name() -> String {
    let mut random = [0u8; 12];
    let _ = getrandom::getrandom(&mut random);
    let mut text = [0u8; 24];
    crate::hex::write_hex(&random, &mut text);
    String::from_utf8_lossy(&text).into_owned()
}
