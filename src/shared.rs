//! State that lives as long as the process, shared by every connection: the swappable
//! [`Runtime`], the stores, the metrics, and the one-time warnings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio_util::task::TaskTracker;

use crate::client_ip::{TrustWarning, MANY_FORWARDING_PEERS};
use crate::config::Policy;
use crate::connection_limits::ConnectionGate;
use crate::errors::{ReloadError, StartError};
use crate::key::KeyHasher;
use crate::limit::{Clock, MemoryStore, RedisStore, Store};
use crate::metrics::{Metrics, StoreCallMetrics};
use crate::overload::LoadMonitor;
use crate::overrides::Overrides;
use crate::request_id::RequestIds;
use crate::runtime::Runtime;
use crate::tls::{Obtained, TlsListener};

/// How many short chains are counted between checks of whether they are routine.
const SHORT_CHAIN_SAMPLE: u64 = 50;

pub(crate) struct Shared {
    pub(crate) runtime: ArcSwap<Runtime>,
    pub(crate) store: Store,
    /// In-process buckets for routes with `on_store_failure = "local"`.
    pub(crate) local: MemoryStore,
    /// The slots of concurrency limits held by this process's requests in flight.
    pub(crate) slots: Arc<crate::limit::concurrency::Slots>,
    pub(crate) hasher: KeyHasher,
    /// Keys whose numbers an operator changed while the gateway runs.
    pub(crate) overrides: Overrides,
    pub(crate) metrics: Metrics,
    /// `[scan]`: what was detected, the bans in force (this process's, or the fleet's).
    pub(crate) scans: crate::scan::live::Scans,
    /// Each route's outcomes as they were every ten seconds (`/top/routes`).
    pub(crate) route_history: crate::top::routes::RouteHistory,
    pub(crate) store_calls: StoreCallMetrics,
    pub(crate) trust_warned: TrustWarned,
    pub(crate) shutting_down: AtomicBool,
    /// Upstream load and the factor it puts on every rate (`[overload]`).
    pub(crate) load: LoadMonitor,
    /// The listeners' TLS configuration; replaced on reload (certificates are re-read).
    pub(crate) tls: ArcSwapOption<TlsListener>,
    /// `[tracing]`: the tracer requests' spans come from (as at start).
    pub(crate) traces: Option<crate::traces::Traces>,
    /// `[server.tls.acme]`'s hosts (as at start) and what was obtained for them.
    pub(crate) acme: Option<Arc<Obtained>>,
    /// The first TLS listener's port, where `redirect_plain` sends plain requests.
    pub(crate) https_port: std::sync::OnceLock<u16>,
    /// `Alt-Svc` for the TCP TLS listeners' responses, once an HTTP/3 listener is bound.
    pub(crate) alt_svc: std::sync::OnceLock<http::HeaderValue>,
    /// Connections and upgraded streams: shutdown waits for them.
    pub(crate) tasks: TaskTracker,
    pub(crate) request_ids: RequestIds,
    /// The proxy listeners' open connections (`[server.connections]`).
    pub(crate) connections: Arc<ConnectionGate>,
}

/// Whether each trust warning has been logged (each is logged once per process).
#[derive(Debug, Default)]
pub(crate) struct TrustWarned {
    forwarded_but_no_hop_trusted: AtomicBool,
    forwarded_by_untrusted_peer: AtomicBool,
    chain_shorter_than_trusted_hops: AtomicBool,
    forwarded_by_many_peers: AtomicBool,
    /// Peers seen sending forwarding headers while hops are trusted (up to the threshold).
    forwarding_peers: parking_lot::Mutex<Vec<std::net::IpAddr>>,
    /// The latest of them: nearly every request comes through the same proxy.
    latest_forwarding_peer: parking_lot::Mutex<Option<std::net::IpAddr>>,
}

