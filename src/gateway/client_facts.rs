//! What is known of a request's client besides its address: the network's owner and country
//! (`[geoip]`, looked up once per connection and client), and the TLS fingerprint of its
//! connection (or, on the decision listener, the one the asking proxy sends).

use std::net::IpAddr;

use super::{access_log, Routed};
use crate::geoip::Origin;

/// A request's client, as the limits' keys read it.
pub(crate) struct ClientFacts<'a> {
    pub(crate) address: IpAddr,
    pub(crate) origin: Origin,
    pub(crate) ja4: Option<&'a str>,
}

/// The client's facts: its origin only where a limit or the access log reads it.
pub(crate) fn client_facts<'a>(
    routed: &Routed<'_>,
    address: IpAddr,
    ja4: Option<&'a str>,
) -> ClientFacts<'a> {
    let origin = match &routed.runtime.policy.geoip {
        Some(geoip) if routed.route.route.reads_origin || access_log::enabled() => {
            routed.connection.origin(geoip, address)
        }
        _ => Origin::default(),
    };
    ClientFacts {
        address,
        origin,
        ja4,
    }
}
