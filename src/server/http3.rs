//! HTTP/3 over QUIC (`[server.http3]`). Each UDP listener judges a new connection by its first
//! packet (a Retry first when handshakes pile up or its network connects too fast:
//! `validation.rs`), handshakes with the TCP listeners' certificates, counts the connection in
//! `[server.connections]` once its address is proven, and hands each request to the same
//! answerer as HTTP/1.1 and HTTP/2. Migration is off: a client that moves opens a new
//! connection, validated again. Requests that arrive in 0-RTT early data (`early_data = true`)
//! before the handshake completes are forwarded only when safe, with `Early-Data: 1`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::config::{Http3Settings, Policy, ServerSettings};
use crate::connection::{Answering, Connection};
use crate::errors::StartError;
use crate::request_body::{QuicBody, RequestBody};
use crate::respond::{self, SetFields};
use crate::shared::Shared;
use crate::tls::{HandshakeFailure, TlsListener};
use crate::wire::message;
use initials::{InitialsSocket, KeptInitials};
use validation::FirstPacket;

mod initials;
mod response;
mod validation;

/// How long a drained connection waits for its client to close it.
const CLOSE_AFTER_DRAIN: Duration = Duration::from_secs(1);

/// `Early-Data` (RFC 8470), on requests forwarded before the client's handshake completed.
static EARLY_DATA: header::HeaderName = header::HeaderName::from_static("early-data");

/// Binds `[server.http3]`'s UDP listeners and serves each as a task of `listeners` until
/// `shutdown`; the TCP TLS listeners then advertise the first in `Alt-Svc`. The bound
/// addresses.
pub(crate) fn listen<A: Answering>(
    policy: &Policy,
    shared: &Arc<Shared>,
    answering: &A,
    listeners: &TaskTracker,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<SocketAddr>, StartError> {
    let Some(settings) = &policy.server.http3 else {
        return Ok(Vec::new());
    };
    let mut bound = Vec::new();
    for address in &settings.listen {
        let listener = bind(*address, shared, &policy.server, settings)?;
        bound.push(listener.address);
        if shared.alt_svc.get().is_none() {
            let advertised = format!("h3=\":{}\"; ma=86400", listener.address.port());
            let _ = shared
                .alt_svc
                .set(HeaderValue::from_str(&advertised).expect("a valid Alt-Svc"));
        }
        tracing::info!(address = %listener.address, "listening for HTTP/3 (QUIC)");
        listeners.spawn(serve(
            listener,
            shared.clone(),
            answering.clone(),
            policy.server.clone(),
            settings.clone(),
            shutdown.clone(),
        ));
    }
    Ok(bound)
}

/// A UDP socket on `address` serving QUIC with the current certificates.
fn bind(
    address: SocketAddr,
    shared: &Shared,
    settings: &ServerSettings,
    http3: &Http3Settings,
) -> Result<QuicListener, StartError> {
    let listen_error = |source| StartError::Listen { address, source };
    let tls = shared.tls.load_full().ok_or_else(|| {
        listen_error(std::io::Error::other(
            "HTTP/3 needs the TLS listeners' certificates",
        ))
    })?;
    let config = server_config(&tls, settings, http3).map_err(listen_error)?;
    let socket = std::net::UdpSocket::bind(address).map_err(listen_error)?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let initials = Arc::new(KeptInitials::default());
    let socket = InitialsSocket {
        inner: quinn::Runtime::wrap_udp_socket(&*runtime, socket).map_err(listen_error)?,
        kept: initials.clone(),
    };
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some((*config).clone()),
        Arc::new(socket),
        runtime,
    )
    .map_err(listen_error)?;
    let bound = endpoint.local_addr().map_err(listen_error)?;
    Ok(QuicListener {
        endpoint,
        initials,
        address: bound,
    })
}

/// A bound UDP listener.
struct QuicListener {
    endpoint: quinn::Endpoint,
    /// What its socket keeps of new connections' Initials, for their JA4.
    initials: Arc<KeptInitials>,
    address: SocketAddr,
}

/// QUIC's configuration for the certificates `tls` serves: no migration, the server's idle
/// timeout, and 0-RTT when `early_data`.
fn server_config(
    tls: &TlsListener,
    settings: &ServerSettings,
    http3: &Http3Settings,
) -> Result<Arc<quinn::ServerConfig>, std::io::Error> {
    let crypto = tls
        .quic_config(http3.early_data)
        .map_err(std::io::Error::other)?;
    let crypto =
        quinn::crypto::rustls::QuicServerConfig::try_from(crypto).map_err(std::io::Error::other)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(settings.idle_timeout)
        .unwrap_or_else(|_| quinn::IdleTimeout::from(quinn::VarInt::MAX));
    transport.max_idle_timeout(Some(idle));
    config.transport_config(Arc::new(transport));
    config.migration(false);
    Ok(Arc::new(config))
}

