//! The proxy listeners' connections: open now, and closed as they came, by the limit or check
//! that closed them. Counted per connection, off the request path.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use super::registered;
use crate::connection_limits::Refusal;

/// `tollgate_connections_open` and `tollgate_connections_refused_total`.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    pub open: IntGauge,
    refused: IntCounterVec,
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
        ConnectionMetrics {
            open: registered(registry, open),
            refused: registered(registry, refused),
        }
    }

    pub(crate) fn refused(&self, reason: Refusal) {
        self.refused.with_label_values(&[reason.as_str()]).inc();
    }
}
