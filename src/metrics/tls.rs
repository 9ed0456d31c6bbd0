//! TLS on the listeners: handshakes that failed, by why, and how long each certificate served
//! has left.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, Opts, Registry};

use super::registered;
use crate::tls::{CertificateEnd, HandshakeFailure};

/// `tollgate_tls_handshake_failures_total` and `tollgate_tls_certificate_expiry_seconds`.
#[derive(Debug, Clone)]
pub struct TlsMetrics {
    handshake_failures: IntCounterVec,
    expiry: Arc<CertificateExpiry>,
    acme_orders: IntCounterVec,
}

impl TlsMetrics {
    pub(super) fn new(registry: &Registry) -> TlsMetrics {
        let handshake_failures = IntCounterVec::new(
            Opts::new(
                "tollgate_tls_handshake_failures_total",
                "TLS connections that ended before or instead of their requests, by why: timeout, closed, not_tls, unrecognized_name (no certificate for the name asked), incompatible (no version or suite in common), bad_record, client_alert (the client refused the handshake, such as an unknown CA), renegotiation (an attempt after the handshake, refused), or other.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in HandshakeFailure::ALL {
            handshake_failures.with_label_values(&[reason.as_str()]);
        }
        let expiry = Arc::new(CertificateExpiry {
            gauge: GaugeVec::new(
                Opts::new(
                    "tollgate_tls_certificate_expiry_seconds",
                    "Seconds until the end of the certificate served for each host (`default`: the one without hosts); negative once it has ended.",
                ),
                &["host"],
            )
            .expect("valid metric"),
            files: Mutex::new(Vec::new()),
            obtained: Mutex::new(Vec::new()),
        });
        registry
            .register(Box::new(ExpiryCollector(expiry.clone())))
            .expect("unique metric");
        let acme_orders = IntCounterVec::new(
            Opts::new(
                "tollgate_acme_orders_total",
                "ACME orders for [server.tls.acme]'s hosts, by how they ended: ok (a certificate obtained and served) or error (retried with backoff).",
            ),
            &["result"],
        )
        .expect("valid metric");
        for result in ["ok", "error"] {
            acme_orders.with_label_values(&[result]);
        }
        TlsMetrics {
            handshake_failures: registered(registry, handshake_failures),
            expiry,
            acme_orders: registered(registry, acme_orders),
        }
    }

    pub(crate) fn handshake_failed(&self, reason: HandshakeFailure) {
        self.handshake_failures
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// The certificates from files now served (at start and after each reload).
    pub(crate) fn serving(&self, ends: &[CertificateEnd]) {
        *self.expiry.files.lock() = ends
            .iter()
            .map(|end| (end.host.clone(), end.not_after))
            .collect();
    }

    /// The certificate ACME obtained for `hosts`, now served.
    pub(crate) fn serving_obtained(&self, hosts: &[String], not_after: i64) {
        *self.expiry.obtained.lock() = hosts.iter().map(|host| (host.clone(), not_after)).collect();
    }

    /// `tollgate_acme_orders_total{result}`.
    pub(crate) fn ordered(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.acme_orders.with_label_values(&[result]).inc();
    }
}

/// The seconds left are worked out at each scrape, from each certificate's end.
#[derive(Debug)]
struct CertificateExpiry {
    gauge: GaugeVec,
    /// Each host's end: of the certificates from files, and of what ACME obtained.
    files: Mutex<Vec<(String, i64)>>,
    obtained: Mutex<Vec<(String, i64)>>,
}

struct ExpiryCollector(Arc<CertificateExpiry>);

impl Collector for ExpiryCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = crate::limit::clock::unix_seconds() as i64;
        let (files, obtained) = (self.0.files.lock(), self.0.obtained.lock());
        self.0.gauge.reset();
        for (host, not_after) in files.iter().chain(obtained.iter()) {
            self.0
                .gauge
                .with_label_values(&[host])
                .set((not_after - now) as f64);
        }
        self.0.gauge.collect()
    }
}
