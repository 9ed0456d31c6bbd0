//! Request heads on the own path: parsed straight from the connection's buffer into a
//! request, or handed to hyper when they need more than the own path does.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Method, Request, Uri, Version};
use smallvec::SmallVec;

use crate::request_body::RequestBody;
use crate::wire::header_names::KnownNames;
use crate::wire::message::MAX_REQUEST_FIELDS;

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
    let Some(request) = request_of(head, method, target, ranges, names) else {
        return Parsed::HandOver;
    };
    Parsed::Request {
        request,
        keep_alive,
    }
}

/// The request a head taken out of the buffer holds: its target and fields sliced out of it
/// (no copy); `None` for a target or a field that is not valid.
#[inline(always)]
fn request_of(
    head: Bytes,
    method: Method,
    target: Range<usize>,
    ranges: SmallVec<[(Range<usize>, Range<usize>); 16]>,
    names: &mut KnownNames,
) -> Option<Request<RequestBody>> {
    let uri = Uri::from_maybe_shared(head.slice(target)).ok()?;
    // The gateway adds nothing to this map on the way upstream (see `upstream::Forwarding`).
    let mut headers = crate::wire::header_maps::take(ranges.len());
    for (name, value) in ranges {
        let (Some(name), Ok(value)) = (
            names.name(&head[name]),
            HeaderValue::from_maybe_shared(head.slice(value)),
        ) else {
            return None;
        };
        headers.append(name, value);
    }
    let mut request = Request::new(RequestBody::Empty);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Some(request)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
