//! Responses on the own path: the head encoded with the gateway's fields, and the body
//! written with its framing.

use std::io;

use bytes::BytesMut;
use futures_util::FutureExt;
use http::header::{self, HeaderMap};
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::body::Body;
use crate::limit::clock;
use crate::respond::SetFields;
use crate::wire::date::with_date;
use crate::wire::message::{header_tokens, is_bodyless};
use crate::wire::write_header_field;

/// Body chunks up to this size are copied behind the response head and go out in one write;
/// larger ones are written from where they are.
const COPY_AT_MOST: usize = 16 * 1024;

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
        let unix = fields
            .date()
            .map_or_else(clock::unix_time, |now| now.unix());
        with_date(unix, |date| write_header_field(out, b"date", date));
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

/// Writes `out` (the response head, after any earlier responses held there) and the body
/// after it. What is in hand goes out in one write; a body still arriving is written as it
/// comes. With `hold`, a response wholly in hand stays in `out` for the next one to join (the
/// caller writes it before it waits for anything). A body that fails ends the connection (its
/// length would be wrong). While it waits for the body, the connection is read on into
/// `inbound` (up to `max_inbound` bytes): a client that goes away ends the response there and
/// then, and pipelined requests are kept.
pub(super) async fn write_body<S>(
    io: &mut S,
    out: &mut BytesMut,
    mut body: Body,
    framing: Framing,
    inbound: &mut BytesMut,
    max_inbound: usize,
    hold: bool,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let chunked = framing == Framing::Chunked;
    let mut trailers = None;
    if framing != Framing::None {
        loop {
            let frame = match body.frame().now_or_never() {
                Some(frame) => frame,
                None => {
                    write_out(io, out).await?;
                    next_frame(io, &mut body, inbound, max_inbound).await?
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
    if hold {
        return Ok(());
    }
    send_out(io, out).await
}

/// Writes what `out` holds and flushes it through (TLS keeps records until flushed).
pub(super) async fn send_out<S: AsyncWrite + Unpin>(
    io: &mut S,
    out: &mut BytesMut,
) -> io::Result<()> {
    write_out(io, out).await?;
    io.flush().await
}

/// The body's next frame, reading on meanwhile; `Err` when the client went away.
async fn next_frame<S: AsyncRead + Unpin>(
    io: &mut S,
    body: &mut Body,
    inbound: &mut BytesMut,
    max_inbound: usize,
) -> io::Result<Option<Result<http_body::Frame<bytes::Bytes>, crate::body::BoxError>>> {
    loop {
        tokio::select! {
            biased;
            frame = body.frame() => return Ok(frame),
            read = io.read_buf(inbound), if inbound.len() < max_inbound => match read {
                Ok(0) => return Err(io::ErrorKind::ConnectionAborted.into()),
                Err(error) => return Err(error),
                Ok(_) => {}
            },
        }
    }
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
    use http::{HeaderValue, Response};
    use http_body::Body as _;

    use crate::request_id::RequestId;
    use crate::respond::FieldValue;

    /// A response whose body is all in memory.
    fn full(bytes: &'static [u8]) -> Response<Body> {
        Response::new(Body::full(Bytes::from_static(bytes)))
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
            &crate::request_id::REQUEST_ID_NAME,
            FieldValue::RequestId(RequestId::Made([b'a'; 36])),
        );
        let (text, _) = head_with(&response, &fields, false, false);
        let fields_written = format!(
            "HTTP/1.1 200 OK\r\nx-thing: 1\r\nratelimit-limit: 120\r\nx-request-id: {}\r\ndate: ",
            "a".repeat(36)
        );
        assert!(text.starts_with(&fields_written), "{text}");
        // hyper's path, through the map, carries the same fields.
        fields.apply(response.headers_mut());
        let headers = response.headers();
        assert_eq!(headers.len(), 3);
        assert_eq!(headers["ratelimit-limit"], "120");
        assert_eq!(headers["x-request-id"], "a".repeat(36).as_str());
        assert_eq!(headers["x-thing"], "1");
    }

    #[test]
    fn a_body_of_unknown_length_is_chunked_and_headers_of_the_upstream_are_kept() {
        let mut response = Response::new(Body::boxed(http_body_util::StreamBody::new(
            futures_util::stream::empty::<Result<http_body::Frame<Bytes>, crate::body::BoxError>>(),
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

    /// What `write_body` writes of `body` after `HEAD\r\n`, on a connection.
    async fn written(body: Body, framing: Framing) -> Vec<u8> {
        let (mut server, mut client) = tokio::io::duplex(1 << 20);
        let mut inbound = BytesMut::new();
        let mut out = BytesMut::from("HEAD\r\n");
        write_body(
            &mut server,
            &mut out,
            body,
            framing,
            &mut inbound,
            1024,
            false,
        )
        .await
        .unwrap();
        drop(server);
        let mut written = Vec::new();
        client.read_to_end(&mut written).await.unwrap();
        written
    }

    #[tokio::test]
    async fn bodies_are_written_with_their_framing() {
        let chunked = written(full(b"hello").into_body(), Framing::Chunked).await;
        assert_eq!(chunked, b"HEAD\r\n5\r\nhello\r\n0\r\n\r\n");
        let large = vec![b'x'; COPY_AT_MOST + 1];
        let length = written(Body::full(large.clone()), Framing::Length).await;
        assert_eq!(length.len(), 6 + large.len());
        let none = written(full(b"x").into_body(), Framing::None).await;
        assert_eq!(none, b"HEAD\r\n");
    }

    type Frames = tokio::sync::mpsc::Sender<Result<http_body::Frame<Bytes>, std::io::Error>>;

    /// A body whose frames are what is sent on the channel, and that ends when it closes.
    fn sent_body() -> (Frames, Body) {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        let frames = tokio_stream::wrappers::ReceiverStream::new(receiver);
        (sender, Body::boxed(http_body_util::StreamBody::new(frames)))
    }

    #[tokio::test]
    async fn a_client_that_leaves_while_the_body_is_awaited_ends_the_response() {
        let (mut server, client) = tokio::io::duplex(1 << 16);
        // A body whose next frame never comes.
        let (_sender, body) = sent_body();
        drop(client);
        let mut out = BytesMut::from("HEAD\r\n");
        let mut inbound = BytesMut::new();
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            write_body(
                &mut server,
                &mut out,
                body,
                Framing::Chunked,
                &mut inbound,
                1024,
                false,
            ),
        )
        .await
        .expect("the response ends when its client leaves, not when its body does");
        assert!(result.is_err());
    }

    #[tokio::test]
    async fn a_held_response_in_hand_stays_in_the_buffer_and_one_still_arriving_is_written() {
        let (mut server, mut client) = tokio::io::duplex(1 << 16);
        let mut inbound = BytesMut::new();
        let mut out = BytesMut::from("EARLIER\r\nHEAD\r\n");
        let body = full(b"hello").into_body();
        write_body(
            &mut server,
            &mut out,
            body,
            Framing::Length,
            &mut inbound,
            1024,
            true,
        )
        .await
        .unwrap();
        assert_eq!(&out[..], b"EARLIER\r\nHEAD\r\nhello");

        // A body that is not in hand: what is held goes out before the wait, not after it.
        let (sender, body) = sent_body();
        out.extend_from_slice(b"\r\nNEXT\r\n");
        let writing = write_body(
            &mut server,
            &mut out,
            body,
            Framing::Chunked,
            &mut inbound,
            1024,
            true,
        );
        let reading = async {
            let mut seen = vec![0; 32];
            let read = client.read(&mut seen).await.unwrap();
            seen.truncate(read);
            sender
                .send(Ok(http_body::Frame::data(Bytes::from_static(b"x"))))
                .await
                .unwrap();
            drop(sender);
            seen
        };
        let (written, seen) = tokio::join!(writing, reading);
        written.unwrap();
        assert_eq!(seen, b"EARLIER\r\nHEAD\r\nhello\r\nNEXT\r\n");
        assert_eq!(
            &out[..],
            b"1\r\nx\r\n0\r\n\r\n",
            "the end of a chunked body held"
        );
    }

    #[test]
    fn chunk_sizes_are_hexadecimal() {
        let mut buffer = [0u8; 16];
        assert_eq!(hex(0, &mut buffer), b"0");
        assert_eq!(hex(255, &mut buffer), b"ff");
        assert_eq!(hex(16 * 1024 + 1, &mut buffer), b"4001");
    }
}
