//! tollgate: a reverse-proxy gateway that enforces rate limits that actually hold.
//!
//! A request meets, in order: `server.rs` (listener, connection) → `gateway.rs` (the request
//! path) → `path.rs`, `route.rs`, `client_ip.rs`, `key.rs` (pure decisions about the request)
//! → `limit/` (buckets and their store) → `upstream.rs` (forwarding) → `respond.rs` (what the
//! gateway answers itself). `config/` compiles the policy file; `metrics.rs` and `admin.rs`
//! expose what happened.

pub mod admin;
mod body;
pub mod client_ip;
pub mod config;
pub mod demo;
pub mod gateway;
mod header_maps;
mod header_names;
pub mod key;
pub mod limit;
pub mod metrics;
pub mod overload;
pub mod path;
pub mod respond;
pub mod route;
pub mod server;
pub mod tls;
pub mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use http::HeaderValue;
use metrics::Histogram;
use prometheus::IntCounter;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use crate::client_ip::TrustWarning;
use crate::config::{ConfigErrors, Policy};
use crate::gateway::Gateway;
use crate::key::KeyHasher;
use crate::limit::{Clock, MemoryStore, RedisStore, Store, StoreError};
use crate::metrics::{Metrics, RouteMetrics};
use crate::overload::LoadMonitor;
use crate::upstream::UpstreamPool;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub use body::Body;

/// Everything a request reads that a reload replaces at once: requests in flight keep the
/// `Runtime` they started with.
#[derive(Debug)]
pub struct Runtime {
    pub policy: Policy,
    pub upstreams: Vec<UpstreamPool>,
    /// Metric handles per route, in route order.
    pub metrics: Vec<RouteMetrics>,
    /// Some route matches on the host.
    pub matches_hosts: bool,
}

impl Runtime {
    fn new(policy: Policy, metrics: &Metrics) -> Result<Runtime, String> {
        Ok(Runtime {
            upstreams: policy
                .upstreams
                .iter()
                .map(UpstreamPool::new)
                .collect::<Result<_, _>>()?,
            metrics: metrics.for_policy(&policy),
            matches_hosts: policy.routes.iter().any(|route| route.host.is_some()),
            policy,
        })
    }
}

/// How many short chains are counted between checks of whether they are routine.
const SHORT_CHAIN_SAMPLE: u64 = 50;

/// State that lives as long as the process, shared by every connection.
pub(crate) struct Shared {
    pub(crate) runtime: ArcSwap<Runtime>,
    pub(crate) store: Store,
    /// In-process buckets for routes with `on_store_failure = "local"`.
    pub(crate) local: MemoryStore,
    pub(crate) hasher: KeyHasher,
    pub(crate) metrics: Metrics,
    pub(crate) store_metrics: (Histogram, IntCounter),
    warned: [AtomicBool; 3],
    pub(crate) shutting_down: AtomicBool,
    /// Upstream load and the factor it puts on every rate (`[overload]`).
    pub(crate) load: LoadMonitor,
    /// The listeners' TLS configuration; replaced on reload (certificates are re-read).
    pub(crate) tls: ArcSwapOption<TlsAcceptor>,
    /// Connections and upgraded streams: shutdown waits for them.
    pub(crate) tasks: TaskTracker,
    /// The first 16 of a generated request id's 32 hex digits, random per process.
    request_id_prefix: [u8; 16],
    request_counter: AtomicU64,
}

impl Shared {
    /// Counts a trust warning, and logs it once per cause. A chain shorter than
    /// `trusted_hops` is logged only once it is routine (at least a tenth of the requests, seen
    /// 50 times): a load balancer's own health checks carry no forwarding header.
    pub(crate) fn trust_warning(&self, warning: TrustWarning) {
        let seen = self.metrics.client_ip_warning(warning);
        let index = TrustWarning::ALL
            .iter()
            .position(|w| *w == warning)
            .unwrap_or_default();
        if self.warned[index].load(Ordering::Relaxed) {
            return;
        }
        if warning == TrustWarning::ChainShorterThanTrustedHops
            && (seen % SHORT_CHAIN_SAMPLE != 0 || seen * 10 < self.metrics.total_requests())
        {
            return;
        }
        if !self.warned[index].swap(true, Ordering::Relaxed) {
            tracing::warn!(cause = warning.as_str(), "{}", warning.explanation());
        }
    }

