//! Forwarding to upstreams: pooled keep-alive connections, round-robin over an upstream's
//! addresses (skipping ones that just refused a connection), timeouts, and the header
//! rewriting a reverse proxy owes both sides.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;

mod connection_pool;
mod http1;
mod watched_body;

use std::sync::Arc;

use connection_pool::{ConnectionPool, PoolError};
use smallvec::SmallVec;
use watched_body::WatchedBody;

use crate::config::{Upstream, UpstreamTarget};
use crate::gateway::REQUEST_ID_NAME;
use crate::limit::clock;
use crate::wire::message::response_head_too_large;
use crate::{tls, Body, RequestId};

/// Requests with a body in memory up to this size take the gateway's own client, which writes
/// the whole request before reading: far below what the socket buffers hold, so an upstream
/// that answers while it reads can never stall it.
const OWN_CLIENT_MAX_BODY: usize = 64 * 1024;

/// How long an address that refused a connection is passed over by round-robin.
const DOWN_FOR: Duration = Duration::from_secs(2);

/// Why no upstream response came back.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot connect to the upstream: {0}")]
    Connect(String),
    #[error("no response head within {0:?}")]
    Timeout(Duration),
    #[error("upstream exchange failed: {0}")]
    Exchange(String),
    /// The client's body, streamed upstream, broke off or was malformed (bad chunking): the
    /// client's doing, not the upstream's.
    #[error("the request body could not be read")]
    ClientBody,
}

/// A request body on its way upstream: streamed as it arrives, or already in memory (then it
/// can be sent again to another address when the first refuses the connection).
pub enum OutgoingBody {
    Streamed(Incoming),
    Buffered(Bytes),
}

/// A request on its way to one of an upstream's targets.
enum Outgoing<'a> {
    /// On the gateway's own client: the body is in memory, the gateway's fields are written
    /// beside the head, and every attempt sends the same request.
    Own {
        request: http::request::Parts,
        forwarding: Forwarding<'a>,
        body: Bytes,
        /// The request names its host (the client's `Host` or the gateway's): no target's
        /// authority is put in.
        has_host: bool,
    },
    /// On hyper's client: the gateway's fields are in the map, and the body (`None` once an
    /// attempt took it for good) goes with the attempt.
    Hyper {
        request: http::request::Parts,
        body: Option<OutgoingBody>,
        query: Option<String>,
    },
}

/// Which of an upstream's targets an attempt goes to, and the path it asks for there.
#[derive(Clone, Copy)]
struct Target<'p> {
    index: usize,
    path: &'p str,
}

impl Outgoing<'_> {
    /// Whether the request can be sent again to another target.
    fn can_resend(&self) -> bool {
        match self {
            Outgoing::Own { .. } => true,
            Outgoing::Hyper { body, .. } => body.is_some(),
        }
    }
}

/// One configured upstream with its connection pool.
#[derive(Debug)]
pub struct UpstreamPool {
    pub settings: Upstream,
    /// One pool of keep-alive connections per target.
    pools: Vec<ConnectionPool>,
    next: AtomicUsize,
    origin: Instant,
    /// Per target: milliseconds since `origin` until which it is passed over.
    down_until: Vec<AtomicU64>,
    /// Per target: the `Host` for requests that came without one.
    authorities: Vec<Option<HeaderValue>>,
}

