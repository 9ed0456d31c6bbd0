//! Checks of a request's head before it is routed (pure): one scan of its fields, the
//! framing and size checks, and the host it names.

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};

use crate::reject::Reject;
use crate::upstream::X_FORWARDED_FOR;

/// What one pass over a request's fields finds: their size, and which of the fields the
/// request path looks up by name the request carries. Most requests carry none of them, and
/// looking up a missing name still costs a hash and a probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FieldScan {
    /// Names and values, with 4 bytes per field for `: ` and the line end.
    bytes: usize,
    forwarded_for: bool,
    /// `Forwarded` or `X-Real-IP`: what a client may send to pose as another address.
    pub(crate) other_forwarding: bool,
    pub(crate) request_id: bool,
    pub(crate) transfer_encoding: bool,
    content_length: bool,
    pub(crate) upgrade: bool,
    /// `content-type` names gRPC: the gateway's own answers are given as gRPC status.
    pub(crate) grpc: bool,
    /// `traceparent` or `tracestate`: a W3C trace context to continue (with `[tracing]`).
    pub(crate) trace_context: bool,
}

impl FieldScan {
    pub(crate) fn of(headers: &HeaderMap) -> FieldScan {
        let mut scan = FieldScan::default();
        for (name, value) in headers {
            let name = name.as_str();
            scan.bytes += name.len() + value.len() + 4;
            // Names are lower case; their lengths tell these apart from most others cheaply.
            match name.len() {
                7 => scan.upgrade |= name == "upgrade",
                9 => scan.other_forwarding |= name == "forwarded" || name == "x-real-ip",
                10 => scan.trace_context |= name == "tracestate",
                11 => scan.trace_context |= name == "traceparent",
                12 => {
                    scan.request_id |= name == "x-request-id";
                    scan.grpc |= name == "content-type" && crate::grpc::is_grpc(value.as_bytes());
                }
                14 => scan.content_length |= name == "content-length",
                15 => scan.forwarded_for |= name == "x-forwarded-for",
                17 => scan.transfer_encoding |= name == "transfer-encoding",
                _ => {}
            }
        }
        scan
    }

    /// The `X-Forwarded-For` values of `headers` (the scanned ones, or what is left of them).
    /// Whether the request carries `X-Forwarded-For`.
    pub(crate) fn forwarded_for_present(&self) -> bool {
        self.forwarded_for
    }

    pub(crate) fn forwarded_for<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> impl Iterator<Item = &'h HeaderValue> {
        self.forwarded_for
            .then(|| headers.get_all(X_FORWARDED_FOR))
            .into_iter()
            .flatten()
    }
}

/// Request-level checks before routing; returns the request's host (Host or :authority).
pub(crate) fn check_request<B>(
    request: &Request<B>,
    scan: &FieldScan,
    max_header_bytes: usize,
) -> Result<Option<HeaderValue>, Reject> {
    if request.method() == Method::CONNECT {
        return Err(Reject::MethodNotAllowed);
    }
    if request.uri().path() == crate::upstream::ASTERISK && request.method() != Method::OPTIONS {
        return Err(Reject::BadRequest(
            "the target * goes with OPTIONS only".to_owned(),
        ));
    }
    if request.uri().scheme().is_none() && request.uri().authority().is_some() {
        // RFC 9112 §3.2.3: a bare `host:port` target is for CONNECT alone.
        return Err(Reject::BadRequest(
            "an authority-form target goes with CONNECT only".to_owned(),
        ));
    }
    let headers = request.headers();
    let uri = request.uri();
    let header_bytes = scan.bytes
        + uri.path_and_query().map_or(0, |pq| pq.as_str().len())
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    if header_bytes > max_header_bytes {
        return Err(Reject::HeaderFieldsTooLarge);
    }
    // Raw bytes beyond ASCII are not a URI (RFC 3986): what an upstream makes of them is
    // anyone's guess, so they never reach it.
    if uri
        .path_and_query()
        .is_some_and(|target| !target.as_str().is_ascii())
    {
        return Err(Reject::BadRequest(
            "the request target has bytes that are not ASCII".to_owned(),
        ));
    }
    if scan.transfer_encoding && scan.content_length {
        return Err(Reject::BadRequest(
            "both Content-Length and Transfer-Encoding are present".to_owned(),
        ));
    }
    if scan.content_length {
        let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
        if let Some(first) = lengths.next() {
            if lengths.any(|other| other != first) {
                return Err(Reject::BadRequest(
                    "conflicting Content-Length values".to_owned(),
                ));
            }
        }
    }
    request_host(request.uri(), headers, request.version())
        .map_err(|detail| Reject::BadRequest(detail.to_owned()))
}

