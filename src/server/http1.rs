//! The server's own HTTP/1.1 keep-alive path. Bodyless HTTP/1.1 requests (nearly all of a
//! proxy's traffic) are read, answered and written by the connection's task itself, without
//! hyper's dispatcher. Anything else — a request with a body, an upgrade, `Expect`, HTTP/1.0,
//! an absolute-form target, HTTP/2's preface, a head that does not parse or does not fit —
//! hands the connection, with every byte read so far, to hyper for the rest of its life, so
//! hyper's protocol guards (400, 431, body framing, 100-continue, upgrades, h2c) still apply
//! to it.

use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::time::Instant;

use bytes::BytesMut;
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::{ConnectionGuards, Watchdog};
use crate::gateway::{Connection, Gateway, RequestBody};
use crate::respond::SetFields;
use crate::wire::date::with_date;
use crate::wire::header_names::KnownNames;
use crate::wire::message::{header_tokens, is_bodyless, MAX_REQUEST_FIELDS};
use crate::wire::write_header_field;
use crate::Body;

/// Body chunks up to this size are copied behind the response head and go out in one write;
/// larger ones are written from where they are.
const COPY_AT_MOST: usize = 16 * 1024;

/// How the connection ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ending {
    Closed,
    /// hyper serves the rest of the connection, starting with the bytes left in the buffer.
    HandOver,
}

/// Serves requests from `io` until the connection closes or a request needs hyper. A head
/// longer than `guards.max_head_bytes` goes to hyper (its 431); a head must be complete
/// within `guards.header_read_timeout` of its first byte (of the accept, for the first one).
pub(super) async fn serve<S>(
    io: &mut S,
    buffer: &mut BytesMut,
    watchdog: &mut Watchdog,
    shutdown: &watch::Receiver<bool>,
    guards: &ConnectionGuards,
    gateway: &Gateway,
    connection: &Connection,
) -> Ending
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = BytesMut::new();
    let mut fields = SetFields::default();
    let mut names = KnownNames::default();
    // One wait for the shutdown signal for the connection's life, not one per request.
    let mut signal = shutdown.clone();
    let mut shutting_down = std::pin::pin!(signal.changed());
    // The first head's clock starts at the accept: a connection that sends nothing is cut
    // off like one whose head trickles in.
    let mut head_started = Some(Instant::now());
    loop {
        let (request, keep_alive) = loop {
            // An empty buffer, the usual state between requests, holds nothing to parse.
            if !buffer.is_empty() {
                match parse_request(buffer, guards.max_head_bytes, &mut names) {
                    Parsed::Request {
                        request,
                        keep_alive,
                    } => break (request, keep_alive),
                    Parsed::HandOver => return Ending::HandOver,
                    Parsed::Partial => {}
                }
            }
            if !buffer.is_empty() && head_started.is_none() {
                head_started = Some(Instant::now());
            }
            if buffer.capacity() - buffer.len() < 1024 {
                buffer.reserve(4096);
            }
            tokio::select! {
                biased;
                read = io.read_buf(buffer) => match read {
                    Ok(0) | Err(_) => return Ending::Closed,
                    Ok(_) => {}
                },
                _ = &mut shutting_down => return Ending::Closed,
                idle = watchdog.tick() => {
                    let head_late = head_started
                        .is_some_and(|started| started.elapsed() >= guards.header_read_timeout);
                    if idle || head_late {
                        return Ending::Closed;
                    }
                }
            }
        };
        head_started = None;
        let head_only = request.method() == Method::HEAD;
        fields.clear();
        let response = {
            let mut handling = std::pin::pin!(gateway.handle(request, connection, &mut fields));
            loop {
                // Reading on while the request is served notices a client that goes away (the
                // request is dropped, as hyper does) and keeps pipelined requests.
                tokio::select! {
                    biased;
                    response = &mut handling => break response,
                    read = io.read_buf(buffer), if buffer.len() < guards.max_head_bytes => match read {
                        Ok(0) | Err(_) => return Ending::Closed,
                        Ok(_) => {}
                    },
                }
            }
        };
        let close = !keep_alive || shutdown.has_changed().unwrap_or(true);
        let (parts, body) = response.into_parts();
        out.clear();
        let head = encode_response_head(
            parts.status,
            &parts.headers,
            &fields,
            body.size_hint().exact(),
            head_only,
            close,
            &mut out,
        );
        // The head is written: the map can hold another response's.
        crate::wire::header_maps::give_back(parts.headers);
        let written = tokio::select! {
            written = write_body(io, &mut out, body, head.framing) => written,
            _ = watchdog.until_idle() => return Ending::Closed,
        };
        if written.is_err() {
            return Ending::Closed;
        }
        if head.close {
            let _ = io.shutdown().await;
            return Ending::Closed;
        }
    }
}