impl TrustWarned {
    fn flag(&self, warning: TrustWarning) -> &AtomicBool {
        match warning {
            TrustWarning::ForwardedButNoHopTrusted => &self.forwarded_but_no_hop_trusted,
            TrustWarning::ForwardedByUntrustedPeer => &self.forwarded_by_untrusted_peer,
            TrustWarning::ChainShorterThanTrustedHops => &self.chain_shorter_than_trusted_hops,
            TrustWarning::ForwardedByManyPeers => &self.forwarded_by_many_peers,
        }
    }

    /// Notes a peer that sent forwarding headers while hops are trusted; true once more than
    /// [`MANY_FORWARDING_PEERS`] distinct peers have (once per process).
    fn many_forwarding_peers(&self, peer: std::net::IpAddr) -> bool {
        if self.forwarded_by_many_peers.load(Ordering::Relaxed) {
            return false;
        }
        {
            let mut latest = self.latest_forwarding_peer.lock();
            if *latest == Some(peer) {
                return false;
            }
            *latest = Some(peer);
        }
        let mut peers = self.forwarding_peers.lock();
        if !peers.contains(&peer) {
            peers.push(peer);
        }
        peers.len() > MANY_FORWARDING_PEERS
    }
}

impl Shared {
    /// The state of a gateway starting with `policy`: its store (memory, or Redis prepared
    /// without connecting), metrics, runtime and TLS acceptor.
    pub(crate) fn new(policy: &Policy, clock: Clock) -> Result<Shared, StartError> {
        let metrics = Metrics::new();
        metrics.top.set_capacity(policy.top.keys_per_limit);
        let store = match &policy.store.redis {
            Some(settings) => Store::Redis(Arc::new(
                RedisStore::new(settings, clock.clone())
                    .map_err(StartError::Store)?
                    .observing(
                        metrics.store_batches("redis"),
                        metrics.store_late("redis"),
                        metrics.store_calls("redis"),
                    ),
            )),
            None => Store::Memory(MemoryStore::new(policy.store.max_keys, clock.clone())),
        };
        let (overrides, hasher) =
            Overrides::open(policy, &store, clock.clone(), metrics.overrides.clone())
                .map_err(StartError::Overrides)?;
        let runtime = Runtime::new(policy.clone(), &metrics).map_err(StartError::Upstream)?;
        let acme = policy
            .server
            .tls
            .as_ref()
            .and_then(|tls| tls.acme.as_ref())
            .map(|acme| Arc::new(Obtained::new(acme.hosts.clone())));
        let tls = tls_listener(policy, acme.clone()).map_err(StartError::Tls)?;
        let traces = policy.tracing.as_ref().map(|settings| {
            crate::traces::Traces::start(settings, metrics.trace_spans_dropped.clone())
        });
        if let Some(tls) = &tls {
            metrics.tls.serving(&tls.certificates.ends);
        }
        let connections = Arc::new(ConnectionGate::new(
            clock.clone(),
            metrics.connections.open.clone(),
        ));
        let scans = crate::scan::live::Scans::new(
            &store,
            policy.store.max_keys,
            clock.clone(),
            metrics.scans_detected.clone(),
        );
        Ok(Shared {
            scans,
            connections,
            overrides,
            store_calls: metrics.store_call(store.backend()),
            store,
            local: MemoryStore::new(policy.store.max_keys, clock),
            slots: Arc::default(),
            hasher,
            runtime: ArcSwap::from_pointee(runtime),
            metrics,
            route_history: Default::default(),
            trust_warned: TrustWarned::default(),
            shutting_down: AtomicBool::new(false),
            load: LoadMonitor::default(),
            tls: ArcSwapOption::from(tls.map(Arc::new)),
            https_port: std::sync::OnceLock::new(),
            alt_svc: std::sync::OnceLock::new(),
            acme,
            traces,
            tasks: TaskTracker::new(),
            request_ids: RequestIds::new(),
        })
    }

