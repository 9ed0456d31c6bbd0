//! Background tasks of a running gateway: the overload factor's ticker, the sweep of idle
//! buckets, and the watch on the policy file. Each holds the gateway weakly and ends with it.

use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

use crate::limit::{clock, Store};
use crate::shared::Shared;

/// Recomputes the overload factor every 100 ms.
pub(crate) fn spawn_load_ticker(shared: Weak<Shared>) {
    tokio::spawn(async move {
        let period = Duration::from_millis(100);
        let mut interval = tokio::time::interval(period);
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let runtime = shared.runtime.load();
            let factor = shared
                .load
                .tick(runtime.policy.overload.as_ref(), period.as_secs_f64());
            shared.metrics.load_factor.set(factor);
        }
    });
}

/// Drops state that carries no information any more (full buckets, networks with no
/// connection open whose bucket of new connections refilled) every 5 s.
pub(crate) fn spawn_sweeper(shared: Weak<Shared>) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(5));
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            shared.store.sweep();
            shared.local.sweep();
            let runtime = shared.runtime.load();
            shared.connections.sweep(&runtime.policy.server.connections);
        }
    });
}

/// Closes top keys' ten-second slots, and snapshots each route's outcomes for `/top/routes`.
pub(crate) fn spawn_top_slots(shared: Weak<Shared>) {
    tokio::spawn(async move {
        let period = Duration::from_secs(crate::top::windows::SLOT_SECONDS);
        let mut interval = tokio::time::interval(period);
        interval.tick().await;
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            shared.metrics.top.close_slot();
            shared
                .route_history
                .close_slot(shared.metrics.route_outcomes());
        }
    });
}

/// A periodic call's failures, logged once per streak of them (the store's own errors say the
/// rest).
#[derive(Default)]
struct FailureStreak {
    failing: bool,
}

impl FailureStreak {
    fn log<E: std::fmt::Display>(&mut self, result: Result<(), E>, what: &str) {
        match result {
            Ok(()) => self.failing = false,
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(%error, "{what}");
            }
            Err(_) => {}
        }
    }
}

/// With Redis, sends this replica's top keys to the fleet every second (while `[top]` is on
/// and something was counted).
pub(crate) fn spawn_top_sender(shared: Weak<Shared>) {
    use crate::top::fleet::VIEW_TTL_MS;
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(1));
        let mut failures = FailureStreak::default();
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let (Store::Redis(redis), true) = (&shared.store, shared.metrics.top.capacity() > 0)
            else {
                continue;
            };
            let limits: Vec<_> = (shared.runtime.load().policy.limits.iter())
                .map(|limit| limit.name.clone())
                .collect();
            let top = &shared.metrics.top;
            let view = top.view(&limits);
            if view.limits.is_empty() {
                continue;
            }
            let text = serde_json::to_string(&view).unwrap_or_default();
            let sent = redis.send_top(top.replica(), &text, VIEW_TTL_MS).await;
            failures.log(sent, "top keys not sent to the fleet");
        }
    });
}

/// `[scan]`'s table every second: the fleet's read again when it moved, records past the
/// hour dropped, keys with no recent path forgotten.
pub(crate) fn spawn_scans_follower(shared: Weak<Shared>) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(1));
        let mut failures = FailureStreak::default();
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let runtime = shared.runtime.load_full();
            if runtime.policy.scan.is_none() {
                continue;
            }
            let refreshed = shared.scans.refresh(runtime.policy.scan.as_deref()).await;
            failures.log(
                refreshed,
                "scans not read from the store: bans of other replicas wait",
            );
        }
    });
}

/// Reads the fleet's overrides again when another replica announces a change (with Redis),
/// every 250 ms while this replica cannot hear announcements, and every 10 s in any case; drops
/// the overrides that ended every second.
pub(crate) fn spawn_overrides_follower(shared: Weak<Shared>) {
    const TICK: Duration = Duration::from_millis(250);
    const SURE_POLL: Duration = Duration::from_secs(10);
    tokio::spawn(async move {
        let (mut polled, mut expired) = (clock::instant(), clock::instant());
        loop {
            let Some(store) = shared
                .upgrade()
                .map(|shared| shared.overrides.fleet_store().cloned())
            else {
                break;
            };
            let told = match &store {
                Some(store) => tokio::time::timeout(TICK, store.overrides_changed())
                    .await
                    .is_ok(),
                None => {
                    tokio::time::sleep(TICK).await;
                    false
                }
            };
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let deaf = store.as_ref().is_some_and(|store| !store.hears_resets());
            if told || deaf || clock::elapsed(polled) >= SURE_POLL {
                polled = clock::instant();
                if let Err(error) = shared.overrides.refresh().await {
                    tracing::debug!(%error, "overrides not read from the store this time");
                }
            }
            if clock::elapsed(expired) >= Duration::from_secs(1) {
                expired = clock::instant();
                shared.overrides.expire().await;
            }
        }
    });
}

/// While the Redis store's circuit is open, checks every 250 ms whether Redis answers again.
pub(crate) fn spawn_store_probe(shared: Weak<Shared>) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(250));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let Some(shared) = shared.upgrade() else {
                break;
            };
            if let Store::Redis(store) = &shared.store {
                store.probe_if_open().await;
            }
        }
    });
}

/// What reloads its policy from its file (a running gateway).
pub(crate) trait ReloadsFromFile: Send + Sync + 'static {
    fn reload_from_file(&self);
}

/// Reloads whenever the policy file's content changes (polled every 2 s; cheap), until the
/// gateway is gone.
pub(crate) fn spawn_config_watch(gateway: Weak<dyn ReloadsFromFile>, path: PathBuf) {
    tokio::spawn(async move {
        let mut last = std::fs::read(&path).ok();
        let mut interval = tokio::time::interval(Duration::from_secs(2));
        loop {
            interval.tick().await;
            let Some(gateway) = gateway.upgrade() else {
                break;
            };
            let current = std::fs::read(&path).ok();
            if current.is_some() && current != last {
                last = current;
                tracing::info!(path = %path.display(), "policy file changed");
                gateway.reload_from_file();
            }
        }
    });
}
