//! tollgate: a reverse-proxy gateway that enforces rate limits that actually hold.
//!
//! A request meets, in order: `server.rs` (listener, connection) → `gateway.rs` (the request
//! path) → `path.rs`, `route.rs`, `client_ip.rs`, `key.rs` (pure decisions about the request)
//! → `limit/` (buckets and their store) → `upstream.rs` (forwarding) → `respond.rs` (what the
//! gateway answers itself). `config/` compiles the policy file; `metrics.rs` and `admin.rs`
//! expose what happened.

mod acme;
pub mod admin;
mod background;
mod body;
pub mod client_ip;
pub mod config;
mod connection;
mod connection_limits;
pub mod decision;
pub mod demo;
mod errors;
pub mod gateway;
pub mod geoip;
pub mod grpc;
mod hex;
mod in_flight;
pub mod ja4;
pub mod jwt;
pub mod key;
pub mod limit;
pub mod metrics;
pub mod overload;
pub mod overrides;
pub mod path;
mod policy_file;
pub mod proxy_protocol;
pub mod reject;
pub mod replay;
mod request_body;
mod request_id;
pub mod respond;
pub mod route;
pub mod runtime;
pub mod scan;
pub mod server;
pub mod settle;
mod shared;
mod thread_slots;
pub mod tls;
pub mod top;
mod traces;
pub mod upstream;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::config::Policy;
use crate::limit::{Clock, RedisStore, Store};
use crate::shared::Shared;

pub use body::{Body, BoxError};
pub use errors::{ReloadError, StartError};
pub use request_id::RequestId;

/// How to start a gateway besides its policy.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The clock of the stores (the memory store's buckets, the local buckets, the Redis store's
    /// breaker and deny cache); monotonic unless a test injects a manual one.
    pub clock: Option<Clock>,
    /// The policy file, for reloads on SIGHUP and when it changes.
    pub config_path: Option<PathBuf>,
}

/// A running gateway: its listeners, its admin listener and its shared state.
/// How long the last spans may take to reach the collector at shutdown, at least.
const FLUSH_AT_LEAST: Duration = Duration::from_secs(1);

pub struct Tollgate {
    /// The bound public addresses (ephemeral ports resolved): TLS ones with `tls`.
    pub addresses: Vec<SocketAddr>,
    /// `plain_listen`'s bound addresses, beside TLS.
    pub plain_addresses: Vec<SocketAddr>,
    pub admin_address: SocketAddr,
    /// The bound decision listener's address, with `[decision]`.
    pub decision_address: Option<SocketAddr>,
    /// `[server.http3]`'s bound UDP addresses.
    pub http3_addresses: Vec<SocketAddr>,
    shared: Arc<Shared>,
    config_path: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    /// The accept loops: shutdown waits for them, so that no connection is accepted after it
    /// says so.
    listeners: TaskTracker,
    grace_period: Duration,
}

impl Tollgate {
    /// Binds every listener and starts serving `policy`.
    pub async fn start(policy: Policy, options: Options) -> Result<Tollgate, StartError> {
        let clock = options.clock.unwrap_or_else(Clock::monotonic);
        let shared = Arc::new(Shared::new(&policy, clock)?);
        if let Store::Redis(redis) = &shared.store {
            if redis.under_sentinel() {
                // The master before the first request; then followed through failovers.
                if let Err(error) = redis.find_master().await {
                    tracing::warn!(%error, "store: no master yet; decisions follow on_store_failure until one is found");
                }
                tokio::spawn(RedisStore::follow_master(Arc::downgrade(redis)));
            }
        }
        // The fleet's overrides, before the first request: a restart keeps them in force.
        if let Err(error) = shared.overrides.refresh().await {
            tracing::warn!(%error, "overrides not read from the store yet: they apply once it answers");
        }
        for warning in &policy.warnings {
            tracing::warn!("policy: {warning}");
        }

        let (shutdown, shutdown_signal) = watch::channel(false);
        let listeners = TaskTracker::new();
        let bound = server::listen(&policy, &shared, &listeners, &shutdown_signal).await?;
        let (admin_listener, admin_address) = server::bind(policy.admin.listen).await?;
        tracing::info!(address = %admin_address, "admin listening (/metrics, /healthz, /readyz)");
        // The admin listener is not tracked: it keeps answering /readyz 503 while draining.
        tokio::spawn(admin::serve(admin_listener, shared.clone()));

        if let Some(acme) = policy.server.tls.as_ref().and_then(|tls| tls.acme.as_ref()) {
            acme::start(&shared, acme);
        }
        background::spawn_load_ticker(Arc::downgrade(&shared));
        background::spawn_sweeper(Arc::downgrade(&shared));
        background::spawn_top_slots(Arc::downgrade(&shared));
        background::spawn_top_sender(Arc::downgrade(&shared));
        background::spawn_scans_follower(Arc::downgrade(&shared));
        background::spawn_store_probe(Arc::downgrade(&shared));
        background::spawn_overrides_follower(Arc::downgrade(&shared));
        if let Store::Redis(redis) = &shared.store {
            tokio::spawn(RedisStore::follow_resets(Arc::downgrade(redis)));
        }

        Ok(Tollgate {
            addresses: bound.proxy,
            plain_addresses: bound.plain,
            decision_address: bound.decision,
            http3_addresses: bound.http3,
            admin_address,
            grace_period: policy.server.grace_period,
            shared,
            config_path: options.config_path,
            shutdown,
            listeners,
        })
    }

