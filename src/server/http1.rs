//! The server's own HTTP/1.1 keep-alive path. Bodyless HTTP/1.1 requests (nearly all of a
//! proxy's traffic) are read, answered and written by the connection's task itself, without
//! hyper's dispatcher. Anything else — a request with a body, an upgrade, `Expect`, HTTP/1.0,
//! an absolute-form target, HTTP/2's preface, a head that does not parse or does not fit —
//! hands the connection, with every byte read so far, to hyper for the rest of its life, so
//! hyper's protocol guards (400, 431, body framing, 100-continue, upgrades, h2c) still apply
//! to it.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use bytes::BytesMut;
use http::{Method, Request, Response};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::{ConnectionGuards, Watchdog};
use crate::body::Body;
use crate::connection::{Answering, Connection};
use crate::limit::clock;
use crate::request_body::RequestBody;
use crate::respond::SetFields;
use crate::wire::header_names::KnownNames;

mod request;
mod response;

use request::{parse_request, Parsed};
use response::{encode_response_head, send_out, write_body};

/// Responses held for pipelined requests go out once this much is waiting.
const HOLD_AT_MOST: usize = 64 * 1024;

thread_local! {
    /// The header names this thread's clients used, lent to one connection at a time: a new
    /// connection finds its client's names known (a flood of one request per connection
    /// repeats them every time).
    static CLIENT_NAMES: RefCell<KnownNames> = RefCell::new(KnownNames::default());
}

/// How the connection ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ending {
    Closed,
    /// hyper serves the rest of the connection, starting with the bytes left in the buffer.
    HandOver,
}

/// A connection the own path serves: its stream with the bytes read ahead, its guards, and
/// the gateway that answers its requests.
pub(super) struct Accepted<'c, S, A> {
    pub(super) io: &'c mut S,
    pub(super) buffer: &'c mut BytesMut,
    pub(super) watchdog: &'c mut Watchdog,
    pub(super) shutdown: &'c watch::Receiver<bool>,
    pub(super) guards: &'c ConnectionGuards,
    pub(super) answering: &'c A,
    pub(super) connection: &'c Connection,
}

/// Serves requests from `io` until the connection closes or a request needs hyper, each
/// answered by `answering`. A head longer than `guards.max_head_bytes` goes to hyper
/// (its 431); a head must be complete within `guards.header_read_timeout` of its first byte
/// (of the accept, for the first one).
pub(super) async fn serve<S, A: Answering>(own: Accepted<'_, S, A>) -> Ending
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Accepted {
        io,
        buffer,
        watchdog,
        shutdown,
        guards,
        answering,
        connection,
    } = own;
    let mut http1 = Http1 {
        io,
        buffer,
        watchdog,
        guards,
        names: CLIENT_NAMES.take(),
        // Sized for the usual response head: grown from nothing, it was reallocated three
        // times on every connection.
        out: BytesMut::with_capacity(1024),
        tls: connection.proto == "https",
    };
    let mut fields = SetFields::default();
    // One wait for the shutdown signal for the connection's life, not one per request.
    let mut signal = shutdown.clone();
    let mut shutting_down = std::pin::pin!(signal.changed());
    // The first head's clock starts at the accept: a connection that sends nothing is cut
    // off like one whose head trickles in.
    let mut head_started = Some(clock::instant());
    loop {
        let (request, keep_alive) = match http1
            .read_request(shutting_down.as_mut(), &mut head_started)
            .await
        {
            Ok(request) => request,
            Err(ending) => return ending,
        };
        head_started = None;
        let head_only = request.method() == Method::HEAD;
        fields.clear();
        let response = {
            // Pinned where it is made: the request's future is kilobytes, not to be moved.
            let handling = std::pin::pin!(answering.answer(request, connection, &mut fields));
            http1.answer(handling).await
        };
        let Some((response, waited)) = response else {
            return Ending::Closed;
        };
        if waited {
            fields.date_later();
        }
        let close = !keep_alive || shutdown.has_changed().unwrap_or(true);
        if http1
            .write_response(response, &fields, head_only, close)
            .await
            .is_err()
        {
            return Ending::Closed;
        }
    }
}

/// One connection on the own path: its stream, the bytes read ahead, its guards, the header
/// names its client uses (the thread's, lent for the connection's life), and the buffer
/// responses are written from.
struct Http1<'c, S> {
    io: &'c mut S,
    buffer: &'c mut BytesMut,
    watchdog: &'c mut Watchdog,
    guards: &'c ConnectionGuards,
    names: KnownNames,
    out: BytesMut,
    /// Over TLS, which is shut down (close_notify) before the connection closes.
    tls: bool,
}

