//! HTTP/1.1 exchanges with an upstream for requests whose body is already in memory (most
//! requests have none), driven by the request's own task: the request is written in one go,
//! the response head read and parsed, and the body is either what arrived with the head (the
//! connection goes straight back to the pool) or read from the connection as the client takes
//! it, after which the body hands the connection back.
//!
//! No connection task, no channels and no wake-ups between tasks sit in between, which is
//! most of what a proxied request costs in user space. Requests that stream a body or switch
//! protocols go through hyper's client instead (`connection_pool.rs`): there the upload and the
//! response have to progress together.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Method, Response, StatusCode};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_rustls::client::TlsStream;

use super::Forwarding;
use super::Owner;
use crate::body::Body;
use crate::wire::header_names::KnownNames;
use crate::wire::message::MAX_RESPONSE_HEAD_BYTES;
use crate::wire::write_header_field;

mod body;
mod head;

use body::{Decoder, Framing, StreamingBody};
use head::{parse_head, Head};

/// Chunk-size lines and trailer fields longer than this are refused.
const MAX_LINE_BYTES: usize = 8 * 1024;
/// What one read asks the kernel for, at least.
const READ_SIZE: usize = 8 * 1024;
/// Pieces of a body read as the client takes it, up to this size, are copied out of the read
/// buffer, which then stays the connection's own while the piece is still being written
/// (larger ones are split off without a copy). A body that came with its head is split off
/// whole: it is written out before the connection is used again.
const COPY_AT_MOST: usize = 4 * 1024;

/// The byte stream to one upstream address.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(stream) => stream,
            Stream::Tls(stream) => stream.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One keep-alive connection and the bytes read from it but not yet used.
pub(crate) struct Connection {
    stream: Stream,
    buffer: BytesMut,
    /// The deadline of the response head, reset for each request. Moving a registered timer
    /// to a later deadline is one atomic update, where a timer per request would be inserted
    /// into and removed from the runtime's timer wheel each time.
    head_deadline: Pin<Box<Sleep>>,
    /// The header names this upstream's responses used.
    names: KnownNames,
}

impl Connection {
    pub(crate) fn new(stream: Stream) -> Connection {
        Connection {
            stream,
            buffer: BytesMut::with_capacity(READ_SIZE),
            // Not registered until polled; every exchange sets its own deadline first.
            head_deadline: Box::pin(tokio::time::sleep_until(crate::limit::clock::deadline_in(
                std::time::Duration::ZERO,
            ))),
            names: KnownNames::default(),
        }
    }

    /// Whether the upstream closed the connection (or sent something unasked) while it was
    /// idle. Asks the runtime's cached readiness, not the kernel: an idle connection turns
    /// readable only that way.
    fn is_stale(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.stream.tcp().poll_read_ready(&mut cx).is_ready()
    }

    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buffer.reserve(READ_SIZE);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buffer)
    }
}

/// The idle connections of one upstream address, the most recently used last.
pub(crate) struct IdleConnections {
    list: Mutex<Vec<(Owner, Connection)>>,
    max: usize,
}

impl IdleConnections {
    pub(crate) fn new(max: usize) -> IdleConnections {
        IdleConnections {
            list: Mutex::new(Vec::new()),
            max,
        }
    }

    /// The warmest idle connection kept for `owner` that the upstream has not closed.
    pub(crate) fn checkout(&self, owner: Owner) -> Option<Connection> {
        let mut list = self.list.lock();
        while let Some(at) = list.iter().rposition(|(kept_for, _)| *kept_for == owner) {
            let (_, connection) = list.remove(at);
            if !connection.is_stale() {
                return Some(connection);
            }
        }
        None
    }

    /// Keeps a connection whose message ended cleanly (its caller checked that nothing of it
    /// is left in the buffer), unless the upstream has already sent more: bytes nobody asked
    /// for would be read as the next request's response.
    fn checkin(&self, connection: Connection, owner: Owner) {
        if connection.is_stale() {
            return;
        }
        let mut list = self.list.lock();
        // The oldest one is checked in passing, so that connections the upstream closed while
        // traffic was light (or kept for a client that left) do not linger until reached.
        if list.first().is_some_and(|(_, oldest)| oldest.is_stale()) {
            list.remove(0);
        }
        if list.len() >= self.max {
            list.remove(0);
        }
        list.push((owner, connection));
    }
}

