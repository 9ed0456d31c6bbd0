//! What a listener's answerer is handed: the connection a request came on, the request (its
//! body as `request_body.rs` says), and the one method every listener's answerer has
//! ([`Answering`]): the proxy (`gateway.rs`) and the decision service (`decision.rs`).

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use http::header::HeaderValue;
use http::{Request, Response};

use crate::body::Body;
use crate::geoip::{GeoIp, Origin};
use crate::request_body::RequestBody;
use crate::respond::SetFields;
use crate::upstream;

/// What the gateway knows of the connection a request came on.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    /// Unique to the connection in this process: what `reuse = "per_client"` keeps upstream
    /// connections for.
    pub(crate) id: u64,
    pub(crate) peer: IpAddr,
    /// The peer as an `X-Forwarded-For` entry, rendered once per connection, when a request
    /// is first forwarded (a connection whose requests are all refused never needs it).
    peer_header: OnceLock<HeaderValue>,
    /// `X-Forwarded-Proto` for the upstream.
    pub(crate) proto: &'static str,
    /// The JA4 fingerprint of the connection's TLS ClientHello, when it was read.
    pub(crate) ja4: Option<Arc<str>>,
    /// HTTP/3 over QUIC.
    pub(crate) http3: bool,
    /// What `[geoip]` said of the connection's first client.
    origin: OnceLock<(usize, IpAddr, Origin)>,
}

impl Connection {
    pub(crate) fn new(peer: IpAddr, proto: &'static str) -> Connection {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Connection {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            peer: peer.to_canonical(),
            peer_header: OnceLock::new(),
            proto,
            ja4: None,
            http3: false,
            origin: OnceLock::new(),
        }
    }

    /// The peer as an `X-Forwarded-For` entry.
    pub(crate) fn peer_header(&self) -> &HeaderValue {
        self.peer_header
            .get_or_init(|| upstream::peer_header(self.peer))
    }

    /// What `geoip` says of `client`: remembered for the connection's first client (nearly
    /// always its only one), looked up again for any other or after a reload's new files.
    pub(crate) fn origin(&self, geoip: &Arc<GeoIp>, client: IpAddr) -> Origin {
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

/// How a listener's requests are answered. The server is generic over it, so that a
/// connection's future holds its own listener's request future only (the futures are
/// kilobytes, and a connection's is copied whole when it starts).
pub(crate) trait Answering: Clone + Send + Sync + 'static {
    /// Answers one request; never fails (rejections become responses).
    fn answer<'a>(
        &'a self,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl Future<Output = Response<Body>> + Send + 'a;
}
