//! The proxy listeners' connections: open now, and closed as they came, by the limit or check
//! that closed them. Counted per connection, off the request path.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::registered;
use crate::connection_limits::Refusal;

/// `tollgate_connections_open`, `tollgate_connections_refused_total`, and
/// `tollgate_quic_retries_total`.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    pub open: IntGauge,
    refused: IntCounterVec,
    /// QUIC connections asked to prove their address with a Retry before any handshake.
    pub quic_retries: IntCounter,
}

impl ConnectionMetrics {
    pub(super) fn new(registry: &Registry) -> ConnectionMetrics {
        let open = IntGauge::new(
            "tollgate_connections_open",
            "Client connections open on the proxy listeners.",
        )
        .expect("valid metric");
        let refused = IntCounterVec::new(
            Opts::new(
                "tollgate_connections_refused_total",
                "Connections closed as soon as they came: over [server.connections] max, rate (a network's new connections) or open (a network's open connections), or without the PROXY header their peer must send (proxy_protocol).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in Refusal::ALL {
            refused.with_label_values(&[reason.as_str()]);
        }
        let quic_retries = IntCounter::new(
            "tollgate_quic_retries_total",
            "New QUIC connections answered with a Retry (address validation) instead of a handshake: handshakes in progress over 1000, or their network over [server.connections] per_network.",
        )
        .expect("valid metric");
        ConnectionMetrics {
            open: registered(registry, open),
            refused: registered(registry, refused),
            quic_retries: registered(registry, quic_retries),
        }
    }

    pub(crate) fn refused(&self, reason: Refusal) {
        self.refused.with_label_values(&[reason.as_str()]).inc();
    }
}
