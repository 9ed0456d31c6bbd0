//! State that lives as long as the process, shared by every connection: the swappable
//! [`Runtime`], the stores, the metrics, and the one-time warnings.

use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use crate::client_ip::TrustWarning;
use crate::key::KeyHasher;
use crate::limit::{MemoryStore, Store};
use crate::metrics::{Metrics, StoreCallMetrics};
use crate::overload::LoadMonitor;
use crate::request_id::RequestIds;
use crate::runtime::Runtime;

/// How many short chains are counted between checks of whether they are routine.
const SHORT_CHAIN_SAMPLE: u64 = 50;

pub(crate) struct Shared {
    pub(crate) runtime: ArcSwap<Runtime>,
    pub(crate) store: Store,
    /// In-process buckets for routes with `on_store_failure = "local"`.
    pub(crate) local: MemoryStore,
    pub(crate) hasher: KeyHasher,
    pub(crate) metrics: Metrics,
    pub(crate) store_calls: StoreCallMetrics,
    pub(crate) trust_warned: TrustWarned,
    pub(crate) shutting_down: AtomicBool,
    /// Upstream load and the factor it puts on every rate (`[overload]`).
    pub(crate) load: LoadMonitor,
    /// The listeners' TLS configuration; replaced on reload (certificates are re-read).
    pub(crate) tls: ArcSwapOption<TlsAcceptor>,
    /// Connections and upgraded streams: shutdown waits for them.
    pub(crate) tasks: TaskTracker,
    pub(crate) request_ids: RequestIds,
}

/// Whether each trust warning has been logged (each is logged once per process).
#[derive(Debug, Default)]
pub(crate) struct TrustWarned {
    forwarded_but_no_hop_trusted: AtomicBool,
    forwarded_by_untrusted_peer: AtomicBool,
    chain_shorter_than_trusted_hops: AtomicBool,
}

impl TrustWarned {
    fn flag(&self, warning: TrustWarning) -> &AtomicBool {
        match warning {
            TrustWarning::ForwardedButNoHopTrusted => &self.forwarded_but_no_hop_trusted,
            TrustWarning::ForwardedByUntrustedPeer => &self.forwarded_by_untrusted_peer,
            TrustWarning::ChainShorterThanTrustedHops => &self.chain_shorter_than_trusted_hops,
        }
    }
}

impl Shared {
    /// Counts a trust warning, and logs it once per cause. A chain shorter than
    /// `trusted_hops` is logged only once it is routine (at least a tenth of the requests, seen
    /// 50 times): a load balancer's own health checks carry no forwarding header.
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
