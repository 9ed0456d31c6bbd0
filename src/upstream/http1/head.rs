//! Response heads from an upstream: parsed, and what they say about the body's framing and
//! the connection's reuse.

use std::ops::Range;

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;

use super::body::Framing;
use crate::wire::header_names::KnownNames;
use crate::wire::message::{
    header_tokens, is_bodyless, may_reuse_after, MAX_RESPONSE_FIELDS, MAX_RESPONSE_HEAD_BYTES,
};

/// Fields the gateway may add to a response (`RateLimit-*`, `Retry-After`, the request id, a
/// `Date`, HSTS): room for them is made in a response's map when it is parsed.
const ADDED_FIELDS: usize = 8;

/// A parsed response head and what it says about the body and the connection.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
}

/// Why an upstream's response head is refused (the exchange fails: 502).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("invalid response head: {0}")]
    Invalid(httparse::Error),
    #[error("response head too large")]
    TooLarge,
    #[error("invalid response status")]
    Status,
    #[error("invalid response header name {0:?}")]
    Name(String),
    #[error("invalid value of response header {0}")]
    Value(HeaderName),
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    TransferEncodingInHttp10,
    #[error("invalid Content-Length in the response")]
    ContentLength,
    #[error("conflicting Content-Length values in the response")]
    ConflictingContentLengths,
}

/// Parses a response head from the start of `buffer`: `Ok(None)` until it is complete, then
/// the head, taken out of the buffer.
pub(super) fn parse_head(
    buffer: &mut BytesMut,
    names: &mut KnownNames,
    method: &Method,
) -> Result<Option<Head>, HeadError> {
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
        Err(error) => return Err(HeadError::Invalid(error)),
    };
    if length > MAX_RESPONSE_HEAD_BYTES {
        return Err(HeadError::TooLarge);
    }
    let (status, version) = status_line(&parsed)?;
    // The gateway's own fields go beside the map (`respond::SetFields`) on the own path, and
    // into it on hyper's, where room for them spares the map a growth.
    let mut headers = crate::wire::header_maps::take(parsed.headers.len() + ADDED_FIELDS);
    // Noted on the way, so that a response without them is not searched for them.
    let (mut transfer_encoding, mut connection) = (false, false);
    let base = buffer.as_ptr() as usize;
    let mut values: SmallVec<[(HeaderName, Range<usize>); 16]> = SmallVec::new();
    // Where the `Content-Length` values lie, so that the framing needs no look-up.
    let mut content_lengths: SmallVec<[Range<usize>; 2]> = SmallVec::new();
    for field in parsed.headers.iter() {
        let name = names
            .name(field.name.as_bytes())
            .ok_or_else(|| HeadError::Name(field.name.to_owned()))?;
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
            .map_err(|_| HeadError::Value(name.clone()))?;
        headers.append(name, value);
    }
    let content_lengths = content_lengths.into_iter().map(|range| &head[range]);
    let (framing, reusable) = framing(
        status,
        method,
        version,
        &headers,
        transfer_encoding,
        content_lengths,
    )?;
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

/// The response's status, and its version (HTTP/1.0 unless it says 1.1).
#[inline(always)]
fn status_line(parsed: &httparse::Response<'_, '_>) -> Result<(StatusCode, Version), HeadError> {
    let status = parsed
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or(HeadError::Status)?;
    let version = if parsed.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    Ok((status, version))
}

/// How the response body is delimited (RFC 9112 §6.3), and whether the connection can carry
/// another request after it. `transfer_encoding`: whether `headers` hold that field;
/// `content_lengths`: the values of their `Content-Length` fields.
pub(super) fn framing<'v>(
    status: StatusCode,
    method: &Method,
    version: Version,
    headers: &HeaderMap,
    transfer_encoding: bool,
    content_lengths: impl Iterator<Item = &'v [u8]>,
) -> Result<(Framing, bool), HeadError> {
    let mut content_lengths = content_lengths.peekable();
    if *method == Method::HEAD || is_bodyless(status) {
        return Ok((Framing::Empty, may_reuse_after(method, status, headers)));
    }
    if transfer_encoding && version == Version::HTTP_10 {
        // RFC 9112 §6.1: its framing is faulty; refused, as hyper's client refuses it.
        return Err(HeadError::TransferEncodingInHttp10);
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
                .ok_or(HeadError::ContentLength)?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(HeadError::ConflictingContentLengths);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The head parsed from `text`, and how many bytes of it that took.
    fn head(text: &str, method: &Method) -> Result<Option<(Head, usize)>, HeadError> {
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
    }

    #[test]
    fn each_framing_rule_says_whether_the_connection_is_reused() {
        let (get, head_method) = (&Method::GET, &Method::HEAD);
        let cases = [
            // Both framings: chunked wins and the connection is not reused.
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                get,
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                get,
                Framing::Chunked,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", get, Framing::UntilClose, false),
            // No body, but one announced: the connection ends with it (stray bytes).
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
                head_method,
                Framing::Empty,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", head_method, Framing::Empty, true),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                get,
                Framing::Empty,
                false,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\n\r\n",
                get,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
                get,
                Framing::Length(2),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
                get,
                Framing::Length(2),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\n\r\n",
                get,
                Framing::Length(7),
                true,
            ),
        ];
        for (text, method, framing, reused) in cases {
            let (parsed, _) = head(text, method).unwrap().unwrap();
            assert_eq!(
                (parsed.framing, parsed.keep_alive),
                (framing, reused),
                "{text:?}"
            );
        }
        let chunked_http10 = "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            head(chunked_http10, get).unwrap_err(),
            HeadError::TransferEncodingInHttp10,
            "an HTTP/1.0 response cannot be chunked"
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
}
