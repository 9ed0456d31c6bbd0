//! Connections to one upstream address. HTTP/1.1 ones are kept alive: an idle connection that
//! is ready is reused (the most recently used first, it is the warmest), otherwise a new one
//! is opened (TCP, then TLS for `https://`). Requests with their body in memory use the
//! gateway's own client (`http1.rs`); streamed uploads and protocol switches use hyper's, on
//! connections of their own. A target that speaks HTTP/2 (`h2c://`, or `https://` whose TLS
//! picks `h2`) gets one connection that every request shares, on hyper's client: gRPC and
//! its trailers need it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self as hyper_http1, SendRequest};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use smallvec::SmallVec;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::http1::{self, IdleConnections, Stream};
use super::{Owner, UpstreamSetupError};
use crate::body::Body;
use crate::wire::message::{may_reuse_after, MAX_RESPONSE_HEAD_BYTES};

/// Idle connections kept per upstream address.
const MAX_IDLE: usize = 256;

/// Why no connection to an upstream address could be opened: nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{address}: {source}")]
    Tcp {
        address: String,
        source: std::io::Error,
    },
    #[error("TLS with {address}: {source}")]
    Tls {
        address: String,
        source: std::io::Error,
    },
    #[error("{address}: no connection within {after:?}")]
    Timeout { address: String, after: Duration },
    /// Connected, but the HTTP/1.1 or HTTP/2 handshake failed.
    #[error("handshake: {0}")]
    Handshake(hyper::Error),
    /// Every target of the upstream is down, or it has none.
    #[error("no upstream address")]
    NoTarget,
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum PoolError {
    /// No connection could be opened: nothing was sent.
    Connect(ConnectError),
    Exchange(String),
    /// The deadline passed before the response head.
    Timeout,
    /// The client's streamed body failed (see `ForwardError::ClientBody`).
    ClientBody,
}

impl From<http1::Failure> for PoolError {
    fn from(failure: http1::Failure) -> PoolError {
        if failure.timed_out {
            PoolError::Timeout
        } else {
            PoolError::Exchange(failure.message)
        }
    }
}

/// What a target speaks, as far as the pool knows.
const UNKNOWN: u8 = 0;
const HTTP1: u8 = 1;
const HTTP2: u8 = 2;

