//! A connection the listener let in: TLS terminated (within the header read timeout) when the
//! listener has it, then its requests served.

use std::sync::Arc;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::client_hello::HelloRecorder;
use super::{serve_connection, ConnectionGuards};
use crate::connection::{Answering, Connection};
use crate::connection_limits::OpenConnection;
use crate::shared::Shared;

/// A connection let in, and what serves it.
pub(super) struct Accepted<A> {
    pub(super) shared: Arc<Shared>,
    pub(super) answering: A,
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
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
            let acceptor = shared.tls.load_full();
            drop(shared);
            serve_tls(
                stream, client, acceptor, answering, builder, guards, shutdown,
            )
            .await;
        } else {
            drop(shared);
            let connection = Connection::new(client, "http");
            serve_connection(stream, connection, answering, builder, guards, shutdown).await;
        }
    }
}

/// A TLS connection: its handshake (recording the ClientHello for its JA4) within the header
/// read timeout, then its requests.
async fn serve_tls<A: Answering>(
    stream: TcpStream,
    peer: std::net::IpAddr,
    acceptor: Option<Arc<tokio_rustls::TlsAcceptor>>,
    answering: A,
    builder: Arc<auto::Builder<TokioExecutor>>,
    guards: ConnectionGuards,
    shutdown: watch::Receiver<bool>,
) {
    let Some(acceptor) = acceptor else {
        return;
    };
    let handshake = acceptor.accept(HelloRecorder::new(stream));
    match tokio::time::timeout(guards.header_read_timeout, handshake).await {
        Ok(Ok(mut stream)) => {
            let mut connection = Connection::new(peer, "https");
            connection.ja4 = stream.get_mut().0.fingerprint().map(Arc::from);
            let guards = ConnectionGuards {
                own_http1: guards.own_http1 && stream.get_ref().1.alpn_protocol() != Some(b"h2"),
                ..guards
            };
            let serving =
                serve_connection(stream, connection, answering, builder, guards, shutdown);
            Box::pin(serving).await;
        }
        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}