/// What every connection of one UDP listener shares.
#[derive(Clone)]
struct Listening<A> {
    shared: Arc<Shared>,
    answering: A,
    settings: Arc<ServerSettings>,
    early_data: bool,
    handshakes: Arc<AtomicUsize>,
    initials: Arc<KeptInitials>,
    shutdown: watch::Receiver<bool>,
}

/// Accepts QUIC connections until shutdown; each is a task of the gateway's tracker. After
/// shutdown the endpoint takes no new connection; those open finish their requests.
async fn serve<A: Answering>(
    QuicListener {
        endpoint, initials, ..
    }: QuicListener,
    shared: Arc<Shared>,
    answering: A,
    settings: ServerSettings,
    http3: Http3Settings,
    mut shutdown: watch::Receiver<bool>,
) {
    let listening = Listening {
        shared,
        answering,
        settings: Arc::new(settings),
        early_data: http3.early_data,
        handshakes: Arc::new(AtomicUsize::new(0)),
        initials,
        shutdown: shutdown.clone(),
    };
    // The certificates a reload put in place are taken up by the next connection.
    let mut current: Option<(Arc<TlsListener>, Arc<quinn::ServerConfig>)> = None;
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = shutdown.changed() => break,
        };
        let Some(incoming) = incoming else {
            break;
        };
        let shared = &listening.shared;
        let peer = incoming.remote_address().ip().to_canonical();
        let runtime = shared.runtime.load();
        let source = crate::connection_limits::source(peer, &runtime.policy.client_ip);
        let exhausted = shared
            .connections
            .rate_exhausted(&runtime.policy.server.connections, &source);
        drop(runtime);
        let handshakes = listening.handshakes.load(Ordering::Relaxed);
        let first =
            validation::first_packet(incoming.remote_address_validated(), handshakes, exhausted);
        if first == FirstPacket::Retry && incoming.may_retry() {
            shared.metrics.connections.quic_retries.inc();
            let _ = incoming.retry();
            continue;
        }
        let Some(tls) = shared.tls.load_full() else {
            incoming.refuse();
            continue;
        };
        let config = match &current {
            Some((serving, config)) if Arc::ptr_eq(serving, &tls) => config.clone(),
            _ => match server_config(&tls, &listening.settings, &http3) {
                Ok(config) => {
                    current = Some((tls, config.clone()));
                    config
                }
                Err(error) => {
                    tracing::warn!(%error, "HTTP/3 cannot use the certificates");
                    incoming.refuse();
                    continue;
                }
            },
        };
        // Counted here, not in the task: the next packet is judged before the task runs.
        let handshaking = Handshaking::new(&listening.handshakes);
        let connection = listening.clone().connection(incoming, config, handshaking);
        listening.shared.tasks.spawn(Box::pin(connection));
    }
    endpoint.set_server_config(None);
    tracing::info!("HTTP/3 listener closed");
}

/// Counted in the handshakes in progress while alive.
struct Handshaking(Arc<AtomicUsize>);

impl Handshaking {
    fn new(count: &Arc<AtomicUsize>) -> Handshaking {
        count.fetch_add(1, Ordering::Relaxed);
        Handshaking(count.clone())
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<A: Answering> Listening<A> {
    /// One connection: its handshake within the header read timeout (or, with 0-RTT, its
    /// requests served while the handshake completes), its place in `[server.connections]`,
    /// then its requests, each a task, until the client closes or shutdown drains it.
    async fn connection(
        self,
        incoming: quinn::Incoming,
        config: Arc<quinn::ServerConfig>,
        handshaking: Handshaking,
    ) {
        let remote = incoming.remote_address();
        let peer = remote.ip().to_canonical();
        let connecting = match incoming.accept_with(config) {
            Ok(connecting) => connecting,
            Err(error) => {
                tracing::debug!(%peer, %error, "QUIC connection refused");
                return;
            }
        };
        let timeout = self.settings.header_read_timeout;
        let handshake_done = Arc::new(AtomicBool::new(!self.early_data));
        let quic = if self.early_data {
            match connecting.into_0rtt() {
                Ok((quic, accepted)) => {
                    let (done, quic_watched) = (handshake_done.clone(), quic.clone());
                    let metrics = self.shared.metrics.tls.clone();
                    tokio::spawn(async move {
                        let _handshaking = handshaking;
                        match tokio::time::timeout(timeout, accepted).await {
                            Ok(true) => done.store(true, Ordering::Release),
                            // The connection failed: its requests fail with it.
                            Ok(false) => {}
                            Err(_) => {
                                metrics.handshake_failed(HandshakeFailure::Timeout);
                                quic_watched.close(0u32.into(), b"handshake timeout");
                            }
                        }
                    });
                    quic
                }
                Err(connecting) => match self.handshake(connecting, timeout, peer).await {
                    Some(quic) => {
                        handshake_done.store(true, Ordering::Release);
                        quic
                    }
                    None => return,
                },
            }
        } else {
            let quic = self.handshake(connecting, timeout, peer).await;
            drop(handshaking);
            match quic {
                Some(quic) => quic,
                None => return,
            }
        };
        // The policy in force now, not held for the connection's life: a reload changes the
        // next connection's limits, and a held guard would keep the old runtime alive.
        let open = super::edge::admit(&self.shared, &self.shared.runtime.load().policy, peer);
        let Some(_open) = open else {
            quic.close(code(h3::error::Code::H3_EXCESSIVE_LOAD), b"");
            return;
        };
        let mut connection = Connection::new(peer, "https");
        connection.http3 = true;
        connection.ja4 = self.initials.fingerprint(remote);
        self.requests(quic, Arc::new(connection), handshake_done)
            .await;
    }

    /// The handshake within `timeout`; a failure is counted and logged at debug level.
    async fn handshake(
        &self,
        connecting: quinn::Connecting,
        timeout: Duration,
        peer: std::net::IpAddr,
    ) -> Option<quinn::Connection> {
        let failure = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(quic)) => return Some(quic),
            Ok(Err(quinn::ConnectionError::TimedOut)) | Err(_) => HandshakeFailure::Timeout,
            Ok(Err(quinn::ConnectionError::ApplicationClosed(_)))
            | Ok(Err(quinn::ConnectionError::ConnectionClosed(_)))
            | Ok(Err(quinn::ConnectionError::Reset)) => HandshakeFailure::Closed,
            Ok(Err(_)) => HandshakeFailure::Other,
        };
        self.shared.metrics.tls.handshake_failed(failure);
        tracing::debug!(%peer, reason = failure.as_str(), "QUIC handshake failed");
        None
    }

