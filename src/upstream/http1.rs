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
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_rustls::client::TlsStream;

use super::Forwarding;
use crate::wire::header_names::KnownNames;
use crate::wire::message::{header_tokens, is_bodyless, MAX_RESPONSE_FIELDS};
use crate::wire::write_header_field;
use crate::{Body, BoxError};

/// A response head larger than this is refused.
const MAX_HEAD_BYTES: usize = 64 * 1024;
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
            head_deadline: Box::pin(tokio::time::sleep_until(Instant::now())),
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
    list: Mutex<Vec<Connection>>,
    max: usize,
}

impl IdleConnections {
    pub(crate) fn new(max: usize) -> IdleConnections {
        IdleConnections {
            list: Mutex::new(Vec::new()),
            max,
        }
    }

    /// The warmest idle connection that the upstream has not closed.
    pub(crate) fn checkout(&self) -> Option<Connection> {
        let mut list = self.list.lock();
        while let Some(connection) = list.pop() {
            if !connection.is_stale() {
                return Some(connection);
            }
        }
        None
    }

    fn checkin(&self, connection: Connection) {
        let mut list = self.list.lock();
        // The oldest one is checked in passing, so that connections the upstream closed while
        // traffic was light do not linger until they are reached.
        if list.first().is_some_and(Connection::is_stale) {
            list.remove(0);
        }
        if list.len() < self.max {
            list.push(connection);
        }
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
            idle.checkin(connection);
        }
        return Ok(response.map(|()| Body::full(body)));
    }
    let body = StreamingBody {
        connection: Some(connection),
        decoder: Decoder::new(head.framing),
        keep_alive: head.keep_alive,
        idle: idle.clone(),
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
    loop {
        match parse_head(buffer, names, method) {
            Ok(Some(head)) => {
                if head.status.is_informational() {
                    // 100 Continue, 103 Early Hints: the final answer follows.
                    continue;
                }
                return Ok(head);
            }
            Ok(None) => {}
            Err(error) => return Err(Failure::new(false, error)),
        }
        if buffer.len() >= MAX_HEAD_BYTES {
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

/// A parsed response head and what it says about the body and the connection.
#[derive(Debug)]
struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    framing: Framing,
    keep_alive: bool,
}

/// Parses a response head from the start of `buffer`: `Ok(None)` until it is complete, then
/// the head, taken out of the buffer.
fn parse_head(
    buffer: &mut BytesMut,
    names: &mut KnownNames,
    method: &Method,
) -> Result<Option<Head>, String> {
    if buffer.is_empty() {
        return Ok(None);
    }
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_RESPONSE_FIELDS];
    let mut parsed = httparse::Response::new(&mut []);
    let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut parsed,
        buffer,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(format!("invalid response head: {error}")),
    };
    let status = parsed
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or("invalid response status")?;
    let version = if parsed.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // The gateway's own fields go beside the map (`respond::SetFields`), not into it.
    let mut headers = crate::wire::header_maps::take(parsed.headers.len());
    // Noted on the way, so that a response without them is not searched for them.
    let (mut transfer_encoding, mut connection) = (false, false);
    let base = buffer.as_ptr() as usize;
    let mut values: SmallVec<[(HeaderName, Range<usize>); 16]> = SmallVec::new();
    // Where the `Content-Length` values lie, so that the framing needs no look-up.
    let mut content_lengths: SmallVec<[Range<usize>; 2]> = SmallVec::new();
    for field in parsed.headers.iter() {
        let name = names
            .name(field.name.as_bytes())
            .ok_or_else(|| format!("invalid response header name {:?}", field.name))?;
        transfer_encoding |= name == header::TRANSFER_ENCODING;
        connection |= name == header::CONNECTION;
        let start = field.value.as_ptr() as usize - base;
        let range = start..start + field.value.len();
        if name == header::CONTENT_LENGTH {
            content_lengths.push(range.clone());
        }
        values.push((name, range));
    }
    // The values are slices of the head, taken out of the buffer: no copy, no allocation
    // each.
    let head = buffer.split_to(length).freeze();
    for (name, range) in values {
        let value = HeaderValue::from_maybe_shared(head.slice(range))
            .map_err(|_| format!("invalid value of response header {name}"))?;
        headers.append(name, value);
    }
    let content_lengths = content_lengths.into_iter().map(|range| &head[range]);
    let (framing, reusable) =
        framing(status, method, &headers, transfer_encoding, content_lengths)?;
    let keep_alive = reusable
        && version == Version::HTTP_11
        && !(connection
            && header_tokens(&headers, header::CONNECTION)
                .any(|token| token.eq_ignore_ascii_case("close")));
    Ok(Some(Head {
        status,
        version,
        headers,
        framing,
        keep_alive,
    }))
}

