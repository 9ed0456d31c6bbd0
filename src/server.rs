//! Listeners and connections: accept, terminate TLS when configured, serve HTTP/1.1
//! (keep-alive, upgrades) and HTTP/2 (ALPN, or h2c with prior knowledge) on the same port,
//! enforce the connection-level guards (header read timeout, header size, idle timeout), and
//! drain on shutdown. Plain bodyless HTTP/1.1 requests take the server's own path
//! (`server/http1.rs`) unless `[server] http1 = "hyper"`; hyper serves everything else. HTTP/3
//! listens beside them on UDP (`server/http3.rs`).

use std::net::SocketAddr;
use std::pin::pin;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use tokio_util::task::TaskTracker;

use crate::config::{Http1Path, Policy, ServerSettings};
use crate::connection::{Answering, Connection};
use crate::decision::DecisionService;
use crate::errors::StartError;
use crate::gateway::Gateway;
use crate::limit::clock;
use crate::request_body::RequestBody;
use crate::respond::SetFields;
use crate::shared::Shared;
use accepted::Accepted;
pub(crate) use edge::Listener;

mod accepted;
mod client_hello;
mod edge;
mod http1;
mod http3;
mod streams;

pub(crate) use streams::StreamExecutor;

/// hyper's smallest read buffer.
const MIN_BUFFER: usize = 8192;

/// How long a listener waits after a failed accept.
const ACCEPT_BACK_OFF: Duration = Duration::from_millis(50);

/// A listening socket on `address` (address reuse, no Nagle delay, backlog 1024), and the
/// address it got (an ephemeral port resolved).
pub(crate) async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen_error = |source| StartError::Listen { address, source };
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(listen_error)?;
    // Set on the listener, where Linux's accepted sockets inherit it: one system call per
    // listener instead of one per connection.
    let listener = socket
        .set_reuseaddr(true)
        .and_then(|()| socket.set_nodelay(true))
        .and_then(|()| socket.bind(address))
        .and_then(|()| socket.listen(1024))
        .map_err(listen_error)?;
    let bound = listener.local_addr().map_err(listen_error)?;
    Ok((listener, bound))
}

/// The bound addresses (ephemeral ports resolved) of the proxy listeners and the decision
/// listener.
pub(crate) struct Bound {
    /// `listen`'s.
    pub(crate) proxy: Vec<SocketAddr>,
    /// `plain_listen`'s, beside TLS ones.
    pub(crate) plain: Vec<SocketAddr>,
    pub(crate) decision: Option<SocketAddr>,
    /// `[server.http3]`'s, on UDP.
    pub(crate) http3: Vec<SocketAddr>,
}

/// Binds the proxy listeners and, with `[decision]`, the decision listener, and serves each
/// as a task of `listeners` until `shutdown`.
pub(crate) async fn listen(
    policy: &Policy,
    shared: &Arc<Shared>,
    listeners: &TaskTracker,
    shutdown: &watch::Receiver<bool>,
) -> Result<Bound, StartError> {
    let gateway = Gateway {
        shared: shared.clone(),
    };
    let tls = policy.server.tls.is_some();
    let addresses = (policy.server.listen.iter().map(|address| (address, tls))).chain(
        policy
            .server
            .plain_listen
            .iter()
            .map(|address| (address, false)),
    );
    let (mut proxy, mut plain) = (Vec::new(), Vec::new());
    for (address, tls) in addresses {
        let (listener, bound) = bind(*address).await?;
        if tls || policy.server.tls.is_none() {
            if tls {
                let _ = shared.https_port.set(bound.port());
            }
            proxy.push(bound);
            tracing::info!(address = %bound, tls, "listening");
        } else {
            plain.push(bound);
            tracing::info!(address = %bound, "listening for plain HTTP beside TLS");
        }
        let serving = serve(
            listener,
            shared.clone(),
            gateway.clone(),
            policy.server.clone(),
            (Listener::Proxy, tls),
            shutdown.clone(),
        );
        listeners.spawn(serving);
    }
    let quic = http3::listen(policy, shared, &gateway, listeners, shutdown)?;
    let Some(decision) = &policy.decision else {
        return Ok(Bound {
            proxy,
            plain,
            decision: None,
            http3: quic,
        });
    };
    let (listener, bound) = bind(decision.listen).await?;
    tracing::info!(address = %bound, "decision listener (forward-auth /decide, gRPC rate limit service)");
    // Plain HTTP/1.1 and h2c: the proxies that ask are the operator's own.
    let service = DecisionService::new(gateway);
    listeners.spawn(serve(
        listener,
        shared.clone(),
        service,
        policy.server.clone(),
        (Listener::Decision, false),
        shutdown.clone(),
    ));
    Ok(Bound {
        proxy,
        plain,
        decision: Some(bound),
        http3: quic,
    })
}