    /// The client's `X-Request-Id` if it is reasonable, else a new one.
    pub(crate) fn request_id(&self, client: Option<&HeaderValue>) -> RequestId {
        if let Some(id) = client {
            if !id.is_empty() && id.len() <= 128 && id.to_str().is_ok() {
                return RequestId::Client(id.clone());
            }
        }
        let sequence = self.request_counter.fetch_add(1, Ordering::Relaxed);
        let mut hex = [0u8; 32];
        hex[..16].copy_from_slice(&self.request_id_prefix);
        write_hex(&sequence.to_be_bytes(), &mut hex[16..]);
        RequestId::Made(hex)
    }
}

/// A request's `X-Request-Id`: the client's, or one made here, kept inline (a header value
/// would cost an allocation per request, and another at its first clone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestId {
    /// Visible ASCII, at most 128 bytes.
    Client(HeaderValue),
    /// 32 lower-case hexadecimal digits.
    Made([u8; 32]),
}

impl RequestId {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Client(value) => value.as_bytes(),
            RequestId::Made(digits) => digits,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub fn to_header_value(&self) -> HeaderValue {
        match self {
            RequestId::Client(value) => value.clone(),
            RequestId::Made(digits) => {
                HeaderValue::from_bytes(digits).unwrap_or_else(|_| HeaderValue::from_static("-"))
            }
        }
    }
}

/// One header field, `name: value` and its line end, into an HTTP/1.1 head.
pub(crate) fn write_header_field(out: &mut bytes::BytesMut, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `bytes` in lower-case hexadecimal, two digits per byte, into `digits`.
pub(crate) fn write_hex(bytes: &[u8], digits: &mut [u8]) {
    // Both digits of a byte in one look-up: request ids and hashed keys are spelled per request.
    const PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut byte = 0;
        while byte < 256 {
            pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
            byte += 1;
        }
        pairs
    };
    for (pair, byte) in digits.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(*byte)]);
    }
}

/// How to start a gateway besides its policy.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The clock of the memory store; monotonic unless a test injects a manual one.
    pub clock: Option<Clock>,
    /// The policy file, for reloads on SIGHUP and when it changes.
    pub config_path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("TLS: {0}")]
    Tls(String),
    #[error("upstream client: {0}")]
    Upstream(String),
    #[error("cannot set up the store: {0}")]
    Store(StoreError),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Invalid(ConfigErrors),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("upstream client: {0}")]
    Upstream(String),
}

/// A running gateway: its listeners, its admin listener and its shared state.
pub struct Tollgate {
    /// The bound public addresses (ephemeral ports resolved).
    pub addresses: Vec<SocketAddr>,
    pub admin_address: SocketAddr,
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
        let hasher = match &policy.store.hash_key {
            Some(secret) => KeyHasher::from_secret(secret.as_bytes()),
            None => KeyHasher::random(),
        };
        let metrics = Metrics::new();
        let store = match &policy.store.redis {
            Some(settings) => Store::Redis(Box::new(
                RedisStore::new(settings, Clock::monotonic())
                    .map_err(StartError::Store)?
                    .observing_batches(metrics.store_batches("redis")),
            )),
            None => Store::Memory(MemoryStore::new(policy.store.max_keys, clock.clone())),
        };
        let mut prefix = [0u8; 8];
        let _ = getrandom::getrandom(&mut prefix);
        let shared = Arc::new(Shared {
            store_metrics: metrics.store_call(store.backend()),
            store,
            local: MemoryStore::new(policy.store.max_keys, clock),
            hasher,
            runtime: ArcSwap::from_pointee(
                Runtime::new(policy.clone(), &metrics).map_err(StartError::Upstream)?,
            ),
            metrics,
            warned: Default::default(),
            shutting_down: AtomicBool::new(false),
            load: LoadMonitor::default(),
            tls: ArcSwapOption::from(
                tls_acceptor(&policy)
                    .map_err(StartError::Tls)?
                    .map(Arc::new),
            ),
            tasks: TaskTracker::new(),
            request_id_prefix: {
                let mut digits = [0u8; 16];
                write_hex(&prefix, &mut digits);
                digits
            },
            request_counter: AtomicU64::new(0),
        });
        for warning in &policy.warnings {
            tracing::warn!("policy: {warning}");
        }