    /// Serves the connection's requests, each a task, until the client closes it or shutdown
    /// drains it: no new request, those in flight answered, then the connection closed.
    async fn requests(
        &self,
        quic: quinn::Connection,
        connection: Arc<Connection>,
        handshake_done: Arc<AtomicBool>,
    ) {
        let mut builder = h3::server::builder();
        builder.max_field_section_size(self.settings.max_header_bytes as u64);
        let Ok(mut h3) = builder
            .build::<_, Bytes>(h3_quinn::Connection::new(quic.clone()))
            .await
        else {
            return;
        };
        let in_flight = TaskTracker::new();
        let mut shutdown = self.shutdown.clone();
        loop {
            let accepted = tokio::select! {
                accepted = h3.accept() => accepted,
                _ = shutdown.changed() => {
                    let _ = h3.shutdown(0).await;
                    break;
                }
            };
            let Ok(Some(resolver)) = accepted else {
                break;
            };
            let early = !handshake_done.load(Ordering::Acquire);
            let request = self.clone().request(resolver, connection.clone(), early);
            in_flight.spawn(Box::pin(request));
        }
        in_flight.close();
        in_flight.wait().await;
        // Closing at once could drop the last responses' unacknowledged data: a moment for
        // the client, which GOAWAY told to go, to close first.
        let _ = tokio::time::timeout(CLOSE_AFTER_DRAIN, quic.closed()).await;
        quic.close(code(h3::error::Code::H3_NO_ERROR), b"");
    }

    /// One request: its head within the header read timeout, then the answer, written back.
    async fn request(
        self,
        resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
        connection: Arc<Connection>,
        early: bool,
    ) {
        let timeout = self.settings.header_read_timeout;
        let Ok(Ok((request, stream))) =
            tokio::time::timeout(timeout, resolver.resolve_request()).await
        else {
            return;
        };
        let (mut send, recv) = stream.split();
        let (mut parts, ()) = request.into_parts();
        // HTTP/3 has no connection-specific fields (RFC 9114 §4.2), and so no upgrades.
        message::remove_hop_by_hop(&mut parts.headers, false);
        let head_only = parts.method == Method::HEAD;
        let response = if early && !is_safe(&parts.method) {
            respond::error(
                StatusCode::TOO_EARLY,
                "too_early",
                Some("sent in 0-RTT early data: send it again once the handshake is complete"),
            )
        } else {
            if early {
                parts
                    .headers
                    .insert(EARLY_DATA.clone(), HeaderValue::from_static("1"));
            }
            let declared = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok()?.parse().ok());
            let body = RequestBody::Quic(Box::new(QuicBody::new(recv, declared)));
            let mut fields = SetFields::default();
            let answer =
                self.answering
                    .answer(Request::from_parts(parts, body), &connection, &mut fields);
            let mut response = Box::pin(answer).await;
            fields.apply(response.headers_mut());
            response
        };
        let _ = response::send_response(&mut send, response, head_only).await;
    }
}

/// An HTTP/3 error code as QUIC's CONNECTION_CLOSE carries it.
fn code(code: h3::error::Code) -> quinn::VarInt {
    quinn::VarInt::from_u64(code.value()).unwrap_or_default()
}

/// Methods that RFC 9110 calls safe: an early request of these may be replayed harmlessly.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}