pub(crate) struct ConnectionPool {
    host: String,
    port: u16,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    connect_timeout: Duration,
    /// `HTTP1` for `http://`, `HTTP2` for `h2c://`; for `https://`, what the first connection's
    /// TLS picked (`UNKNOWN` until then).
    speaks: AtomicU8,
    /// The scheme and authority of HTTP/2 requests to this target.
    scheme: Scheme,
    authority: Authority,
    /// Idle HTTP/1.1 connections of hyper's client, each with the client it is kept for.
    idle: Mutex<Vec<(Owner, SendRequest<Body>)>>,
    /// The HTTP/2 connection every request shares (multiplexed), once opened.
    http2: Mutex<Option<http2::SendRequest<Body>>>,
    idle_own: Arc<IdleConnections>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl ConnectionPool {
    /// `tls` is the client configuration for an `https://` address.
    pub(crate) fn new(
        uri: &http::Uri,
        tls: Option<Arc<rustls::ClientConfig>>,
        connect_timeout: Duration,
    ) -> Result<ConnectionPool, UpstreamSetupError> {
        let unusable = |reason: String| UpstreamSetupError::Target {
            url: uri.to_string(),
            reason,
        };
        let host = uri.host().ok_or_else(|| unusable("no host".to_owned()))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = uri.scheme_str() == Some("https");
        let h2c = uri.scheme_str() == Some("h2c");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| unusable("no host".to_owned()))?;
        let tls = match (https, tls) {
            (true, Some(config)) => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|error| unusable(error.to_string()))?;
                Some((TlsConnector::from(config), name))
            }
            (true, None) => return Err(unusable("no TLS configuration".to_owned())),
            (false, _) => None,
        };
        Ok(ConnectionPool {
            host,
            port,
            tls,
            connect_timeout,
            speaks: AtomicU8::new(match (https, h2c) {
                (true, _) => UNKNOWN,
                (false, true) => HTTP2,
                (false, false) => HTTP1,
            }),
            scheme: if https { Scheme::HTTPS } else { Scheme::HTTP },
            authority,
            idle: Mutex::new(Vec::new()),
            http2: Mutex::new(None),
            idle_own: Arc::new(IdleConnections::new(MAX_IDLE)),
        })
    }

    /// Whether the target is known to speak HTTP/1.1, so that the gateway's own client can
    /// take a request to it.
    pub(crate) fn speaks_http1(&self) -> bool {
        self.speaks.load(Ordering::Relaxed) == HTTP1
    }

    /// Sends a request whose body is in memory and
    /// returns the response head, due by `deadline`. An idempotent request that a reused
    /// connection left unanswered (the upstream had just closed it) is sent again on a new
    /// connection.
    pub(crate) async fn send_buffered(
        &self,
        request: &http1::OutgoingRequest<'_>,
        deadline: tokio::time::Instant,
        owner: Owner,
    ) -> Result<Response<Body>, PoolError> {
        let method = request.method;
        if let Some(connection) = self.idle_own.checkout(owner) {
            match http1::exchange(connection, request, &self.idle_own, deadline, owner).await {
                Ok(response) => return Ok(response),
                Err(failure)
                    if failure.unanswered && !failure.timed_out && method.is_idempotent() =>
                {
                    tracing::debug!(error = %failure.message, "reused upstream connection failed; retrying on a new one");
                }
                Err(failure) => return Err(failure.into()),
            }
        }
        // Boxed: a new connection is the rare case, and inline its future would make every
        // request's future (and a connection's, copied when it starts) 1.4 KB larger.
        let stream = tokio::time::timeout_at(deadline, Box::pin(self.connect()))
            .await
            .map_err(|_| PoolError::Timeout)??;
        if negotiated_http2(&stream) {
            // The target moved to HTTP/2 since it last said: later requests take hyper's client.
            self.speaks.store(HTTP2, Ordering::Relaxed);
            return Err(PoolError::Exchange(
                "the upstream now picks HTTP/2".to_owned(),
            ));
        }
        let connection = http1::Connection::new(stream);
        http1::exchange(connection, request, &self.idle_own, deadline, owner)
            .await
            .map_err(PoolError::from)
    }

    /// Sends `request` (origin-form URI) and returns the response head. A request that a
    /// reused connection could not even start sending (the upstream had just closed it) is sent
    /// again on a new connection.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
        owner: Owner,
    ) -> Result<Response<Incoming>, PoolError> {
        if self.speaks.load(Ordering::Relaxed) == HTTP2 {
            return self.send_http2(request, None).await;
        }
        let method = request.method().clone();
        let request = match self.checkout(owner) {
            Some(mut sender) => match sender.try_send_request(request).await {
                Ok(response) => {
                    self.checkin_after(sender, owner, &method, &response);
                    return Ok(response);
                }
                Err(mut error) => match error.take_message() {
                    Some(request) => request,
                    None => return Err(PoolError::Exchange(error.into_error().to_string())),
                },
            },
            None => request,
        };
        let stream = self.connect().await?;
        if negotiated_http2(&stream) || self.speaks.load(Ordering::Relaxed) == HTTP2 {
            self.speaks.store(HTTP2, Ordering::Relaxed);
            return self.send_http2(request, Some(stream)).await;
        }
        self.speaks.store(HTTP1, Ordering::Relaxed);
        let mut sender = handshake(stream).await.map_err(PoolError::Connect)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| PoolError::Exchange(error.to_string()))?;
        self.checkin_after(sender, owner, &method, &response);
        Ok(response)
    }

    /// Sends `request` on the shared HTTP/2 connection, opening it (on `stream`, when one was
    /// just opened) if there is none or it closed.
    async fn send_http2(
        &self,
        request: Request<Body>,
        stream: Option<Stream>,
    ) -> Result<Response<Incoming>, PoolError> {
        let shared = self
            .http2
            .lock()
            .as_ref()
            .filter(|sender| !sender.is_closed())
            .cloned();
        let mut sender = match shared {
            Some(sender) => sender,
            None => {
                let stream = match stream {
                    Some(stream) => stream,
                    None => self.connect().await?,
                };
                let sender = handshake_http2(stream).await.map_err(PoolError::Connect)?;
                *self.http2.lock() = Some(sender.clone());
                sender
            }
        };
        sender
            .ready()
            .await
            .map_err(|error| PoolError::Exchange(error.to_string()))?;
        sender
            .send_request(for_http2(request, &self.scheme, &self.authority))
            .await
            .map_err(|error| PoolError::Exchange(error.to_string()))
    }

    /// The warmest ready connection kept for `owner`.
    fn checkout(&self, owner: Owner) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock();
        // Connections still streaming a response body, or kept for other clients, stay.
        let mut passed: SmallVec<[(Owner, SendRequest<Body>); 8]> = SmallVec::new();
        let mut found = None;
        while let Some((kept_for, sender)) = idle.pop() {
            if kept_for == owner && sender.is_ready() {
                found = Some(sender);
                break;
            }
            if !sender.is_closed() {
                passed.push((kept_for, sender));
            }
        }
        idle.extend(passed.into_iter().rev());
        found
    }

    /// Keeps the connection for the next request of `owner`, unless the response leaves it
    /// suspect (`message::may_reuse_after`): then it closes once the response body ends.
    fn checkin_after(
        &self,
        sender: SendRequest<Body>,
        owner: Owner,
        method: &http::Method,
        response: &Response<Incoming>,
    ) {
        if !may_reuse_after(method, response.status(), response.headers()) {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push((owner, sender));
        }
    }

    async fn connect(&self) -> Result<Stream, PoolError> {
        let address = || format!("{}:{}", self.host, self.port);
        let connect = async {
            let stream = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|source| ConnectError::Tcp {
                    address: address(),
                    source,
                })?;
            let _ = stream.set_nodelay(true);
            match &self.tls {
                None => Ok(Stream::Plain(stream)),
                Some((connector, name)) => connector
                    .connect(name.clone(), stream)
                    .await
                    .map(|stream| Stream::Tls(Box::new(stream)))
                    .map_err(|source| ConnectError::Tls {
                        address: address(),
                        source,
                    }),
            }
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(result) => result.map_err(PoolError::Connect),
            Err(_) => Err(PoolError::Connect(ConnectError::Timeout {
                address: address(),
                after: self.connect_timeout,
            })),
        }
    }
}