        let (shutdown, shutdown_signal) = watch::channel(false);
        let listeners = TaskTracker::new();
        let mut addresses = Vec::with_capacity(policy.server.listen.len());
        let gateway = Gateway {
            shared: shared.clone(),
        };
        for address in &policy.server.listen {
            let listener = bind(*address).await?;
            let bound = listener.local_addr().map_err(|source| StartError::Listen {
                address: *address,
                source,
            })?;
            addresses.push(bound);
            tracing::info!(address = %bound, "listening");
            listeners.spawn(server::serve(
                listener,
                gateway.clone(),
                policy.server.clone(),
                shutdown_signal.clone(),
            ));
        }
        let admin_listener = bind(policy.admin.listen).await?;
        let admin_address = admin_listener
            .local_addr()
            .map_err(|source| StartError::Listen {
                address: policy.admin.listen,
                source,
            })?;
        tracing::info!(address = %admin_address, "admin listening (/metrics, /healthz, /readyz)");
        // The admin listener is not tracked: it keeps answering /readyz 503 while draining.
        tokio::spawn(admin::serve(admin_listener, shared.clone()));

        let watching = Arc::downgrade(&shared);
        tokio::spawn(async move {
            let period = Duration::from_millis(100);
            let mut interval = tokio::time::interval(period);
            loop {
                interval.tick().await;
                let Some(shared) = watching.upgrade() else {
                    break;
                };
                let runtime = shared.runtime.load();
                let factor = shared
                    .load
                    .tick(runtime.policy.overload.as_ref(), period.as_secs_f64());
                shared.metrics.load_factor.set(factor);
            }
        });

        let sweeping = Arc::downgrade(&shared);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_secs(5));
            loop {
                interval.tick().await;
                let Some(shared) = sweeping.upgrade() else {
                    break;
                };
                shared.store.sweep();
                shared.local.sweep();
            }
        });

        Ok(Tollgate {
            addresses,
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
        let outcome = self.swap(policy);
        self.shared.metrics.config_reload(outcome.is_ok());
        match &outcome {
            Ok(()) => tracing::info!("configuration reloaded"),
            Err(error) => tracing::error!(
                "configuration reload refused, keeping the current policy:\n{error}"
            ),
        }
        outcome
    }

    fn swap(&self, policy: Policy) -> Result<(), ReloadError> {
        let tls = tls_acceptor(&policy).map_err(ReloadError::Tls)?;
        let runtime = Runtime::new(policy, &self.shared.metrics).map_err(ReloadError::Upstream)?;
        let current = self.shared.runtime.load();
        let (old, new) = (&current.policy, &runtime.policy);
        if old.server.listen != new.server.listen || old.admin != new.admin {
            tracing::warn!("listen addresses changed: they take effect after a restart");
        }
        if old.store != new.store {
            tracing::warn!("[store] changed: it takes effect after a restart");
        }
        match (&old.server.tls, tls) {
            (Some(_), Some(acceptor)) => self.shared.tls.store(Some(Arc::new(acceptor))),
            (None, None) => {}
            _ => tracing::warn!("TLS turned on or off: it takes effect after a restart"),
        }
        for warning in &new.warnings {
            tracing::warn!("policy: {warning}");
        }
        self.shared.runtime.store(Arc::new(runtime));
        Ok(())
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
        let Some(path) = self.config_path.clone() else {
            return;
        };
        let gateway = Arc::downgrade(self);
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
                    let _ = gateway.reload_from_file();
                }
            }
        });
    }

    /// The current metrics in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.shared.metrics.render()
    }

    /// The memory store (for tests and diagnostics).
    pub fn memory_store(&self) -> Option<&MemoryStore> {
        match &self.shared.store {
            Store::Memory(store) => Some(store),
            Store::Redis(_) => None,
        }
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
        drained
    }
}

/// The listeners' TLS acceptor, reading the certificate files now.
fn tls_acceptor(policy: &Policy) -> Result<Option<TlsAcceptor>, String> {
    policy
        .server
        .tls
        .as_ref()
        .map(|files| tls::server_config(files).map(TlsAcceptor::from))
        .transpose()
}

async fn bind(address: SocketAddr) -> Result<TcpListener, StartError> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(|source| StartError::Listen { address, source })?;
    socket
        .set_reuseaddr(true)
        .and_then(|()| socket.bind(address))
        .and_then(|()| socket.listen(1024))
        .map_err(|source| StartError::Listen { address, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_spelled_as_two_lower_case_hex_digits() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut digits = vec![0u8; 512];
        write_hex(&bytes, &mut digits);
        let expected: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(String::from_utf8(digits).unwrap(), expected);
    }

    #[test]
    fn request_ids_are_the_prefix_then_the_sequence_in_hexadecimal() {
        let mut digits = [0u8; 32];
        write_hex(&0x0123_4567_89ab_cdef_u64.to_be_bytes(), &mut digits[..16]);
        write_hex(&42_u64.to_be_bytes(), &mut digits[16..]);
        assert_eq!(&digits, b"0123456789abcdef000000000000002a");
    }
}