    /// Replaces the policy for new requests. Buckets of limits whose definition did not change
    /// keep their state; redefined limits start fresh. Listener, admin and store settings
    /// need a restart.
    pub fn reload(&self, policy: Policy) -> Result<(), ReloadError> {
        let outcome = self.shared.swap_policy(policy);
        self.shared.metrics.config_reload(outcome.is_ok());
        match &outcome {
            Ok(()) => tracing::info!("configuration reloaded"),
            Err(error) => tracing::error!(
                "configuration reload refused, keeping the current policy:\n{error}"
            ),
        }
        outcome
    }

    /// Re-reads the policy file; an invalid file changes nothing (logged and counted).
    pub fn reload_from_file(&self) -> Result<(), ReloadError> {
        let Some(path) = &self.config_path else {
            return Ok(());
        };
        match Policy::load(path) {
            Ok(policy) => self.reload(policy),
            Err(errors) => {
                self.shared.metrics.config_reload(false);
                tracing::error!(
                    "configuration reload refused, keeping the current policy:\n{errors}"
                );
                Err(ReloadError::Invalid(errors))
            }
        }
    }

    /// Reloads whenever the policy file's content changes (polled; cheap).
    pub fn watch_config_file(self: &Arc<Self>) {
        if let Some(path) = self.config_path.clone() {
            let gateway: Arc<dyn background::ReloadsFromFile> = self.clone();
            background::spawn_config_watch(Arc::downgrade(&gateway), path);
        }
    }

    /// The current metrics in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.shared.metrics.render()
    }

    /// The Redis store (for tests and diagnostics).
    pub fn redis_store(&self) -> Option<&RedisStore> {
        match &self.shared.store {
            Store::Redis(store) => Some(store),
            Store::Memory(_) => None,
        }
    }

    /// Stops accepting, lets in-flight requests and upgraded connections finish for up to
    /// `grace_period`, and returns whether everything finished in time.
    pub async fn shutdown(&self) -> bool {
        let began = limit::clock::instant();
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        self.listeners.close();
        self.listeners.wait().await;
        tracing::info!("shutting down: no new connections; draining in-flight requests");
        self.shared.tasks.close();
        let drained = tokio::time::timeout(self.grace_period, self.shared.tasks.wait())
            .await
            .is_ok();
        if drained {
            tracing::info!("all connections drained");
        } else {
            tracing::warn!(grace_period = ?self.grace_period, "grace period over; closing remaining connections");
        }
        if let Some(traces) = &self.shared.traces {
            // What the grace period left, and a moment at least, for the last spans.
            let left = self
                .grace_period
                .saturating_sub(limit::clock::elapsed(began));
            traces.flush(left.max(FLUSH_AT_LEAST)).await;
        }
        drained
    }
}

impl background::ReloadsFromFile for Tollgate {
    fn reload_from_file(&self) {
        let _ = Tollgate::reload_from_file(self);
    }
}