/// How the response body is delimited (RFC 9112 §6.3), and whether the connection can carry
/// another request after it. `transfer_encoding`: whether `headers` hold that field;
/// `content_lengths`: the values of their `Content-Length` fields.
fn framing<'v>(
    status: StatusCode,
    method: &Method,
    headers: &HeaderMap,
    transfer_encoding: bool,
    content_lengths: impl Iterator<Item = &'v [u8]>,
) -> Result<(Framing, bool), String> {
    let mut content_lengths = content_lengths.peekable();
    if *method == Method::HEAD || is_bodyless(status) {
        return Ok((Framing::Empty, true));
    }
    if transfer_encoding {
        let chunked_last = header_tokens(headers, header::TRANSFER_ENCODING)
            .last()
            .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"));
        // With a Content-Length beside it, or another coding last, the message is suspect:
        // read it as the transfer coding says and do not reuse the connection.
        let clean = chunked_last && content_lengths.peek().is_none();
        let framing = if chunked_last {
            Framing::Chunked
        } else {
            Framing::UntilClose
        };
        return Ok((framing, clean));
    }
    let mut length = None;
    for value in content_lengths {
        for piece in value.split(|byte| *byte == b',') {
            let piece = piece.trim_ascii();
            let parsed = (!piece.is_empty() && piece.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(piece).ok()?.parse::<u64>().ok())
                .flatten()
                .ok_or("invalid Content-Length in the response")?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err("conflicting Content-Length values in the response".to_owned());
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(0) => (Framing::Empty, true),
        Some(length) => (Framing::Length(length), true),
        None => (Framing::UntilClose, false),
    })
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Takes a body out of the bytes read from the connection, as far as they go.
#[derive(Debug)]
struct Decoder {
    state: DecodeState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeState {
    Remaining(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    UntilClose,
    Done,
}

/// What decoding the buffered bytes gave.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Data(Bytes),
    NeedMore,
    Done,
}

impl Decoder {
    fn new(framing: Framing) -> Decoder {
        let state = match framing {
            Framing::Empty => DecodeState::Done,
            Framing::Length(length) => DecodeState::Remaining(length),
            Framing::Chunked => DecodeState::ChunkSize,
            Framing::UntilClose => DecodeState::UntilClose,
        };
        Decoder { state }
    }

    fn is_done(&self) -> bool {
        matches!(self.state, DecodeState::Done | DecodeState::Remaining(0))
    }

    fn remaining(&self) -> Option<u64> {
        match self.state {
            DecodeState::Remaining(remaining) => Some(remaining),
            DecodeState::Done => Some(0),
            _ => None,
        }
    }

    fn decode(&mut self, buffer: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            match self.state {
                DecodeState::Done | DecodeState::Remaining(0) => {
                    self.state = DecodeState::Done;
                    return Ok(Step::Done);
                }
                DecodeState::ChunkData(0) => self.state = DecodeState::ChunkEnd,
                DecodeState::Remaining(_) | DecodeState::ChunkData(_) if buffer.is_empty() => {
                    return Ok(Step::NeedMore)
                }
                DecodeState::Remaining(remaining) => {
                    let length = remaining.min(buffer.len() as u64);
                    self.state = DecodeState::Remaining(remaining - length);
                    return Ok(Step::Data(take(buffer, length as usize)));
                }
                DecodeState::ChunkData(remaining) => {
                    let length = remaining.min(buffer.len() as u64);
                    self.state = DecodeState::ChunkData(remaining - length);
                    return Ok(Step::Data(take(buffer, length as usize)));
                }
                DecodeState::UntilClose if buffer.is_empty() => return Ok(Step::NeedMore),
                DecodeState::UntilClose => {
                    let length = buffer.len();
                    return Ok(Step::Data(take(buffer, length)));
                }
                DecodeState::ChunkSize => match httparse::parse_chunk_size(buffer) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buffer.advance(used);
                        self.state = if size == 0 {
                            DecodeState::Trailers
                        } else {
                            DecodeState::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buffer.len() <= MAX_LINE_BYTES => {
                        return Ok(Step::NeedMore)
                    }
                    _ => return Err("invalid chunk size line in the response"),
                },
                DecodeState::ChunkEnd => {
                    if buffer.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &buffer[..2] != b"\r\n" {
                        return Err("a response chunk does not end with CRLF");
                    }
                    buffer.advance(2);
                    self.state = DecodeState::ChunkSize;
                }
                DecodeState::Trailers => {
                    // Trailer fields are read and dropped; an empty line ends the body.
                    match buffer.windows(2).position(|pair| pair == b"\r\n") {
                        Some(0) => {
                            buffer.advance(2);
                            self.state = DecodeState::Done;
                        }
                        Some(end) => buffer.advance(end + 2),
                        None if buffer.len() <= MAX_LINE_BYTES => return Ok(Step::NeedMore),
                        None => return Err("response trailer field too long"),
                    }
                }
            }
        }
    }

    /// The connection reached its end: the end of the body only for a close-delimited one.
    fn at_end_of_stream(&mut self) -> Result<Step, &'static str> {
        match self.state {
            DecodeState::UntilClose | DecodeState::Done => {
                self.state = DecodeState::Done;
                Ok(Step::Done)
            }
            _ => Err("the upstream closed the connection before the end of the body"),
        }
    }
}