impl<S> Drop for Http1<'_, S> {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        // A thread that is ending keeps no names.
        let _ = CLIENT_NAMES.try_with(|kept| kept.replace(names));
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Http1<'_, S> {
    /// Reads until a whole bodyless request head is at the start of the buffer, and takes it
    /// out with whether the connection stays open after it; or says how the connection ends.
    async fn read_request(
        &mut self,
        mut shutting_down: Pin<&mut impl Future<Output = Result<(), watch::error::RecvError>>>,
        head_started: &mut Option<Instant>,
    ) -> Result<(Request<RequestBody>, bool), Ending> {
        loop {
            // An empty buffer, the usual state between requests, holds nothing to parse.
            if !self.buffer.is_empty() {
                match parse_request(self.buffer, self.guards.max_head_bytes, &mut self.names) {
                    Parsed::Request {
                        request,
                        keep_alive,
                    } => return Ok((request, keep_alive)),
                    Parsed::HandOver => {
                        self.write_held().await?;
                        return Err(Ending::HandOver);
                    }
                    Parsed::Partial => {}
                }
            }
            self.write_held().await?;
            if !self.buffer.is_empty() && head_started.is_none() {
                *head_started = Some(clock::instant());
            }
            if self.buffer.capacity() - self.buffer.len() < 1024 {
                self.buffer.reserve(4096);
            }
            tokio::select! {
                biased;
                read = self.io.read_buf(self.buffer) => match read {
                    Ok(0) | Err(_) => return Err(Ending::Closed),
                    Ok(_) => {}
                },
                _ = shutting_down.as_mut() => return Err(Ending::Closed),
                idle = self.watchdog.tick() => {
                    let timeout = self.guards.header_read_timeout;
                    let head_late = head_started.is_some_and(|started| clock::elapsed(started) >= timeout);
                    if idle || head_late {
                        return Err(Ending::Closed);
                    }
                }
            }
        }
    }

    /// Waits for the gateway's answer, reading on meanwhile: that notices a client that goes
    /// away (`None`: the request is dropped, as hyper does) and keeps pipelined requests.
    /// Says whether the answer waited (was not ready when first asked for).
    async fn answer(
        &mut self,
        mut handling: Pin<&mut impl Future<Output = Response<Body>>>,
    ) -> Option<(Response<Body>, bool)> {
        let mut waited = false;
        let mut noting_waits = std::pin::pin!(std::future::poll_fn(move |context| {
            match handling.as_mut().poll(context) {
                Poll::Ready(response) => Poll::Ready((response, waited)),
                Poll::Pending => {
                    waited = true;
                    Poll::Pending
                }
            }
        }));
        if !self.out.is_empty() {
            // Responses held for this one to join go out before it is waited for.
            let first =
                std::future::poll_fn(|context| Poll::Ready(noting_waits.as_mut().poll(context)));
            if let Poll::Ready(answer) = first.await {
                return Some(answer);
            }
            self.write_held().await.ok()?;
        }
        loop {
            tokio::select! {
                biased;
                answer = noting_waits.as_mut() => return Some(answer),
                read = self.io.read_buf(self.buffer), if self.buffer.len() < self.guards.max_head_bytes => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
            }
        }
    }

    /// Writes the responses held for pipelined requests to join; `Err` when the connection
    /// ends (the client stopped reading for the idle timeout, or went away).
    async fn write_held(&mut self) -> Result<(), Ending> {
        if self.out.is_empty() {
            return Ok(());
        }
        tokio::select! {
            written = send_out(self.io, &mut self.out) => written.map_err(|_| Ending::Closed),
            _ = self.watchdog.until_idle() => Err(Ending::Closed),
        }
    }

    /// Writes the response, head and body; `Err` when the connection ends with it.
    async fn write_response(
        &mut self,
        response: Response<Body>,
        fields: &SetFields,
        head_only: bool,
        close: bool,
    ) -> Result<(), Ending> {
        let (parts, body) = response.into_parts();
        let head = encode_response_head(
            parts.status,
            &parts.headers,
            fields,
            body.size_hint().exact(),
            head_only,
            close,
            &mut self.out,
        );
        // The head is written: the map can hold another response's.
        crate::wire::header_maps::give_back(parts.headers);
        // A pipelined request already read is answered into the same write: a client that
        // sends sixteen requests at once gets sixteen answers in one system call, not sixteen.
        let hold = !head.close && !self.buffer.is_empty() && self.out.len() < HOLD_AT_MOST;
        let written = tokio::select! {
            written = write_body(
                self.io,
                &mut self.out,
                body,
                head.framing,
                self.buffer,
                self.guards.max_head_bytes,
                hold,
            ) => written,
            _ = self.watchdog.until_idle() => return Err(Ending::Closed),
        };
        if written.is_err() {
            return Err(Ending::Closed);
        }
        if head.close {
            // TLS says goodbye (close_notify); plain TCP's close sends the FIN itself, unless
            // bytes the client sent after this request are waiting, which the close answers
            // with a reset: there, the FIN goes first.
            if self.tls || !self.buffer.is_empty() {
                let _ = self.io.shutdown().await;
            }
            return Err(Ending::Closed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{DuplexStream, ReadBuf};
    use tokio::sync::Notify;

    use super::*;
    use crate::server::{Activity, ConnectionGuards, Watchdog};

    /// One end of a pipe that counts the writes made to it.
    struct CountingWrites {
        inner: DuplexStream,
        writes: Arc<AtomicUsize>,
    }

    impl AsyncRead for CountingWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            context: &mut std::task::Context<'_>,
            buffer: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(context, buffer)
        }
    }

    impl AsyncWrite for CountingWrites {
        fn poll_write(
            mut self: Pin<&mut Self>,
            context: &mut std::task::Context<'_>,
            bytes: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let written = Pin::new(&mut self.inner).poll_write(context, bytes);
            if written.is_ready() {
                self.writes.fetch_add(1, Ordering::SeqCst);
            }
            written
        }

        fn poll_flush(
            mut self: Pin<&mut Self>,
            context: &mut std::task::Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(context)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            context: &mut std::task::Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(context)
        }
    }

    /// Refuses every request at once with `429` and the body `no`, but `/wait`, which it
    /// answers once `released` is notified.
    #[derive(Clone)]
    struct Refusing {
        released: Arc<Notify>,
    }

    impl Answering for Refusing {
        async fn answer(
            &self,
            request: Request<RequestBody>,
            _connection: &Connection,
            _fields: &mut SetFields,
        ) -> Response<Body> {
            if request.uri().path() == "/wait" {
                self.released.notified().await;
            }
            let mut response = Response::new(Body::full("no"));
            *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
            response
        }
    }

    /// Serves the server's end of a pipe on the own path; returns the client's end, the
    /// count of the server's writes and what releases `/wait`.
    fn serve_pipe() -> (DuplexStream, Arc<AtomicUsize>, Arc<Notify>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let writes = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(Notify::new());
        let mut io = CountingWrites {
            inner: server,
            writes: writes.clone(),
        };
        let answering = Refusing {
            released: released.clone(),
        };
        tokio::spawn(async move {
            let guards = ConnectionGuards {
                own_http1: true,
                max_head_bytes: 16 * 1024,
                header_read_timeout: Duration::from_secs(60),
                idle_timeout: Duration::from_secs(60),
            };
            let (_signal, shutdown) = watch::channel(false);
            let mut watchdog = Watchdog::new(Arc::new(Activity::new()), &guards);
            let mut buffer = BytesMut::new();
            let connection = Connection::new("127.0.0.1".parse().unwrap(), "http");
            serve(Accepted {
                io: &mut io,
                buffer: &mut buffer,
                watchdog: &mut watchdog,
                shutdown: &shutdown,
                guards: &guards,
                answering: &answering,
                connection: &connection,
            })
            .await
        });
        (client, writes, released)
    }

    /// Reads until `count` whole answers (`…\r\n\r\nno`) have come, within 10 s.
    async fn read_answers(client: &mut DuplexStream, count: usize) -> String {
        let mut seen = Vec::new();
        let reading = async {
            while String::from_utf8_lossy(&seen).matches("\r\n\r\nno").count() < count {
                let mut bytes = [0u8; 4096];
                let read = client.read(&mut bytes).await.unwrap();
                assert!(read > 0, "the connection closed");
                seen.extend_from_slice(&bytes[..read]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), reading)
            .await
            .unwrap_or_else(|_| panic!("{count} answers did not come"));
        String::from_utf8(seen).unwrap()
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    #[tokio::test]
    async fn pipelined_requests_read_together_are_answered_in_one_write() {
        let (mut client, writes, _released) = serve_pipe();
        client.write_all(&GET.repeat(16)).await.unwrap();
        let answers = read_answers(&mut client, 16).await;
        assert_eq!(answers.matches("HTTP/1.1 429 ").count(), 16, "{answers}");
        assert_eq!(writes.load(Ordering::SeqCst), 1);

        // One request alone is answered at once, in a write of its own.
        client.write_all(GET).await.unwrap();
        read_answers(&mut client, 1).await;
        assert_eq!(writes.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn held_answers_are_written_before_an_answer_that_waits() {
        let (mut client, _writes, released) = serve_pipe();
        let mut requests = GET.repeat(2);
        requests.extend_from_slice(b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n");
        client.write_all(&requests).await.unwrap();
        // Held until /wait's answer, these two would never come: it waits for them.
        read_answers(&mut client, 2).await;
        released.notify_one();
        read_answers(&mut client, 1).await;
    }

    #[tokio::test]
    async fn a_held_answer_is_written_before_the_rest_of_the_next_head_is_read() {
        let (mut client, _writes, _released) = serve_pipe();
        client.write_all(GET).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        read_answers(&mut client, 1).await;
        client.write_all(b"st: a\r\n\r\n").await.unwrap();
        read_answers(&mut client, 1).await;
    }
}
