//! What is known of a request's client besides its address: the network's owner and country
//! (`[geoip]`, looked up once per connection and client), and the TLS fingerprint of its
//! connection, or, on the decision listener, the one the asking proxy sends.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;

use super::{access_log, Connection, Listener, Routed};
use crate::geoip::{GeoIp, Origin};

/// The header an asking proxy names the original connection's JA4 fingerprint in.
pub(super) const JA4_HEADER: &str = "x-tollgate-ja4";

/// A request's client, as the limits' keys read it.
pub(super) struct ClientFacts<'a> {
    pub(super) address: IpAddr,
    pub(super) origin: Origin,
    pub(super) ja4: Option<&'a str>,
}

/// The client's facts: its origin only where a limit or the access log reads it.
pub(super) fn client_facts<'a>(
    routed: &Routed<'a>,
    address: IpAddr,
    headers: &'a HeaderMap,
) -> ClientFacts<'a> {
    let origin = match &routed.runtime.policy.geoip {
        Some(geoip) if routed.route.route.reads_origin || access_log::enabled() => {
            routed.connection.origin(geoip, address)
        }
        _ => Origin::default(),
    };
    let ja4 = match routed.connection.listener {
        Listener::Proxy => routed.connection.ja4.as_deref(),
        Listener::Decision => headers
            .get(JA4_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty()),
    };
    ClientFacts {
        address,
        origin,
        ja4,
    }
}

impl Connection {
    /// What `geoip` says of `client`: remembered for the connection's first client (nearly
    /// always its only one), looked up again for any other or after a reload's new files.
    fn origin(&self, geoip: &Arc<GeoIp>, client: IpAddr) -> Origin {
        let databases = Arc::as_ptr(geoip) as usize;
        let (cached_for, cached_client, origin) = *self
            .origin
            .get_or_init(|| (databases, client, geoip.origin(client)));
        if cached_for == databases && cached_client == client {
            origin
        } else {
            geoip.origin(client)
        }
    }
}
