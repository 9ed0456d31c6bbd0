//! What a listener checks of a connection before it reads a byte of its request: the PROXY
//! header a load balancer of `proxy_protocol.from` must send first (which names the client),
//! and, on the proxy listeners, `[server.connections]`. A connection that fails either is
//! closed and counted.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::config::Policy;
use crate::connection_limits::{self, OpenConnection, Refusal};
use crate::proxy_protocol::{self, HeaderError, Version, V1_MAX, V2_FIXED};
use crate::shared::Shared;

/// Which listener accepted: only the proxy's connections are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    Proxy,
    Decision,
}

/// Whether `peer` must begin with a PROXY header.
pub(super) fn expects_header(policy: &Policy, peer: IpAddr) -> bool {
    policy
        .server
        .proxy_protocol
        .as_ref()
        .is_some_and(|proxy_protocol| proxy_protocol.expected_from(peer))
}

/// Reads the PROXY header within `timeout`: the client it names, or the peer for a health
/// check's. `None`, counted: no valid header in time; the connection is to be closed.
pub(super) async fn client_from_header(
    shared: &Shared,
    stream: &mut TcpStream,
    peer: IpAddr,
    timeout: Duration,
) -> Option<IpAddr> {
    let read = tokio::time::timeout(timeout, read_header(stream))
        .await
        .unwrap_or_else(|_| {
            Err(HeaderError(
                "no PROXY header within header_read_timeout".to_owned(),
            ))
        });
    match read {
        Ok(client) => Some(client.map_or(peer, |client| client.ip().to_canonical())),
        Err(error) => {
            tracing::debug!(%peer, %error, "closed: no valid PROXY header");
            shared.metrics.connections.refused(Refusal::ProxyProtocol);
            None
        }
    }
}

/// Counts a proxy listener's connection from `client` open, or closes it (the stream is
/// dropped by the caller) and counts why.
pub(super) fn admit(shared: &Shared, policy: &Policy, client: IpAddr) -> Option<OpenConnection> {
    let source = connection_limits::source(client, &policy.client_ip);
    let limits = &policy.server.connections;
    match shared.connections.admit(limits, &source) {
        Ok(open) => Some(open),
        Err(refusal) => {
            tracing::debug!(%client, reason = refusal.as_str(), "connection refused");
            shared.metrics.connections.refused(refusal);
            None
        }
    }
}

/// Reads exactly the header, not a byte of what follows it: the first byte tells the
/// version; a v2 header's fixed part its length; a v1 header ends at its CRLF, found in what
/// has arrived, or else read a byte at a time.
async fn read_header(stream: &mut TcpStream) -> Result<Option<std::net::SocketAddr>, HeaderError> {
    let lost = |error: std::io::Error| HeaderError(format!("the connection failed: {error}"));
    let mut arrived = [0u8; V1_MAX];
    let seen = stream.peek(&mut arrived).await.map_err(lost)?;
    if seen == 0 {
        return Err(HeaderError("closed before a PROXY header".to_owned()));
    }
    let header = match proxy_protocol::version(arrived[0])? {
        Version::V2 => {
            let mut fixed = [0u8; V2_FIXED];
            stream.read_exact(&mut fixed).await.map_err(lost)?;
            let mut header = vec![0u8; proxy_protocol::v2_length(&fixed)?];
            header[..V2_FIXED].copy_from_slice(&fixed);
            stream
                .read_exact(&mut header[V2_FIXED..])
                .await
                .map_err(lost)?;
            header
        }
        Version::V1 => match proxy_protocol::v1_end(&arrived[..seen]) {
            Some(end) => {
                let mut header = vec![0u8; end];
                stream.read_exact(&mut header).await.map_err(lost)?;
                header
            }
            None => read_v1_slowly(stream).await?,
        },
    };
    proxy_protocol::client(&header)
}

/// A v1 header that arrives in pieces: a byte at a time up to its CRLF.
async fn read_v1_slowly(stream: &mut TcpStream) -> Result<Vec<u8>, HeaderError> {
    let mut header = Vec::with_capacity(V1_MAX);
    while proxy_protocol::v1_end(&header).is_none() {
        if header.len() == V1_MAX {
            return Err(HeaderError(format!(
                "no CRLF within a v1 header's {V1_MAX} bytes"
            )));
        }
        let byte = stream
            .read_u8()
            .await
            .map_err(|error| HeaderError(format!("the connection failed: {error}")))?;
        header.push(byte);
    }
    Ok(header)
}