    /// Puts a new runtime, compiled from `policy`, in place for new requests (those in flight
    /// keep theirs). What only a restart changes is logged, not applied.
    pub(crate) fn swap_policy(&self, policy: Policy) -> Result<(), ReloadError> {
        let tls = tls_listener(&policy, self.acme.clone()).map_err(ReloadError::Tls)?;
        // Set before the runtime resolves its limits' top ids; a reload refused keeps the old.
        let top_capacity = self.metrics.top.capacity();
        self.metrics.top.set_capacity(policy.top.keys_per_limit);
        let runtime = Runtime::new(policy, &self.metrics).map_err(|error| {
            self.metrics.top.set_capacity(top_capacity);
            ReloadError::Upstream(error)
        })?;
        let current = self.runtime.load();
        let (old, new) = (&current.policy, &runtime.policy);
        let decision_listen = |policy: &Policy| policy.decision.as_ref().map(|d| d.listen);
        if old.server.listen != new.server.listen
            || old.server.http3 != new.server.http3
            || old.admin != new.admin
            || decision_listen(old) != decision_listen(new)
        {
            tracing::warn!("listen addresses changed: they take effect after a restart");
        }
        if old.store != new.store {
            tracing::warn!("[store] changed: it takes effect after a restart");
        }
        let acme = |policy: &Policy| policy.server.tls.as_ref().and_then(|tls| tls.acme.clone());
        if old.tracing != new.tracing {
            tracing::warn!("[tracing] changed: it takes effect after a restart");
        }
        if acme(old) != acme(new) {
            tracing::warn!("[server.tls.acme] changed: it takes effect after a restart");
        }
        if old.overrides.file != new.overrides.file {
            tracing::warn!("[overrides] file changed: it takes effect after a restart");
        }
        match (&old.server.tls, tls) {
            (Some(_), Some(tls)) => {
                self.metrics.tls.serving(&tls.certificates.ends);
                self.tls.store(Some(Arc::new(tls)));
            }
            (None, None) => {}
            _ => tracing::warn!("TLS turned on or off: it takes effect after a restart"),
        }
        for warning in &new.warnings {
            tracing::warn!("policy: {warning}");
        }
        self.overrides.reloaded(&runtime.policy);
        self.runtime.store(Arc::new(runtime));
        Ok(())
    }

    /// Counts a trust warning, and logs it once per cause. A chain shorter than
    /// `trusted_hops` is logged only once it is routine (at least a tenth of the requests, seen
    /// 50 times): a load balancer's own health checks carry no forwarding header.
    /// Watches for forwarding headers from many distinct peers while hops are trusted, and
    /// warns (logged and counted) once they are more than proxies usually are.
    pub(crate) fn forwarding_peer(&self, peer: std::net::IpAddr) {
        if self.trust_warned.many_forwarding_peers(peer) {
            self.trust_warning(TrustWarning::ForwardedByManyPeers);
        }
    }

    pub(crate) fn trust_warning(&self, warning: TrustWarning) {
        let seen = self.metrics.client_ip_warning(warning);
        let warned = self.trust_warned.flag(warning);
        if warned.load(Ordering::Relaxed) {
            return;
        }
        if warning == TrustWarning::ChainShorterThanTrustedHops
            && (seen % SHORT_CHAIN_SAMPLE != 0 || seen * 10 < self.metrics.total_requests())
        {
            return;
        }
        if !warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(cause = warning.as_str(), "{}", warning.explanation());
        }
    }
}

/// The TLS listeners' configuration, its certificate files read now; what is wrong with a
/// certificate that still serves (ended, or not naming a host it is listed for) is logged.
fn tls_listener(
    policy: &Policy,
    acme: Option<Arc<Obtained>>,
) -> Result<Option<TlsListener>, crate::tls::TlsError> {
    let Some(settings) = &policy.server.tls else {
        return Ok(None);
    };
    let tls = TlsListener::new(settings, acme)?;
    let now = crate::limit::clock::unix_seconds() as i64;
    for warning in tls.certificates.problems(now) {
        tracing::warn!("{warning}");
    }
    Ok(Some(tls))
}