/// Accepts connections until shutdown; each connection is a task of the gateway's tracker.
/// A connection that must begin with a PROXY header has it read by its own task; one that
/// need not is judged by `[server.connections]` before a task is made for it.
pub(crate) async fn serve<A: Answering>(
    listener: TcpListener,
    shared: Arc<Shared>,
    answering: A,
    settings: ServerSettings,
    (kind, tls): (Listener, bool),
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(connection_builder(&settings));
    loop {
        let accepted = tokio::select! {
            accepted = accept(&listener) => accepted,
            _ = shutdown.changed() => break,
        };
        let Some((mut stream, peer)) = accepted else {
            continue;
        };
        if !cfg!(target_os = "linux") {
            let _ = stream.set_nodelay(true);
        }
        let peer = peer.ip().to_canonical();
        // The policy in force as the connection comes (a reload changes the next one's).
        let runtime = shared.runtime.load();
        let header_expected = edge::expects_header(&runtime.policy, peer);
        let open = match kind {
            Listener::Proxy if !header_expected => {
                match edge::admit(&shared, &runtime.policy, peer) {
                    Some(open) => Some(open),
                    None => continue,
                }
            }
            _ => None,
        };
        drop(runtime);
        let accepted = Accepted {
            shared: shared.clone(),
            answering: answering.clone(),
            builder: builder.clone(),
            guards: ConnectionGuards {
                own_http1: settings.http1 == Http1Path::Fast,
                max_head_bytes: settings.max_header_bytes.max(MIN_BUFFER),
                header_read_timeout: settings.header_read_timeout,
                idle_timeout: settings.idle_timeout,
            },
            shutdown: shutdown.clone(),
            tls,
        };
        // Spawned boxed: a task's cell is written when it is spawned and again when it ends,
        // and a connection's future is kilobytes (a flood of one request per connection paid
        // for three copies of it).
        if header_expected {
            shared.tasks.spawn(Box::pin(async move {
                let timeout = accepted.guards.header_read_timeout;
                let shared = accepted.shared.clone();
                let Some(client) =
                    edge::client_from_header(&shared, &mut stream, peer, timeout).await
                else {
                    return;
                };
                let open = match kind {
                    Listener::Proxy => {
                        match edge::admit(&shared, &shared.runtime.load().policy, client) {
                            Some(open) => Some(open),
                            None => return,
                        }
                    }
                    Listener::Decision => None,
                };
                accepted.serve(stream, client, open).await;
            }));
        } else {
            shared
                .tasks
                .spawn(Box::pin(accepted.serve(stream, peer, open)));
        }
    }
    tracing::info!("listener closed");
}

/// The next connection; `None` after a failed accept, once the listener has backed off:
/// usually the process is out of file descriptors, and retrying at once would spin.
pub(crate) async fn accept(listener: &TcpListener) -> Option<(TcpStream, SocketAddr)> {
    match listener.accept().await {
        Ok(accepted) => Some(accepted),
        Err(error) => {
            let address = listener.local_addr().ok();
            tracing::warn!(%error, ?address, "accept failed");
            tokio::time::sleep(ACCEPT_BACK_OFF).await;
            None
        }
    }
}