/// What `parse_request` found at the start of the buffer.
// Matched as soon as it is returned: boxing the request would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Parsed {
    /// A bodyless HTTP/1.1 request, taken out of the buffer; `keep_alive` is false when the
    /// client asked to close.
    Request {
        request: Request<RequestBody>,
        keep_alive: bool,
    },
    /// The head is not complete yet.
    Partial,
    /// Not for this path: hyper takes the connection.
    HandOver,
}

/// Parses the request head at the start of `buffer`.
pub(super) fn parse_request(
    buffer: &mut BytesMut,
    max_head: usize,
    names: &mut KnownNames,
) -> Parsed {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_REQUEST_FIELDS];
    let mut parsed = httparse::Request::new(&mut []);
    let config = httparse::ParserConfig::default();
    let head_length =
        match config.parse_request_with_uninit_headers(&mut parsed, buffer, &mut fields) {
            Ok(httparse::Status::Complete(length)) if length <= max_head => length,
            Ok(httparse::Status::Partial) if buffer.len() < max_head => return Parsed::Partial,
            _ => return Parsed::HandOver,
        };
    let (Some(method), Some(target), Some(1)) = (parsed.method, parsed.path, parsed.version) else {
        return Parsed::HandOver;
    };
    if !target.starts_with('/') {
        return Parsed::HandOver;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::HandOver;
    };
    // Where the target and each field lie in the head, so that they can be sliced out of it
    // once it is taken from the buffer.
    let base = buffer.as_ptr() as usize;
    let range_of = |part: &[u8]| {
        let start = part.as_ptr() as usize - base;
        start..start + part.len()
    };
    let target = range_of(target.as_bytes());
    let mut keep_alive = true;
    let mut ranges: SmallVec<[(Range<usize>, Range<usize>); 16]> = SmallVec::new();
    for field in parsed.headers.iter() {
        let name = field.name.as_bytes();
        // Only these names matter here; their lengths tell them apart from most others cheaply.
        let is = |wanted: &[u8]| name.len() == wanted.len() && name.eq_ignore_ascii_case(wanted);
        match name.len() {
            6 | 7 | 14 | 17
                if is(b"transfer-encoding")
                    || is(b"upgrade")
                    || is(b"expect")
                    || (is(b"content-length") && field.value != b"0") =>
            {
                return Parsed::HandOver;
            }
            10 if is(b"connection") => {
                keep_alive &= !field
                    .value
                    .split(|byte| *byte == b',')
                    .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
            }
            _ => {}
        }
        ranges.push((range_of(name), range_of(field.value)));
    }
    let head = buffer.split_to(head_length).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(target)) else {
        return Parsed::HandOver;
    };
    // The gateway adds nothing to this map on the way upstream (see `upstream::Forwarding`).
    let mut headers = crate::wire::header_maps::take(ranges.len());
    for (name, value) in ranges {
        let (Some(name), Ok(value)) = (
            names.name(&head[name]),
            HeaderValue::from_maybe_shared(head.slice(value)),
        ) else {
            return Parsed::HandOver;
        };
        headers.append(name, value);
    }
    let mut request = Request::new(RequestBody::Empty);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Parsed::Request {
        request,
        keep_alive,
    }
}