fn request_host(
    uri: &Uri,
    headers: &HeaderMap,
    version: Version,
) -> Result<Option<HeaderValue>, &'static str> {
    if let Some(authority) = uri.authority() {
        // The same rule as a Host field: no userinfo, a port that is a port.
        if !is_valid_host(authority.as_str().as_bytes()) {
            return Err("invalid authority");
        }
        return HeaderValue::from_str(authority.as_str())
            .map(Some)
            .map_err(|_| "invalid authority");
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (None, _) if version == Version::HTTP_11 => return Err("missing Host header"),
        (None, _) => return Ok(None),
        (Some(_), Some(_)) => return Err("several Host headers"),
        (Some(host), None) => host,
    };
    if is_valid_host(host.as_bytes()) {
        Ok(Some(host.clone()))
    } else {
        Err("invalid Host header")
    }
}

/// Whether a `Host` value is `uri-host [":" port]` (RFC 9110 §7.2): a bracketed IPv6 address,
/// or an IPv4 address or registered name, without userinfo.
fn is_valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.iter().rposition(|byte| *byte == b':') {
        Some(colon) if !value[colon..].contains(&b']') => {
            (&value[..colon], Some(&value[colon + 1..]))
        }
        _ => (value, None),
    };
    // Digits whose number fits 16 bits (leading zeros allowed, as `u16`'s parser allows them).
    let port_valid = port.is_none_or(|port| {
        !port.is_empty()
            && port
                .iter()
                .try_fold(0u32, |number, byte| {
                    let number = number * 10 + u32::from(byte.wrapping_sub(b'0'));
                    (byte.is_ascii_digit() && number <= u32::from(u16::MAX)).then_some(number)
                })
                .is_some()
    });
    let host_valid = match host {
        [b'[', address @ .., b']'] => std::str::from_utf8(address)
            .is_ok_and(|address| address.parse::<std::net::Ipv6Addr>().is_ok()),
        [] => false,
        name => name.iter().all(|byte| REG_NAME_BYTES[usize::from(*byte)]),
    };
    port_valid && host_valid
}

/// The bytes of a registered name or IPv4 address (RFC 3986 `unreserved` and `sub-delims`),
/// as a table: looked up for every byte of every request's `Host`.
const REG_NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = (byte as u8).is_ascii_alphanumeric();
        byte += 1;
    }
    let others = b"-._~!$&'()*+,;=";
    let mut index = 0;
    while index < others.len() {
        table[others[index] as usize] = true;
        index += 1;
    }
    table
};