/// Whether the TLS of `stream` picked HTTP/2.
fn negotiated_http2(stream: &Stream) -> bool {
    match stream {
        Stream::Plain(_) => false,
        Stream::Tls(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
    }
}

/// A request as HTTP/2 carries it: the authority (the client's `Host`, else the target's) and
/// scheme in the URI, no HTTP/1.1 framing fields, and `te: trailers` for gRPC, whose servers
/// may insist on it.
fn for_http2(request: Request<Body>, scheme: &Scheme, target: &Authority) -> Request<Body> {
    let (mut parts, body) = request.into_parts();
    let authority = parts
        .headers
        .remove(header::HOST)
        .and_then(|host| Authority::try_from(host.as_bytes()).ok())
        .unwrap_or_else(|| target.clone());
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(scheme.clone());
    uri.authority = Some(authority);
    uri.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = Uri::from_parts(uri).unwrap_or(parts.uri);
    parts.version = Version::HTTP_2;
    parts.headers.remove(header::TRANSFER_ENCODING);
    let grpc = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| crate::grpc::is_grpc(value.as_bytes()));
    if grpc {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    Request::from_parts(parts, body)
}

async fn handshake_http2(stream: Stream) -> Result<http2::SendRequest<Body>, ConnectError> {
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .max_header_list_size(MAX_RESPONSE_HEAD_BYTES as u32)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream HTTP/2 connection ended with an error");
        }
    });
    Ok(sender)
}

async fn handshake<S>(stream: S) -> Result<SendRequest<Body>, ConnectError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper_http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_HEAD_BYTES)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}
