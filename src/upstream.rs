//! Forwarding to upstreams: pooled keep-alive connections, round-robin over an upstream's
//! addresses (skipping ones that just refused a connection), timeouts, and the header
//! rewriting a reverse proxy owes both sides.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};

mod connection_pool;
mod forwarding;
mod http1;
mod watched_body;

use std::sync::Arc;

pub use connection_pool::ConnectError;
use connection_pool::{ConnectionPool, PoolError};
pub use forwarding::{peer_header, Forwarding, X_FORWARDED_FOR};
use smallvec::SmallVec;
use watched_body::WatchedBody;

use crate::body::Body;
use crate::config::{Reuse, Upstream, UpstreamTarget};
use crate::limit::clock;
use crate::request_body::RequestBody;
use crate::tls;
use crate::wire::message::response_head_too_large;

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
    Connect(ConnectError),
    #[error("no response head within {0:?}")]
    Timeout(Duration),
    #[error("upstream exchange failed: {0}")]
    Exchange(String),
    /// The client's body, streamed upstream, broke off or was malformed (bad chunking): the
    /// client's doing, not the upstream's.
    #[error("the request body could not be read")]
    ClientBody,
}

/// Whom an idle upstream connection is kept for: 0 for any client (`reuse = "shared"`), else
/// the client connection whose requests alone it carries (`reuse = "per_client"`).
pub(crate) type Owner = u64;

/// Why an upstream's client could not be set up (at start or reload): the policy's to mend.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    /// A target URL the client cannot use.
    #[error("{url}: {reason}")]
    Target { url: String, reason: String },
    /// A compiled route names an upstream the runtime has no pool for.
    #[error("route {0:?}: no pool for its upstream")]
    NoPool(String),
}

/// A request body on its way upstream: streamed as it arrives, or already in memory (then it
/// can be sent again to another address when the first refuses the connection).
pub(crate) enum OutgoingBody {
    Streamed(RequestBody),
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
    owner: Owner,
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
    pub fn new(settings: &Upstream) -> Result<UpstreamPool, UpstreamSetupError> {
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
    pub(crate) async fn send(
        &self,
        request: http::request::Parts,
        forwarding: Forwarding<'_>,
        path: &str,
        body: OutgoingBody,
        sent: Instant,
        client: u64,
    ) -> Result<Response<Body>, ForwardError> {
        let deadline = tokio::time::Instant::from_std(sent + self.settings.timeout);
        let owner = match self.settings.reuse {
            Reuse::Shared => 0,
            Reuse::PerClient => client,
        };
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
        let response = self.exchange(&mut outgoing, path, deadline, owner).await;
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
        owner: Owner,
    ) -> Result<Response<Body>, ForwardError> {
        let order = self.order();
        // Spelled out only when no target answers: not an allocation per request.
        let mut last_error = None;
        for (attempt, index) in order.iter().enumerate() {
            let more = attempt + 1 < order.len();
            let target = Target {
                index: *index,
                path,
                owner,
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
        Target { index, path, owner }: Target<'_>,
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
        self.pools[index]
            .send_buffered(&outgoing, deadline, owner)
            .await
    }

    /// One attempt on hyper's client, for streamed bodies and protocol switches. The body
    /// goes with it; a body in memory is kept for another attempt when `more` targets remain
    /// (the request head is copied only then).
    async fn send_with_hyper(
        &self,
        Target { index, path, owner }: Target<'_>,
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
            .send(Request::from_parts(parts, outgoing_body), owner)
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
    ForwardError::Connect(ConnectError::NoTarget)
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

#[cfg(test)]
mod tests {
    use super::*;

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
