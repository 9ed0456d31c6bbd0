//! Listeners and connections: accept, terminate TLS when configured, serve HTTP/1.1
//! (keep-alive, upgrades) and HTTP/2 (ALPN, or h2c with prior knowledge) on the same port, enforce the connection-level guards (header read timeout,
//! header size, idle timeout), and drain on shutdown.

use std::pin::pin;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServerSettings;
use crate::gateway::{Connection, Gateway};

/// hyper's smallest read buffer.
const MIN_BUFFER: usize = 8192;

/// Accepts connections until shutdown; each connection is a task of the gateway's tracker.
pub(crate) async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    settings: ServerSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(connection_builder(&settings));
    let tls = settings.tls.is_some();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let peer = peer.ip().to_canonical();
        let (gateway, builder, shutdown) = (gateway.clone(), builder.clone(), shutdown.clone());
        let (idle_timeout, handshake_timeout) =
            (settings.idle_timeout, settings.header_read_timeout);
        gateway.shared.tasks.clone().spawn(async move {
            if !tls {
                let connection = Connection::new(peer, "http");
                return serve_connection(
                    stream,
                    connection,
                    gateway,
                    builder,
                    idle_timeout,
                    shutdown,
                )
                .await;
            }
            let Some(acceptor) = gateway.shared.tls.load_full() else {
                return;
            };
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let connection = Connection::new(peer, "https");
                    serve_connection(stream, connection, gateway, builder, idle_timeout, shutdown)
                        .await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
    tracing::info!("listener closed");
}

fn connection_builder(settings: &ServerSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(MIN_BUFFER))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

async fn serve_connection<S>(
    stream: S,
    connection: Connection,
    gateway: Gateway,
    builder: Arc<auto::Builder<TokioExecutor>>,
    idle_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(TrackedStream {
        inner: stream,
        activity: activity.clone(),
    });
    let peer = connection.peer;
    let service = service_fn(move |request| {
        let (gateway, connection) = (gateway.clone(), connection.clone());
        async move { Ok::<_, std::convert::Infallible>(gateway.handle(request, connection).await) }
    });
    let mut conn = pin!(builder.serve_connection_with_upgrades(io, service));
    let check_every = (idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut draining = *shutdown.borrow();
    let (mut last_moves, mut quiet_since) = (activity.count(), Instant::now());
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
                break;
            }
            _ = shutdown.changed(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep(check_every), if !draining => {
                let moves = activity.count();
                if moves != last_moves {
                    (last_moves, quiet_since) = (moves, Instant::now());
                } else if quiet_since.elapsed() >= idle_timeout {
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
            }
        }
    }
}

/// Whether a connection moved bytes: a counter bumped on every read and write, compared
/// between checks (cheaper than reading the clock on every I/O).
struct Activity {
    moves: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            moves: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        self.moves.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }
}

/// A stream that records activity, for the idle timeout.
struct TrackedStream<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