fn connection_builder(settings: &ServerSettings) -> auto::Builder<StreamExecutor> {
    let mut builder = auto::Builder::new(StreamExecutor);
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

async fn serve_connection<S, A: Answering>(
    stream: S,
    connection: Connection,
    answering: A,
    builder: Arc<auto::Builder<StreamExecutor>>,
    guards: ConnectionGuards,
    shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let mut stream = TrackedStream {
        inner: stream,
        activity: activity.clone(),
        read_ahead: Bytes::new(),
    };
    let mut watchdog = Watchdog::new(activity.clone(), &guards);
    let mut buffer = BytesMut::new();
    if guards.own_http1 {
        // Boxed, as hyper's path is below: each is kilobytes, and only one serves at a time.
        let own = http1::Accepted {
            io: &mut stream,
            buffer: &mut buffer,
            watchdog: &mut watchdog,
            shutdown: &shutdown,
            guards: &guards,
            answering: &answering,
            connection: &connection,
        };
        let ending = Box::pin(http1::serve(own)).await;
        if ending == http1::Ending::Closed {
            return;
        }
    }
    stream.read_ahead = buffer.freeze();
    let peer = connection.peer;
    // Shared, not cloned per request: what it renders and looks up once (the peer's
    // `X-Forwarded-For` entry, its origin) is then done once per connection here too.
    let connection = Arc::new(connection);
    let answer = move |request: Request<Incoming>| {
        let (answering, connection) = (answering.clone(), Arc::clone(&connection));
        async move {
            let request = request.map(RequestBody::Incoming);
            let mut fields = SetFields::default();
            // Boxed: HTTP/2 spawns this future for each stream, and the gateway's answer is
            // tens of kilobytes; inline, the spawn copied it several times over.
            let answer = Box::pin(answering.answer(request, &connection, &mut fields));
            let mut response = answer.await;
            fields.apply(response.headers_mut());
            response
        }
    };
    let guarded = Guarded {
        stream,
        activity: &activity,
        watchdog: &mut watchdog,
        header_read_timeout: guards.header_read_timeout,
    };
    Box::pin(guarded.serve(&builder, answer, peer, shutdown)).await;
}

/// Serves a connection that the guards watch with hyper (for the admin listener, which has no
/// own path): no request within the header read timeout, or idle for the idle timeout, and it
/// is closed.
pub(crate) async fn serve_guarded<F, Answer>(
    stream: TcpStream,
    peer: std::net::IpAddr,
    builder: &auto::Builder<StreamExecutor>,
    timeouts: (Duration, Duration),
    answer: F,
    shutdown: watch::Receiver<bool>,
) where
    F: Fn(Request<Incoming>) -> Answer + Send + Sync + 'static,
    Answer: std::future::Future<Output = http::Response<crate::body::Body>> + Send + 'static,
{
    let (header_read_timeout, idle_timeout) = timeouts;
    let activity = Arc::new(Activity::new());
    let guards = ConnectionGuards {
        own_http1: false,
        max_head_bytes: MIN_BUFFER,
        header_read_timeout,
        idle_timeout,
    };
    let mut watchdog = Watchdog::new(activity.clone(), &guards);
    let guarded = Guarded {
        stream: TrackedStream {
            inner: stream,
            activity: activity.clone(),
            read_ahead: Bytes::new(),
        },
        activity: &activity,
        watchdog: &mut watchdog,
        header_read_timeout,
    };
    guarded.serve(builder, answer, peer, shutdown).await;
}

/// A connection on its way to hyper, with what watches it.
struct Guarded<'a, S> {
    stream: TrackedStream<S>,
    activity: &'a Activity,
    watchdog: &'a mut Watchdog,
    header_read_timeout: Duration,
}