fn take(buffer: &mut BytesMut, length: usize) -> Bytes {
    if length <= COPY_AT_MOST {
        let piece = Bytes::copy_from_slice(&buffer[..length]);
        buffer.advance(length);
        piece
    } else {
        buffer.split_to(length).freeze()
    }
}

/// A response body read from the connection as the client takes it; a body read to its end
/// returns the connection to the pool, one dropped half-way closes it.
struct StreamingBody {
    connection: Option<Connection>,
    decoder: Decoder,
    keep_alive: bool,
    idle: Arc<IdleConnections>,
}

impl StreamingBody {
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take() {
            if self.keep_alive && connection.buffer.is_empty() {
                self.idle.checkin(connection);
            }
        }
    }
}

impl http_body::Body for StreamingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(connection) = this.connection.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match this.decoder.decode(&mut connection.buffer) {
                Ok(Step::NeedMore) => match ready!(connection.poll_read_more(cx)) {
                    Ok(0) => this.decoder.at_end_of_stream(),
                    Ok(_) => continue,
                    Err(error) => {
                        this.connection = None;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                },
                step => step,
            };
            return match step {
                Ok(Step::Data(data)) => {
                    if this.decoder.is_done() {
                        // Handing the connection back now: the server may not ask again
                        // once the announced length has gone out.
                        this.finish();
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Ok(Step::Done) => {
                    this.finish();
                    Poll::Ready(None)
                }
                Ok(Step::NeedMore) => continue,
                Err(error) => {
                    this.connection = None;
                    Poll::Ready(Some(Err(error.into())))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.connection.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, input: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
        let mut decoder = Decoder::new(framing);
        let mut buffer = BytesMut::from(input);
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut buffer)? {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::NeedMore => return Ok((body, false)),
                Step::Done => return Ok((body, true)),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let input = b"4;name=value\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: never\r\n\r\nNEXT";
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buffer = BytesMut::from(&input[..]);
        let mut body = Vec::new();
        while let Step::Data(data) = decoder.decode(&mut buffer).unwrap() {
            body.extend_from_slice(&data);
        }
        assert_eq!(body, b"Wikipedia in\r\n\r\nchunks.");
        assert_eq!(
            &buffer[..],
            b"NEXT",
            "the next response stays in the buffer"
        );
    }

    #[test]
    fn chunked_bodies_decode_byte_by_byte() {
        let input = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buffer = BytesMut::new();
        let mut body = Vec::new();
        let mut done = false;
        for byte in input {
            buffer.put_u8(*byte);
            loop {
                match decoder.decode(&mut buffer).unwrap() {
                    Step::Data(data) => body.extend_from_slice(&data),
                    Step::NeedMore => break,
                    Step::Done => {
                        done = true;
                        break;
                    }
                }
            }
        }
        assert!(done);
        assert_eq!(body, b"abc0123456789abcdef");
    }

    #[test]
    fn malformed_chunks_are_errors() {
        assert!(decode_all(Framing::Chunked, b"zz\r\nab\r\n").is_err());
        assert!(decode_all(Framing::Chunked, b"2\r\nabXX0\r\n\r\n").is_err());
        assert!(decode_all(Framing::Chunked, &[b'1'; 20]).is_err());
        let long_line = [b"0\r\nx: ".as_slice(), &[b'y'; MAX_LINE_BYTES + 10]].concat();
        assert!(decode_all(Framing::Chunked, &long_line).is_err());
    }

    #[test]
    fn length_bodies_stop_at_their_length() {
        assert_eq!(
            decode_all(Framing::Length(5), b"helloHTTP/1.1").unwrap(),
            (b"hello".to_vec(), true)
        );
        assert_eq!(
            decode_all(Framing::Length(10), b"hello").unwrap(),
            (b"hello".to_vec(), false)
        );
        let mut decoder = Decoder::new(Framing::Length(10));
        assert!(
            decoder.at_end_of_stream().is_err(),
            "a short body is an error"
        );
        let mut decoder = Decoder::new(Framing::UntilClose);
        assert_eq!(decoder.at_end_of_stream(), Ok(Step::Done));
    }

    /// The head parsed from `text`, and how many bytes of it that took.
    fn head(text: &str, method: &Method) -> Result<Option<(Head, usize)>, String> {
        let mut buffer = BytesMut::from(text);
        let head = parse_head(&mut buffer, &mut KnownNames::default(), method)?;
        Ok(head.map(|head| (head, text.len() - buffer.len())))
    }

    #[test]
    fn response_heads_say_how_the_body_is_framed() {
        let text = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello";
        let (parsed, length) = head(text, &Method::GET).unwrap().unwrap();
        assert_eq!(length, text.len() - "hello".len());
        assert_eq!(parsed.status, StatusCode::OK);
        assert_eq!(parsed.framing, Framing::Length(5));
        assert!(parsed.keep_alive);
        assert_eq!(parsed.headers.get_all("x-a").iter().count(), 2);

        let framing_of = |text: &str, method: &Method| {
            let (parsed, _) = head(text, method).unwrap().unwrap();
            (parsed.framing, parsed.keep_alive)
        };
        assert_eq!(
            framing_of(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                &Method::GET
            ),
            (Framing::Chunked, true)
        );
        assert_eq!(
            framing_of(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                &Method::GET
            ),
            (Framing::Chunked, false),
            "both framings: chunked wins and the connection is not reused"
        );
        assert_eq!(
            framing_of("HTTP/1.1 200 OK\r\n\r\n", &Method::GET),
            (Framing::UntilClose, false)
        );
        assert_eq!(
            framing_of(
                "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
                &Method::HEAD
            ),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing_of(
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                &Method::GET
            ),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing_of(
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
                &Method::GET
            ),
            (Framing::Length(2), false)
        );
        assert_eq!(
            framing_of("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", &Method::GET),
            (Framing::Length(2), false)
        );
        assert_eq!(
            framing_of(
                "HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\n\r\n",
                &Method::GET
            ),
            (Framing::Length(7), true)
        );
    }

    #[test]
    fn a_connections_later_responses_are_framed_by_the_names_it_kept() {
        let mut names = KnownNames::default();
        for (text, length) in [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n",
                Some(2),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 2\r\n\r\n",
                Some(5),
            ),
            (
                "HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 7\r\nx-a: 3\r\n\r\n",
                Some(7),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
                None,
            ),
        ] {
            let mut buffer = BytesMut::from(text);
            let parsed = parse_head(&mut buffer, &mut names, &Method::GET);
            let Some(length) = length else {
                assert!(parsed.is_err(), "conflicting lengths in {text:?}");
                continue;
            };
            let parsed = parsed.unwrap().unwrap();
            assert_eq!(parsed.framing, Framing::Length(length));
            assert_eq!(parsed.headers.get_all("x-a").iter().count(), 1);
            assert!(buffer.is_empty(), "the head is taken out of the buffer");
        }
    }

    #[test]
    fn bad_response_heads_are_errors_and_partial_ones_wait() {
        assert!(head("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET)
            .unwrap()
            .is_none());
        assert!(head(
            "HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
            &Method::GET
        )
        .is_err());
        assert!(head(
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            &Method::GET
        )
        .is_err());
        assert!(head(
            "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
            &Method::GET
        )
        .is_err());
        assert!(head("SMTP ready\r\n\r\n", &Method::GET).is_err());
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "x: y\r\n".repeat(MAX_RESPONSE_FIELDS + 1)
        );
        assert!(head(&many, &Method::GET).is_err());
    }

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
        let request_id = crate::RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding::new(std::iter::empty(), &request_id, &peer, "http", None);
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
        let request_id = crate::RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding::new(
            headers.get_all("x-forwarded-for").iter(),
            &request_id,
            &peer,
            "http",
            Some(&host),
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