impl UpstreamPool {
    /// Fails only when the configured CA file cannot be used.
    pub fn new(settings: &Upstream) -> Result<UpstreamPool, String> {
        let https = settings
            .targets
            .iter()
            .any(|target| target.url.scheme_str() == Some("https"));
        let tls = if https {
            let mut config = tls::client_config(settings.ca_file.as_deref())?;
            // HTTP/2 when the target picks it (gRPC needs it), HTTP/1.1 otherwise.
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(Arc::new(config))
        } else {
            None
        };
        let pools = settings
            .targets
            .iter()
            .map(|target| ConnectionPool::new(&target.url, tls.clone(), settings.connect_timeout))
            .collect::<Result<_, _>>()?;
        Ok(UpstreamPool {
            down_until: settings.targets.iter().map(|_| AtomicU64::new(0)).collect(),
            authorities: settings
                .targets
                .iter()
                .map(|target| {
                    let authority = target.url.authority()?;
                    HeaderValue::from_str(authority.as_str()).ok()
                })
                .collect(),
            settings: settings.clone(),
            pools,
            next: AtomicUsize::new(0),
            origin: clock::instant(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(clock::elapsed(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// Targets in the order to try them: round-robin, ones marked down last.
    fn order(&self) -> SmallVec<[usize; 4]> {
        let count = self.settings.targets.len();
        if count == 1 {
            return SmallVec::from_elem(0, 1);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let mut order: SmallVec<[usize; 4]> =
            (0..count).map(|offset| (start + offset) % count).collect();
        order.sort_by_key(|index| self.down_until[*index].load(Ordering::Relaxed) > now);
        order
    }

    /// Sends `request` with the fields of `forwarding` and waits for the response head, due
    /// within the upstream's timeout of `sent`. Its URI is the client's: what goes upstream is
    /// the target's base path, `path` (the normalized path) and the URI's query.
    pub async fn send(
        &self,
        request: http::request::Parts,
        forwarding: Forwarding<'_>,
        path: &str,
        body: OutgoingBody,
        sent: Instant,
    ) -> Result<Response<Body>, ForwardError> {
        let deadline = tokio::time::Instant::from_std(sent + self.settings.timeout);
        let mut outgoing = match body {
            OutgoingBody::Buffered(bytes)
                if bytes.len() <= OWN_CLIENT_MAX_BODY
                    && !request.headers.contains_key(header::UPGRADE)
                    && self.pools.iter().all(ConnectionPool::speaks_http1) =>
            {
                Outgoing::Own {
                    has_host: forwarding.sets_host() || request.headers.contains_key(header::HOST),
                    request,
                    forwarding,
                    body: bytes,
                }
            }
            body => {
                let mut request = request;
                forwarding.apply(&mut request.headers);
                request.version = Version::HTTP_11;
                Outgoing::Hyper {
                    query: request.uri.query().map(str::to_owned),
                    request,
                    body: Some(body),
                }
            }
        };
        let response = self.exchange(&mut outgoing, path, deadline).await;
        if let Outgoing::Own { request, .. } = outgoing {
            // Written out: the map can hold another request's head.
            crate::wire::header_maps::give_back(request.headers);
        }
        response
    }

    /// Tries the targets in round-robin order until one answers: a target that refuses the
    /// connection is passed over and the next one tried, as long as the request can be sent
    /// again (its body is in memory).
    async fn exchange(
        &self,
        outgoing: &mut Outgoing<'_>,
        path: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Response<Body>, ForwardError> {
        let order = self.order();
        // Spelled out only when no target answers: not an allocation per request.
        let mut last_error = None;
        for (attempt, index) in order.iter().enumerate() {
            let more = attempt + 1 < order.len();
            let target = Target {
                index: *index,
                path,
            };
            let result = match outgoing {
                Outgoing::Own {
                    request,
                    forwarding,
                    body,
                    has_host,
                } => {
                    if !*has_host {
                        // Each target's own authority, for a request that named no host.
                        if let Some(authority) = &self.authorities[*index] {
                            request.headers.insert(header::HOST, authority.clone());
                        }
                    }
                    self.send_own(target, request, forwarding, body, deadline)
                        .await
                }
                // Boxed: the common path's future stays small.
                Outgoing::Hyper {
                    request,
                    body,
                    query,
                } => {
                    let send = Box::pin(self.send_with_hyper(target, request, body, query, more));
                    tokio::time::timeout_at(deadline, send)
                        .await
                        .unwrap_or(Err(PoolError::Timeout))
                }
            };
            let error = match result {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            let target = &self.settings.targets[*index];
            last_error = Some(self.failed(*index, target, attempt, error)?);
            if !outgoing.can_resend() {
                break;
            }
        }
        Err(last_error.unwrap_or_else(no_target))
    }

    /// One attempt on the gateway's own client; the request stays whole for the next.
    async fn send_own(
        &self,
        Target { index, path }: Target<'_>,
        request: &http::request::Parts,
        forwarding: &Forwarding<'_>,
        body: &Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<Response<Body>, PoolError> {
        let [separator, query] = request
            .uri
            .query()
            .map(|query| ["?", query])
            .unwrap_or_default();
        let outgoing = http1::OutgoingRequest {
            method: &request.method,
            target: [
                base_path(&self.settings.targets[index], path),
                path,
                separator,
                query,
            ],
            headers: &request.headers,
            forwarding,
            body,
        };
        self.pools[index].send_buffered(&outgoing, deadline).await
    }

    /// One attempt on hyper's client, for streamed bodies and protocol switches. The body
    /// goes with it; a body in memory is kept for another attempt when `more` targets remain
    /// (the request head is copied only then).
    async fn send_with_hyper(
        &self,
        Target { index, path }: Target<'_>,
        request: &mut http::request::Parts,
        body: &mut Option<OutgoingBody>,
        query: &Option<String>,
        more: bool,
    ) -> Result<Response<Body>, PoolError> {
        let mut client_body_broken = None;
        let mut chunked = false;
        let (outgoing_body, kept) = match body.take() {
            Some(OutgoingBody::Buffered(bytes)) if more => (
                Body::full(bytes.clone()),
                Some(OutgoingBody::Buffered(bytes)),
            ),
            Some(OutgoingBody::Buffered(bytes)) => (Body::full(bytes), None),
            Some(OutgoingBody::Streamed(incoming)) => {
                chunked = http_body::Body::size_hint(&incoming).exact().is_none();
                let (watched, broken) = WatchedBody::new(incoming);
                client_body_broken = Some(broken);
                (Body::boxed(watched), None)
            }
            None => return Err(PoolError::Exchange("the request body is gone".to_owned())),
        };
        let mut parts = match kept {
            Some(kept) => {
                *body = Some(kept);
                request.clone()
            }
            None => std::mem::replace(request, Request::new(()).into_parts().0),
        };
        parts.uri = target_uri(&self.settings.targets[index], path, query.as_deref());
        if chunked {
            // hyper's client sends a body of unknown length on GET and HEAD only when asked:
            // left to itself, it would drop the body.
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        if !parts.headers.contains_key(header::HOST) {
            if let Some(authority) = &self.authorities[index] {
                parts.headers.insert(header::HOST, authority.clone());
            }
        }
        let sent = self.pools[index]
            .send(Request::from_parts(parts, outgoing_body))
            .await;
        match sent {
            Ok(response) if response_head_too_large(response.headers()) => {
                Err(PoolError::Exchange("response head too large".to_owned()))
            }
            Ok(response) => Ok(response.map(Body::boxed)),
            Err(_) if client_body_broken.is_some_and(|broken| broken.load(Ordering::Relaxed)) => {
                Err(PoolError::ClientBody)
            }
            Err(error) => Err(error),
        }
    }

    /// A target that refused the connection is passed over for a while and the next one is
    /// tried (`Ok`); any other failure ends the exchange.
    fn failed(
        &self,
        index: usize,
        target: &UpstreamTarget,
        attempt: usize,
        error: PoolError,
    ) -> Result<ForwardError, ForwardError> {
        match error {
            PoolError::Connect(error) => {
                self.down_until[index].store(
                    self.now_ms() + DOWN_FOR.as_millis() as u64,
                    Ordering::Relaxed,
                );
                tracing::warn!(upstream = %self.settings.name, target = %target.url, attempt, %error, "upstream connect failed");
                Ok(ForwardError::Connect(error))
            }
            PoolError::Exchange(error) => Err(ForwardError::Exchange(error)),
            PoolError::ClientBody => Err(ForwardError::ClientBody),
            PoolError::Timeout => Err(ForwardError::Timeout(self.settings.timeout)),
        }
    }
}

/// The origin-form URI sent to `target`: its base path, then the request's path and query.
fn no_target() -> ForwardError {
    ForwardError::Connect("no upstream address".to_owned())
}

fn target_uri(target: &UpstreamTarget, path: &str, query: Option<&str>) -> Uri {
    let base = base_path(target, path);
    let text = match query {
        Some(query) => format!("{base}{path}?{query}"),
        None => format!("{base}{path}"),
    };
    text.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

/// What goes before the request's path upstream: the target's base path, or nothing for the
/// asterisk-form `*` of `OPTIONS *`, which asks about the server, not a resource under it.
fn base_path<'t>(target: &'t UpstreamTarget, path: &str) -> &'t str {
    if path == ASTERISK {
        ""
    } else {
        &target.base_path
    }
}

/// The request target of `OPTIONS *` (RFC 9112 §3.2.4), forwarded as it is.
pub const ASTERISK: &str = "*";

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// A peer address as an `X-Forwarded-For` entry (IPv4-mapped IPv6 written as IPv4).
pub fn peer_header(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_canonical().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// The fields the gateway sets on a forwarded request, replacing any the client sent:
/// `X-Request-Id`; `Host` (the client's) and `X-Forwarded-Host` when the request named a host;
/// `X-Forwarded-For`, the client's chain with the peer appended; `X-Forwarded-Proto`.
///
/// Kept apart from the request's header map: the gateway's own client writes them straight
/// into the request head, which saves inserting five fields into the map and dropping them
/// again on every request. Only hyper's client path puts them into the map ([`Self::apply`]).
///
/// It borrows what it can from the request and its connection: a clone of a header value is
/// a reference count, a locked instruction, and so is its drop.
#[derive(Debug, Clone)]
pub struct Forwarding<'a> {
    request_id: &'a RequestId,
    host: Option<&'a HeaderValue>,
    forwarded_for: Option<Cow<'a, HeaderValue>>,
    proto: &'static str,
}

// The names as statics, so that `Forwarding::fields` can hand out references to them.
static HOST: HeaderName = header::HOST;
static FORWARDED_HOST: HeaderName = X_FORWARDED_HOST;
static FORWARDED_FOR: HeaderName = X_FORWARDED_FOR;
static FORWARDED_PROTO: HeaderName = X_FORWARDED_PROTO;

impl<'a> Forwarding<'a> {
    /// `peer` is the TCP peer's address as a header value (rendered once per connection);
    /// `forwarded_for` are the client's `X-Forwarded-For` values, the chain to extend.
    pub fn new<'h>(
        forwarded_for: impl Iterator<Item = &'h HeaderValue>,
        request_id: &'a RequestId,
        peer: &'a HeaderValue,
        proto: &'static str,
        host: Option<&'a HeaderValue>,
    ) -> Forwarding<'a> {
        let mut chain = String::new();
        for entry in forwarded_for
            .filter_map(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
        {
            chain.push_str(entry);
            chain.push_str(", ");
        }
        let forwarded_for = if chain.is_empty() {
            Some(Cow::Borrowed(peer))
        } else {
            chain.push_str(peer.to_str().unwrap_or_default());
            HeaderValue::from_str(&chain).ok().map(Cow::Owned)
        };
        Forwarding {
            request_id,
            host,
            forwarded_for,
            proto,
        }
    }

    /// Whether the request will carry a `Host` set here.
    pub fn sets_host(&self) -> bool {
        self.host.is_some()
    }

    /// Whether a field of the client's named `name` gives way to one of these.
    pub fn replaces(&self, name: &HeaderName) -> bool {
        *name == crate::gateway::X_REQUEST_ID
            || *name == X_FORWARDED_PROTO
            || (self.forwarded_for.is_some() && *name == X_FORWARDED_FOR)
            || (self.host.is_some() && (*name == header::HOST || *name == X_FORWARDED_HOST))
    }

    /// The fields as `(name, value)` pairs, in the order they are written.
    pub fn fields(&self) -> impl Iterator<Item = (&'static HeaderName, &[u8])> {
        let host = self
            .host
            .iter()
            .flat_map(|host| [(&HOST, *host), (&FORWARDED_HOST, *host)]);
        let forwarded_for = self
            .forwarded_for
            .iter()
            .map(|value| (&FORWARDED_FOR, value.as_ref()));
        host.chain(forwarded_for)
            .map(|(name, value)| (name, value.as_bytes()))
            .chain([
                (&FORWARDED_PROTO, self.proto.as_bytes()),
                (&REQUEST_ID_NAME, self.request_id.as_bytes()),
            ])
    }

    /// Puts the fields into `headers`, replacing the client's.
    pub fn apply(self, headers: &mut HeaderMap) {
        for (name, value) in self.fields() {
            // Every value is a header value's bytes or the request id's visible ASCII.
            if let Ok(value) = HeaderValue::from_bytes(value) {
                headers.insert(name.clone(), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_headers_append_the_peer() {
        let mut headers = HeaderMap::new();
        headers.append(X_FORWARDED_FOR, "1.1.1.1".parse().unwrap());
        headers.append(X_FORWARDED_FOR, "2.2.2.2".parse().unwrap());
        headers.append(X_FORWARDED_PROTO, "gopher".parse().unwrap());
        headers.append(crate::gateway::X_REQUEST_ID, "from-client".parse().unwrap());
        let host = HeaderValue::from_static("shop.example.com");
        let request_id = RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = peer_header("::ffff:10.0.0.1".parse().unwrap());
        let forwarding = Forwarding::new(
            headers.get_all(X_FORWARDED_FOR).iter(),
            &request_id,
            &peer,
            "http",
            Some(&host),
        );
        for name in headers.keys() {
            assert!(forwarding.replaces(name), "{name}");
        }
        let written: Vec<(String, String)> = forwarding
            .fields()
            .map(|(name, value)| (name.to_string(), String::from_utf8(value.to_vec()).unwrap()))
            .collect();
        let mut applied = headers.clone();
        forwarding.apply(&mut applied);
        assert_eq!(applied[X_FORWARDED_FOR], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(applied[X_FORWARDED_PROTO], "http");
        assert_eq!(applied[X_FORWARDED_HOST], "shop.example.com");
        assert_eq!(applied[header::HOST], "shop.example.com");
        assert_eq!(applied[crate::gateway::X_REQUEST_ID], "r-1");
        assert_eq!(applied.len(), 5, "the client's fields were replaced");
        // Written or applied, the request carries the same fields.
        let mut from_map: Vec<(String, String)> = applied
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect();
        let mut written = written;
        from_map.sort();
        written.sort();
        assert_eq!(written, from_map);
    }

    #[test]
    fn without_a_host_the_clients_host_fields_stay() {
        let request_id = RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding::new(std::iter::empty(), &request_id, &peer, "https", None);
        assert!(!forwarding.sets_host());
        assert!(!forwarding.replaces(&header::HOST));
        assert!(!forwarding.replaces(&X_FORWARDED_HOST));
        assert!(forwarding.replaces(&X_FORWARDED_FOR));
        assert!(!forwarding.replaces(&HeaderName::from_static("x-user-id")));
        let names: Vec<&str> = forwarding.fields().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["x-forwarded-for", "x-forwarded-proto", "x-request-id"]
        );
    }

    #[test]
    fn target_uris_join_base_path_and_request() {
        let target = UpstreamTarget {
            url: "http://127.0.0.1:3000/base/".parse().unwrap(),
            base_path: "/base".to_owned(),
        };
        let uri = target_uri(&target, "/login", Some("next=%2F"));
        assert_eq!(uri, "/base/login?next=%2F");
        assert_eq!(target_uri(&target, ASTERISK, None), "*");
    }
}
