//! A connection the listener let in: TLS terminated (within the header read timeout) when the
//! listener has it, then its requests served.

use std::sync::Arc;

use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;

use tokio::io::AsyncWriteExt;
use tokio_rustls::server::TlsStream;

use super::client_hello::{read_first_flight, Rewound, UNRECOGNIZED_NAME_ALERT};
use super::{serve_connection, ConnectionGuards};
use crate::connection::{Answering, Connection};
use crate::connection_limits::OpenConnection;
use crate::server::StreamExecutor;
use crate::shared::Shared;
use crate::tls::{HandshakeFailure, TlsListener, ACME_TLS_ALPN};

/// A connection let in, and what serves it.
pub(super) struct Accepted<A> {
    pub(super) shared: Arc<Shared>,
    pub(super) answering: A,
    pub(super) builder: Arc<auto::Builder<StreamExecutor>>,
    pub(super) guards: ConnectionGuards,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) tls: bool,
}

impl<A: Answering> Accepted<A> {
    /// Serves the connection from `client` (held open in `[server.connections]`'s count until
    /// it ends).
    pub(super) async fn serve(
        self,
        stream: TcpStream,
        client: std::net::IpAddr,
        open: Option<OpenConnection>,
    ) {
        let _open = open;
        let Accepted {
            shared,
            answering,
            builder,
            guards,
            shutdown,
            tls,
        } = self;
        if tls {
            serve_tls(stream, client, shared, answering, builder, guards, shutdown).await;
        } else {
            drop(shared);
            let connection = Connection::new(client, "http");
            serve_connection(stream, connection, answering, builder, guards, shutdown).await;
        }
    }
}

/// A TLS connection: its handshake within the header read timeout, then its requests. A
/// failed handshake is counted and logged at debug level: clients cause them.
async fn serve_tls<A: Answering>(
    stream: TcpStream,
    peer: std::net::IpAddr,
    shared: Arc<Shared>,
    answering: A,
    builder: Arc<auto::Builder<StreamExecutor>>,
    guards: ConnectionGuards,
    shutdown: watch::Receiver<bool>,
) {
    let Some(tls) = shared.tls.load_full() else {
        return;
    };
    let handshake = tokio::time::timeout(guards.header_read_timeout, handshake(stream, &tls));
    let handshake = handshake.await.unwrap_or(Err(HandshakeFailure::Timeout));
    let (mut stream, ja4) = match handshake {
        Ok(accepted) => accepted,
        Err(failure) => {
            shared.metrics.tls.handshake_failed(failure);
            tracing::debug!(%peer, reason = failure.as_str(), "TLS handshake failed");
            return;
        }
    };
    stream
        .get_mut()
        .0
        .handshake_done(shared.metrics.tls.clone(), peer);
    drop((tls, shared));
    if stream.get_ref().1.alpn_protocol() == Some(ACME_TLS_ALPN) {
        // A tls-alpn-01 validation: the handshake was all it asked for (RFC 8737).
        let _ = stream.shutdown().await;
        return;
    }
    let mut connection = Connection::new(peer, "https");
    connection.ja4 = ja4;
    let guards = ConnectionGuards {
        own_http1: guards.own_http1 && stream.get_ref().1.alpn_protocol() != Some(b"h2"),
        ..guards
    };
    let serving = serve_connection(stream, connection, answering, builder, guards, shutdown);
    Box::pin(serving).await;
}

/// Reads the ClientHello, answers a server name no certificate answers (and an ACME validation
/// no challenge is pending for) with the `unrecognized_name` alert, and completes the handshake; the connection's JA4 fingerprint
/// comes with the stream.
async fn handshake(
    mut stream: TcpStream,
    tls: &TlsListener,
) -> Result<(TlsStream<Rewound<TcpStream>>, Option<Arc<str>>), HandshakeFailure> {
    let flight = read_first_flight(&mut stream).await?;
    let name = flight.server_name();
    let challenge = flight.asks_acme_challenge();
    if tls
        .certificates
        .choose(name.as_deref(), challenge)
        .is_none()
    {
        let _ = stream.write_all(&UNRECOGNIZED_NAME_ALERT).await;
        return Err(HandshakeFailure::UnrecognizedName);
    }
    let ja4 = flight.fingerprint().map(Arc::from);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    match acceptor.accept(Rewound::new(flight.bytes, stream)).await {
        Ok(stream) => Ok((stream, ja4)),
        Err(error) => Err(HandshakeFailure::of(&error)),
    }
}