impl<S> Guarded<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Lets hyper serve the connection until it ends, shutdown drains it, or a guard cuts it.
    async fn serve<F, Answer>(
        self,
        builder: &auto::Builder<StreamExecutor>,
        answer: F,
        peer: std::net::IpAddr,
        mut shutdown: watch::Receiver<bool>,
    ) where
        F: Fn(Request<Incoming>) -> Answer + Send + Sync + 'static,
        Answer: std::future::Future<Output = http::Response<crate::body::Body>> + Send + 'static,
    {
        let Guarded {
            stream,
            activity,
            watchdog,
            header_read_timeout,
        } = self;
        let service = service_fn(move |request: Request<Incoming>| {
            let answered = answer(request);
            async move { Ok::<_, std::convert::Infallible>(answered.await) }
        });
        let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(stream), service));
        let mut streams = streams::Streams::new();
        let mut draining = *shutdown.borrow();
        if draining {
            conn.as_mut().graceful_shutdown();
        }
        // hyper times a head from its first byte: a connection that sends nothing at all is
        // cut off here, as the own path does, at the header read timeout after the accept.
        let mut silent = pin!(tokio::time::sleep(header_read_timeout));
        let mut heard = activity.count() > 0;
        loop {
            tokio::select! {
                result = std::future::poll_fn(|cx| streams.drive(cx, conn.as_mut())) => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                    break;
                }
                _ = &mut silent, if !heard => {
                    heard = activity.count() > 0;
                    if !heard {
                        tracing::debug!(%peer, "no request within the header read timeout");
                        break;
                    }
                }
                _ = shutdown.changed(), if !draining => {
                    conn.as_mut().graceful_shutdown();
                    streams.changed();
                    draining = true;
                }
                idle = watchdog.tick(), if !draining => {
                    if idle {
                        conn.as_mut().graceful_shutdown();
                        streams.changed();
                        draining = true;
                    }
                }
            }
        }
    }
}

/// The per-connection settings of the protocol guards.
#[derive(Clone, Copy)]
struct ConnectionGuards {
    /// Plain HTTP/1.1 requests take the server's own path (`[server] http1 = "fast"`, and not
    /// after ALPN chose h2).
    own_http1: bool,
    /// Longest request head (hyper's read buffer limit; longer heads get hyper's 431).
    max_head_bytes: usize,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

/// Checks a connection's idleness at a steady pace, a fraction of the shortest guard timeout:
/// no timer is set per request.
struct Watchdog {
    activity: Arc<Activity>,
    idle_timeout: Duration,
    ticks: tokio::time::Interval,
    last_moves: u64,
    quiet_since: Instant,
}

impl Watchdog {
    fn new(activity: Arc<Activity>, guards: &ConnectionGuards) -> Watchdog {
        let period = (guards.idle_timeout.min(guards.header_read_timeout) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut ticks = tokio::time::interval_at(clock::deadline_in(period), period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Watchdog {
            last_moves: activity.count(),
            activity,
            idle_timeout: guards.idle_timeout,
            ticks,
            quiet_since: clock::instant(),
        }
    }

    /// Waits for the next check; true when the connection has moved no bytes for the idle
    /// timeout. Cancel-safe.
    async fn tick(&mut self) -> bool {
        self.ticks.tick().await;
        let moves = self.activity.count();
        if moves != self.last_moves {
            (self.last_moves, self.quiet_since) = (moves, clock::instant());
            return false;
        }
        clock::elapsed(self.quiet_since) >= self.idle_timeout
    }

    /// Resolves once the connection has been idle for the idle timeout.
    async fn until_idle(&mut self) {
        while !self.tick().await {}
    }
}

/// Whether a connection moved bytes: a counter bumped on every read and write, compared
/// between checks (cheaper than reading the clock on every I/O).
pub(super) struct Activity {
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

/// A client connection that records activity, for the idle timeout, and replays the bytes
/// the server's own HTTP/1.1 path read ahead when it hands the connection to hyper.
struct TrackedStream<S> {
    inner: S,
    activity: Arc<Activity>,
    read_ahead: Bytes,
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read_ahead.is_empty() {
            let count = self.read_ahead.len().min(buf.remaining());
            buf.put_slice(&self.read_ahead.split_to(count));
            return Poll::Ready(Ok(()));
        }
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

#[cfg(test)]
mod tests {
    /// `serve` sets no option per connection on Linux: an accepted socket inherits the
    /// listener's.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_accepted_connection_inherits_the_listeners_nodelay() {
        let (listener, address) = super::bind(([127, 0, 0, 1], 0).into()).await.unwrap();
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let (accepted, _) = super::accept(&listener).await.unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
