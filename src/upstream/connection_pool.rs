//! Keep-alive HTTP/1.1 connections to one upstream address: an idle connection that is ready
//! is reused (the most recently used first, it is the warmest), otherwise a new one is opened
//! (TCP, then TLS for `https://`). Requests with their body in memory use the gateway's own
//! client (`http1.rs`); streamed uploads and protocol switches use hyper's, on connections of
//! their own.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self as hyper_http1, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use smallvec::SmallVec;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::http1::{self, IdleConnections, Stream};
use crate::wire::message::MAX_RESPONSE_HEAD_BYTES;
use crate::Body;

/// Idle connections kept per upstream address.
const MAX_IDLE: usize = 256;

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum PoolError {
    /// No connection could be opened: nothing was sent.
    Connect(String),
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

pub(crate) struct ConnectionPool {
    host: String,
    port: u16,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    connect_timeout: Duration,
    idle: Mutex<Vec<SendRequest<Body>>>,
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
    ) -> Result<ConnectionPool, String> {
        let host = uri.host().ok_or_else(|| format!("{uri}: no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (https, tls) {
            (true, Some(config)) => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|error| format!("{uri}: {error}"))?;
                Some((TlsConnector::from(config), name))
            }
            (true, None) => return Err(format!("{uri}: no TLS configuration")),
            (false, _) => None,
        };
        Ok(ConnectionPool {
            host,
            port,
            tls,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            idle_own: Arc::new(IdleConnections::new(MAX_IDLE)),
        })
    }

    /// Sends a request whose body is in memory and
    /// returns the response head, due by `deadline`. An idempotent request that a reused
    /// connection left unanswered (the upstream had just closed it) is sent again on a new
    /// connection.
    pub(crate) async fn send_buffered(
        &self,
        request: &http1::OutgoingRequest<'_>,
        deadline: tokio::time::Instant,
    ) -> Result<Response<Body>, PoolError> {
        let method = request.method;
        if let Some(connection) = self.idle_own.checkout() {
            match http1::exchange(connection, request, &self.idle_own, deadline).await {
                Ok(response) => return Ok(response),
                Err(failure)
                    if failure.unanswered && !failure.timed_out && method.is_idempotent() =>
                {
                    tracing::debug!(error = %failure.message, "reused upstream connection failed; retrying on a new one");
                }
                Err(failure) => return Err(failure.into()),
            }
        }
        let stream = tokio::time::timeout_at(deadline, self.connect())
            .await
            .map_err(|_| PoolError::Timeout)??;
        let connection = http1::Connection::new(stream);
        http1::exchange(connection, request, &self.idle_own, deadline)
            .await
            .map_err(PoolError::from)
    }

    /// Sends `request` (origin-form URI) and returns the response head. A request that a
    /// reused connection could not even start sending (the upstream had just closed it) is sent
    /// again on a new connection.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, PoolError> {
        let request = match self.checkout() {
            Some(mut sender) => match sender.try_send_request(request).await {
                Ok(response) => {
                    self.checkin(sender);
                    return Ok(response);
                }
                Err(mut error) => match error.take_message() {
                    Some(request) => request,
                    None => return Err(PoolError::Exchange(error.into_error().to_string())),
                },
            },
            None => request,
        };
        let mut sender = handshake(self.connect().await?)
            .await
            .map_err(PoolError::Connect)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| PoolError::Exchange(error.to_string()))?;
        self.checkin(sender);
        Ok(response)
    }

    fn checkout(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock();
        // Connections still streaming a response body are kept for later.
        let mut busy: SmallVec<[SendRequest<Body>; 8]> = SmallVec::new();
        let mut found = None;
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                found = Some(sender);
                break;
            }
            if !sender.is_closed() {
                busy.push(sender);
            }
        }
        idle.extend(busy.into_iter().rev());
        found
    }

    fn checkin(&self, sender: SendRequest<Body>) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }

    async fn connect(&self) -> Result<Stream, PoolError> {
        let connect = async {
            let stream = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|error| format!("{}:{}: {error}", self.host, self.port))?;
            let _ = stream.set_nodelay(true);
            match &self.tls {
                None => Ok(Stream::Plain(stream)),
                Some((connector, name)) => connector
                    .connect(name.clone(), stream)
                    .await
                    .map(|stream| Stream::Tls(Box::new(stream)))
                    .map_err(|error| format!("TLS with {}:{}: {error}", self.host, self.port)),
            }
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(result) => result.map_err(PoolError::Connect),
            Err(_) => Err(PoolError::Connect(format!(
                "{}:{}: no connection within {:?}",
                self.host, self.port, self.connect_timeout
            ))),
        }
    }
}

async fn handshake<S>(stream: S) -> Result<SendRequest<Body>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper_http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_HEAD_BYTES)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|error| error.to_string())?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}