pub(crate) fn host_without_port(host: &HeaderValue) -> String {
    crate::route::host_name(host.to_str().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_id::X_REQUEST_ID;
    use proptest::prelude::*;

    /// The check `is_valid_host` replaced: http's authority parser, at the cost of a copy.
    fn valid_as_authority(text: &str) -> bool {
        !text.is_empty()
            && text.parse::<http::uri::Authority>().is_ok_and(|authority| {
                authority.as_str() == authority.host() || authority.port().is_some()
            })
    }

    proptest! {
        /// The scan finds a name exactly when a lookup would, whatever else the request
        /// carries, and counts every field, repeated ones too.
        #[test]
        fn the_field_scan_agrees_with_lookups(
            fields in proptest::collection::vec(
                (
                    prop::sample::select(vec![
                        "upgrade", "x-request-id", "content-length", "x-forwarded-for",
                        "transfer-encoding", "host", "x-user-id", "x-forwarded-fo",
                        "connection", "x-request-ids", "accept-encoding", "traceparent",
                        "tracestate", "traceparents",
                    ]),
                    "[a-z0-9]{0,12}",
                ),
                0..12,
            )
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &fields {
                headers.append(*name, HeaderValue::from_str(value).unwrap());
            }
            let scan = FieldScan::of(&headers);
            prop_assert_eq!(scan.upgrade, headers.contains_key(header::UPGRADE));
            prop_assert_eq!(scan.request_id, headers.contains_key(X_REQUEST_ID));
            prop_assert_eq!(
                scan.trace_context,
                headers.contains_key("traceparent") || headers.contains_key("tracestate")
            );
            prop_assert_eq!(scan.content_length, headers.contains_key(header::CONTENT_LENGTH));
            prop_assert_eq!(scan.forwarded_for, headers.contains_key(X_FORWARDED_FOR));
            prop_assert_eq!(
                scan.transfer_encoding,
                headers.contains_key(header::TRANSFER_ENCODING)
            );
            let bytes: usize = fields
                .iter()
                .map(|(name, value)| name.len() + value.len() + 4)
                .sum();
            prop_assert_eq!(scan.bytes, bytes);
            prop_assert_eq!(
                scan.forwarded_for(&headers).count(),
                headers.get_all(X_FORWARDED_FOR).iter().count()
            );
        }
    }

    fn checked(request: &str) -> Result<Option<HeaderValue>, Reject> {
        let (head, _) = request.split_once("\r\n").unwrap();
        let mut parts = head.split(' ');
        let (method, target) = (parts.next().unwrap(), parts.next().unwrap());
        let request = Request::builder()
            .method(method)
            .uri(target)
            .header("host", "app")
            .body(())
            .unwrap();
        check_request(&request, &FieldScan::of(request.headers()), 16384)
    }

    #[test]
    fn an_absolute_form_target_names_its_host_as_a_host_field_would() {
        assert_eq!(
            checked("GET http://shop.example.com:8080/a HTTP/1.1\r\n").unwrap(),
            Some(HeaderValue::from_static("shop.example.com:8080"))
        );
        for target in [
            "http://user:pw@shop.example.com/",
            "http://user@shop.example.com/",
            "http://shop.example.com:99999/",
        ] {
            assert!(
                matches!(
                    checked(&format!("GET {target} HTTP/1.1\r\n")),
                    Err(Reject::BadRequest(_))
                ),
                "{target}"
            );
        }
    }

    #[test]
    fn hosts_are_names_or_addresses_with_an_optional_port() {
        let valid = [
            "example.com",
            "Example.COM:8080",
            "127.0.0.1:1",
            "[::1]",
            "[2001:db8::1]:443",
            "a_b~c-d.e",
            "x:65535",
            "x:0000080",
        ];
        let invalid = [
            "",
            ":80",
            "a:",
            "a:65536",
            "a:4294967376",
            "a:8a",
            "a:+80",
            "a:b:c",
            "user@host",
            "user@host:80",
            "a b",
            "a/b",
            "a%20b",
            "[::1",
            "[zz::1]",
            "::1",
            "é.com",
        ];
        for host in valid {
            assert!(is_valid_host(host.as_bytes()), "{host}");
        }
        for host in invalid {
            assert!(!is_valid_host(host.as_bytes()), "{host}");
        }
    }

    proptest! {
        /// Outside userinfo, IPv6 literals and empty names with a port (where it is stricter),
        /// it agrees with http's authority parser.
        #[test]
        fn agrees_with_the_authority_parser(
            name in "[a-zA-Z0-9.~_!$&'()*,;= /?#%-]{0,12}",
            port in proptest::option::of("[0-9a]{0,6}"),
        ) {
            prop_assume!(!name.is_empty());
            let host = match port {
                Some(port) => format!("{name}:{port}"),
                None => name,
            };
            prop_assert_eq!(is_valid_host(host.as_bytes()), valid_as_authority(&host), "{}", host);
        }
    }
}