/// A request whose body is in memory, as it goes upstream: the client's fields with those
/// of `forwarding` in place of theirs.
pub(crate) struct OutgoingRequest<'a> {
    pub(crate) method: &'a Method,
    /// The origin-form request target, in pieces.
    pub(crate) target: [&'a str; 4],
    pub(crate) headers: &'a HeaderMap,
    pub(crate) forwarding: &'a Forwarding<'a>,
    pub(crate) body: &'a [u8],
}

impl OutgoingRequest<'_> {
    /// Writes the request head and body. `Content-Length` is set from the body (and
    /// `Transfer-Encoding` never sent), so the framing is always the one the body really has.
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.reserve(256 + self.body.len());
        out.put_slice(self.method.as_str().as_bytes());
        out.put_u8(b' ');
        for piece in self.target {
            out.put_slice(piece.as_bytes());
        }
        out.put_slice(b" HTTP/1.1\r\n");
        let mut declared_length = false;
        for (name, value) in self.headers {
            if name == header::CONTENT_LENGTH {
                declared_length = true;
                continue;
            }
            if name == header::TRANSFER_ENCODING || self.forwarding.replaces(name) {
                continue;
            }
            write_header_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
        for (name, value) in self.forwarding.fields() {
            write_header_field(out, name.as_str().as_bytes(), value);
        }
        let expects_body = matches!(*self.method, Method::POST | Method::PUT | Method::PATCH);
        if !self.body.is_empty() || declared_length || expects_body {
            out.put_slice(b"content-length: ");
            out.put_slice(itoa::Buffer::new().format(self.body.len()).as_bytes());
            out.put_slice(b"\r\n");
        }
        out.put_slice(b"\r\n");
        out.put_slice(self.body);
    }
}

/// Why an exchange produced no response.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Not a byte of a response arrived before the connection failed or closed: on a reused
    /// connection, the upstream had most likely closed it just as the request went out.
    pub(crate) unanswered: bool,
    /// The deadline passed before the response head was complete.
    pub(crate) timed_out: bool,
    pub(crate) message: String,
}

impl Failure {
    fn new(unanswered: bool, message: impl Into<String>) -> Failure {
        Failure {
            unanswered,
            timed_out: false,
            message: message.into(),
        }
    }
}

/// Sends `request` on `connection` and reads the response head, which must be complete by
/// `deadline`. The request is encoded into the connection's read buffer, which is empty
/// between exchanges: no buffer of its own to allocate. The connection returns to `idle` once
/// the response body has been read, if both sides allow keep-alive.
pub(crate) async fn exchange(
    mut connection: Connection,
    request: &OutgoingRequest<'_>,
    idle: &Arc<IdleConnections>,
    deadline: Instant,
    owner: Owner,
) -> Result<Response<Body>, Failure> {
    connection.buffer.clear();
    request.encode(&mut connection.buffer);
    connection.head_deadline.as_mut().reset(deadline);
    let Connection {
        stream,
        buffer,
        head_deadline,
        names,
    } = &mut connection;
    let head = tokio::select! {
        biased;
        head = send_and_read_head(stream, buffer, names, request.method) => head?,
        () = head_deadline.as_mut() => {
            return Err(Failure {
                timed_out: true,
                ..Failure::new(false, "no response head in time")
            });
        }
    };
    let mut response = Response::new(());
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    let complete = match head.framing {
        Framing::Empty => Some(Bytes::new()),
        // Split off, not copied: the response is written out (and dropped) before the
        // connection is used again, which finds its buffer its own once more.
        Framing::Length(length) if length <= connection.buffer.len() as u64 => {
            Some(connection.buffer.split_to(length as usize).freeze())
        }
        _ => None,
    };
    if let Some(body) = complete {
        if head.keep_alive && connection.buffer.is_empty() {
            idle.checkin(connection, owner);
        }
        return Ok(response.map(|()| Body::full(body)));
    }
    let body = StreamingBody {
        connection: Some(connection),
        decoder: Decoder::new(head.framing),
        keep_alive: head.keep_alive,
        idle: idle.clone(),
        owner,
    };
    Ok(response.map(|()| Body::boxed(body)))
}