/// How a response's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// HEAD, 1xx, 204, 304: no body, whatever the headers say.
    None,
    /// Delimited by Content-Length.
    Length,
    Chunked,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct ResponseHead {
    pub(super) framing: Framing,
    /// The connection closes after this response.
    pub(super) close: bool,
}

/// Writes the status line and header fields into `out`, `fields` in place of the map's fields
/// of the same names, adding `date`, the body's framing and `connection: close` where needed.
/// `body_length` is the body's exact length when known.
pub(super) fn encode_response_head(
    status: StatusCode,
    headers: &HeaderMap,
    fields: &SetFields,
    body_length: Option<u64>,
    head_only: bool,
    mut close: bool,
    out: &mut BytesMut,
) -> ResponseHead {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let (mut has_length, mut has_date) = (false, false);
    for (name, value) in headers {
        if *name == header::TRANSFER_ENCODING {
            continue;
        }
        if *name == header::CONNECTION {
            close |= header_tokens(headers, header::CONNECTION)
                .any(|token| token.eq_ignore_ascii_case("close"));
            continue;
        }
        if fields.sets(name) {
            continue;
        }
        has_length |= *name == header::CONTENT_LENGTH;
        has_date |= *name == header::DATE;
        write_header_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    fields.write(|name, value| write_header_field(out, name, value));
    if !has_date {
        with_date(|date| write_header_field(out, b"date", date));
    }
    let framing = if is_bodyless(status) {
        Framing::None
    } else {
        if !has_length {
            if let Some(length) = body_length {
                write_header_field(
                    out,
                    b"content-length",
                    itoa::Buffer::new().format(length).as_bytes(),
                );
                has_length = true;
            }
        }
        match (head_only, has_length) {
            (true, _) => Framing::None,
            (false, true) => Framing::Length,
            (false, false) => {
                write_header_field(out, b"transfer-encoding", b"chunked");
                Framing::Chunked
            }
        }
    };
    if close {
        write_header_field(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    ResponseHead { framing, close }
}

/// Writes `out` (the response head) and the body after it. What is in hand goes out in one
/// write; a body still arriving is written as it comes. A body that fails ends the connection
/// (its length would be wrong).
async fn write_body<S>(
    io: &mut S,
    out: &mut BytesMut,
    mut body: Body,
    framing: Framing,
) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let chunked = framing == Framing::Chunked;
    let mut trailers = None;
    if framing != Framing::None {
        loop {
            let frame = match body.frame().now_or_never() {
                Some(frame) => frame,
                None => {
                    write_out(io, out).await?;
                    body.frame().await
                }
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(io::Error::other)?;
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    continue;
                }
            };
            if data.is_empty() {
                continue;
            }
            if chunked {
                let mut size = [0u8; 16];
                out.extend_from_slice(hex(data.len(), &mut size));
                out.extend_from_slice(b"\r\n");
            }
            if data.len() <= COPY_AT_MOST {
                out.extend_from_slice(&data);
            } else {
                write_out(io, out).await?;
                io.write_all(&data).await?;
            }
            if chunked {
                out.extend_from_slice(b"\r\n");
            }
        }
        if chunked {
            out.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                write_header_field(out, name.as_str().as_bytes(), value.as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    write_out(io, out).await?;
    io.flush().await
}

async fn write_out<S: AsyncWrite + Unpin>(io: &mut S, out: &mut BytesMut) -> io::Result<()> {
    if !out.is_empty() {
        io.write_all(out).await?;
        out.clear();
    }
    Ok(())
}

/// `value` in lower-case hexadecimal, written at the end of `buffer`.
fn hex(mut value: usize, buffer: &mut [u8; 16]) -> &[u8] {
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b"0123456789abcdef"[value % 16];
        value /= 16;
        if value == 0 {
            return &buffer[start..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::Response;

    use crate::respond::FieldValue;
    use crate::RequestId;

    /// A response whose body is all in memory.
    fn full(bytes: &'static [u8]) -> Response<Body> {
        Response::new(Body::full(Bytes::from_static(bytes)))
    }

    fn parse(text: &str) -> (Parsed, BytesMut) {
        let mut buffer = BytesMut::from(text);
        (
            parse_request(&mut buffer, 8192, &mut KnownNames::default()),
            buffer,
        )
    }

    fn request(text: &str) -> (Request<RequestBody>, bool, BytesMut) {
        match parse(text) {
            (
                Parsed::Request {
                    request,
                    keep_alive,
                },
                rest,
            ) => (request, keep_alive, rest),
            (other, _) => panic!("{text:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn a_bodyless_request_is_taken_out_of_the_buffer_leaving_the_next_one() {
        let (request, keep_alive, rest) = request(
            "GET /a/b?x=1 HTTP/1.1\r\nHost: example.com\r\nX-Api-Key: k\r\nx-api-key: l\r\n\r\nGET /next",
        );
        assert!(keep_alive);
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri().path(), "/a/b");
        assert_eq!(request.uri().query(), Some("x=1"));
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()["host"], "example.com");
        let keys: Vec<_> = request.headers().get_all("x-api-key").iter().collect();
        assert_eq!(keys, ["k", "l"]);
        assert!(matches!(request.body(), RequestBody::Empty));
        assert_eq!(&rest[..], b"GET /next");
    }

    #[test]
    fn connection_close_ends_keep_alive_and_an_empty_length_is_bodyless() {
        let (_, keep_alive, _) =
            request("DELETE /x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\n\r\n");
        assert!(!keep_alive);
        let (request, keep_alive, _) =
            request("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        assert!(keep_alive);
        assert_eq!(request.method(), Method::POST);
    }

    #[test]
    fn an_incomplete_head_waits_for_more_until_it_outgrows_the_limit() {
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nHost: a\r\n").0,
            Parsed::Partial
        ));
        assert!(matches!(parse("").0, Parsed::Partial));
        let mut long = BytesMut::from(format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(200)).as_str());
        assert!(matches!(
            parse_request(&mut long, 100, &mut KnownNames::default()),
            Parsed::HandOver
        ));
        let mut complete_but_long = BytesMut::from("GET / HTTP/1.1\r\nX: aaaaaaaaaa\r\n\r\n");
        assert!(matches!(
            parse_request(&mut complete_but_long, 20, &mut KnownNames::default()),
            Parsed::HandOver
        ));
    }

    #[test]
    fn whatever_needs_hyper_is_handed_over_with_the_buffer_untouched() {
        let cases = [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "G\x01T / HTTP/1.1\r\n\r\n",
        ];
        for case in cases {
            let (parsed, rest) = parse(case);
            assert!(matches!(parsed, Parsed::HandOver), "{case:?}");
            assert_eq!(&rest[..], case.as_bytes(), "{case:?}");
        }
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(MAX_REQUEST_FIELDS + 1)
        );
        assert!(matches!(parse(&many).0, Parsed::HandOver));
    }

    fn head(response: &Response<Body>, head_only: bool, close: bool) -> (String, ResponseHead) {
        head_with(response, &SetFields::default(), head_only, close)
    }

    fn head_with(
        response: &Response<Body>,
        fields: &SetFields,
        head_only: bool,
        close: bool,
    ) -> (String, ResponseHead) {
        let mut out = BytesMut::new();
        let head = encode_response_head(
            response.status(),
            response.headers(),
            fields,
            response.body().size_hint().exact(),
            head_only,
            close,
            &mut out,
        );
        (String::from_utf8(out.to_vec()).unwrap(), head)
    }

    #[test]
    fn a_body_in_memory_gets_its_length_and_the_head_gets_a_date() {
        let mut response = full(b"hello");
        response
            .headers_mut()
            .insert("x-thing", HeaderValue::from_static("1"));
        let (text, head) = head(&response, false, false);
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\nx-thing: 1\r\ndate: "),
            "{text}"
        );
        assert!(
            text.ends_with(" GMT\r\ncontent-length: 5\r\n\r\n"),
            "{text}"
        );
        assert_eq!(
            head,
            ResponseHead {
                framing: Framing::Length,
                close: false
            }
        );
    }

    #[test]
    fn the_gateways_fields_replace_the_upstreams_of_the_same_name() {
        static LIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit-limit");
        let mut response = full(b"hello");
        let headers = response.headers_mut();
        headers.insert("ratelimit-limit", HeaderValue::from_static("7"));
        headers.insert("x-thing", HeaderValue::from_static("1"));
        headers.insert("x-request-id", HeaderValue::from_static("upstream's"));
        let mut fields = SetFields::default();
        fields.set(&LIMIT, FieldValue::Number(120));
        fields.set(
            &crate::gateway::REQUEST_ID_NAME,
            FieldValue::RequestId(RequestId::Made([b'a'; 32])),
        );
        let (text, _) = head_with(&response, &fields, false, false);
        let fields_written = format!(
            "HTTP/1.1 200 OK\r\nx-thing: 1\r\nratelimit-limit: 120\r\nx-request-id: {}\r\ndate: ",
            "a".repeat(32)
        );
        assert!(text.starts_with(&fields_written), "{text}");
        // hyper's path, through the map, carries the same fields.
        fields.apply(response.headers_mut());
        let headers = response.headers();
        assert_eq!(headers.len(), 3);
        assert_eq!(headers["ratelimit-limit"], "120");
        assert_eq!(headers["x-request-id"], "a".repeat(32).as_str());
        assert_eq!(headers["x-thing"], "1");
    }

    #[test]
    fn a_body_of_unknown_length_is_chunked_and_headers_of_the_upstream_are_kept() {
        let mut response = Response::new(Body::boxed(http_body_util::StreamBody::new(
            futures_util::stream::empty::<Result<http_body::Frame<Bytes>, crate::BoxError>>(),
        )));
        *response.status_mut() = StatusCode::from_u16(599).unwrap();
        let headers = response.headers_mut();
        headers.insert(header::DATE, HeaderValue::from_static("then"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let (text, head) = head(&response, false, true);
        assert_eq!(
            text,
            "HTTP/1.1 599 \r\ndate: then\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        assert_eq!(
            head,
            ResponseHead {
                framing: Framing::Chunked,
                close: true
            }
        );
    }

    #[test]
    fn head_204_and_304_have_no_body_and_a_response_can_ask_to_close() {
        let (text, result) = head(&full(b"hello"), true, false);
        assert!(text.contains("content-length: 5\r\n"), "{text}");
        assert_eq!(result.framing, Framing::None);
        let mut no_content = full(b"");
        *no_content.status_mut() = StatusCode::NO_CONTENT;
        no_content
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        let (text, result) = head(&no_content, false, false);
        assert!(!text.contains("content-length"), "{text}");
        assert!(text.ends_with("connection: close\r\n\r\n"), "{text}");
        assert_eq!(
            result,
            ResponseHead {
                framing: Framing::None,
                close: true
            }
        );
    }

    #[tokio::test]
    async fn bodies_are_written_with_their_framing() {
        let mut written = Vec::new();
        let mut out = BytesMut::from("HEAD\r\n");
        let body = full(b"hello").into_body();
        write_body(&mut written, &mut out, body, Framing::Chunked)
            .await
            .unwrap();
        assert_eq!(written, b"HEAD\r\n5\r\nhello\r\n0\r\n\r\n");
        let mut written = Vec::new();
        let large = vec![b'x'; COPY_AT_MOST + 1];
        let body = Body::full(large.clone());
        write_body(
            &mut written,
            &mut BytesMut::from("HEAD\r\n"),
            body,
            Framing::Length,
        )
        .await
        .unwrap();
        assert_eq!(written.len(), 6 + large.len());
        let mut written = Vec::new();
        write_body(
            &mut written,
            &mut BytesMut::from("HEAD\r\n"),
            full(b"x").into_body(),
            Framing::None,
        )
        .await
        .unwrap();
        assert_eq!(written, b"HEAD\r\n");
    }

    #[test]
    fn chunk_sizes_are_hexadecimal() {
        let mut buffer = [0u8; 16];
        assert_eq!(hex(0, &mut buffer), b"0");
        assert_eq!(hex(255, &mut buffer), b"ff");
        assert_eq!(hex(16 * 1024 + 1, &mut buffer), b"4001");
    }
}