/// Writes the request in `buffer`, then reads into it until a final response head (1xx
/// responses are skipped), which is taken out of it.
async fn send_and_read_head(
    stream: &mut Stream,
    buffer: &mut BytesMut,
    names: &mut KnownNames,
    method: &Method,
) -> Result<Head, Failure> {
    let written = async {
        stream.write_all(buffer).await?;
        stream.flush().await
    };
    if let Err(error) = written.await {
        return Err(Failure::new(true, format!("sending the request: {error}")));
    }
    buffer.clear();
    // A 1xx nobody asked for (other than 100 Continue and 103 Early Hints) says the upstream
    // does not read requests as the gateway writes them: its connection is not used again.
    let mut unasked_informational = false;
    loop {
        match parse_head(buffer, names, method) {
            Ok(Some(head)) if head.status == StatusCode::SWITCHING_PROTOCOLS => {
                // No request of this client asks for an upgrade: never skipped like a 1xx
                // (then a resent request would reach the upstream twice).
                return Err(Failure::new(false, "101 Switching Protocols, unasked"));
            }
            Ok(Some(head)) if head.status.is_informational() => {
                unasked_informational |= !matches!(head.status.as_u16(), 100 | 103);
                continue;
            }
            Ok(Some(mut head)) => {
                head.keep_alive &= !unasked_informational;
                return Ok(head);
            }
            Ok(None) => {}
            Err(error) => return Err(Failure::new(false, error.to_string())),
        }
        if buffer.len() >= MAX_RESPONSE_HEAD_BYTES {
            return Err(Failure::new(false, "response head too large"));
        }
        let answered = !buffer.is_empty();
        buffer.reserve(READ_SIZE);
        match stream.read_buf(buffer).await {
            Ok(0) => {
                return Err(Failure::new(
                    !answered,
                    "the upstream closed the connection before the response head",
                ))
            }
            Ok(_) => {}
            Err(error) => {
                return Err(Failure::new(
                    !answered,
                    format!("reading the response: {error}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn encoded(
        method: &Method,
        target: [&str; 4],
        headers: &HeaderMap,
        forwarding: &Forwarding<'_>,
        body: &[u8],
    ) -> BytesMut {
        let mut out = BytesMut::new();
        OutgoingRequest {
            method,
            target,
            headers,
            forwarding,
            body,
        }
        .encode(&mut out);
        out
    }

    #[test]
    fn requests_carry_the_length_of_their_body_only() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("app"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let request_id = crate::request_id::RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding =
            Forwarding::new(std::iter::empty(), &request_id, &peer, "http", None, None);
        let out = encoded(
            &Method::POST,
            ["/base", "/login", "?", "a=1"],
            &headers,
            &forwarding,
            b"abc",
        );
        assert_eq!(
            &out[..],
            b"POST /base/login?a=1 HTTP/1.1\r\nhost: app\r\nx-forwarded-for: 10.0.0.1\r\n\
              x-forwarded-proto: http\r\nx-request-id: r-1\r\ncontent-length: 3\r\n\r\nabc"
        );
    }

    #[test]
    fn the_gateways_fields_replace_the_clients() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("spoofed"));
        headers.insert("x-forwarded-host", HeaderValue::from_static("spoofed"));
        headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        headers.insert("x-request-id", HeaderValue::from_static("client-id"));
        headers.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        headers.insert("x-kept", HeaderValue::from_static("yes"));
        let host = HeaderValue::from_static("shop.example");
        let request_id = crate::request_id::RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding::new(
            headers.get_all("x-forwarded-for").iter(),
            &request_id,
            &peer,
            "http",
            Some(&host),
            None,
        );
        let out = encoded(&Method::GET, ["", "/", "", ""], &headers, &forwarding, b"");
        assert_eq!(
            &out[..],
            b"GET / HTTP/1.1\r\nx-kept: yes\r\nhost: shop.example\r\n\
              x-forwarded-host: shop.example\r\nx-forwarded-for: 1.1.1.1, 10.0.0.1\r\n\
              x-forwarded-proto: http\r\nx-request-id: r-1\r\n\r\n"
        );
    }
}
