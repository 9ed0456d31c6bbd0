//! What HTTP/1.1 says about a message's fields, for every path that frames or forwards one:
//! connection tokens, hop-by-hop fields, upgrades, bodyless statuses, and how many fields a
//! head may carry. The own server path, the own upstream client and the gateway's rewriting
//! of hyper's messages all call these, so a rule changes in one place.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

/// Request head fields at most (hyper's default; beyond it hyper answers 431, and so does the
/// own path by handing the head to hyper).
pub(crate) const MAX_REQUEST_FIELDS: usize = 100;
/// Response head fields at most, read from an upstream.
pub(crate) const MAX_RESPONSE_FIELDS: usize = 128;
/// A response head larger than this is refused (502), by the own client and hyper's alike.
pub(crate) const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;

/// Whether a response head with `headers` is over `MAX_RESPONSE_HEAD_BYTES`, counted as its
/// fields take on the wire (`name: value` and CRLF each): for hyper's client, which gives no
/// raw size (the own client measures the head it read).
pub(crate) fn response_head_too_large(headers: &HeaderMap) -> bool {
    let size: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    size > MAX_RESPONSE_HEAD_BYTES
}

const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    // HTTP/2's upgrade settings (RFC 9113 §3.2.1 of the old h2c upgrade): connection-specific.
    HeaderName::from_static("http2-settings"),
];

/// The framing fields spelled with `_` for `-`.
const UNDERSCORED_FRAMING: [&str; 2] = ["transfer_encoding", "content_length"];

fn is_framing_in_disguise(name: &HeaderName) -> bool {
    let name = name.as_str();
    // Lengths first: most names are neither 14 nor 17 bytes long.
    matches!(name.len(), 14 | 17) && UNDERSCORED_FRAMING.contains(&name)
}

/// Whether a response with this status never has a body, whatever its fields say (1xx, 204,
/// 304; RFC 9112 §6.3). A response to HEAD has none either.
pub(crate) fn is_bodyless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// Whether the request asks to switch protocols, and may: `Upgrade` named in `Connection`,
/// for any protocol but `h2c`. An h2c upgrade is never forwarded (nginx and Envoy strip it
/// too): an upstream that accepted it would serve HTTP/2 streams inside the tunnel, past
/// every limit. Such a request goes on as plain HTTP/1.1, its upgrade fields removed.
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && header_tokens(headers, header::CONNECTION)
            .any(|token| token.eq_ignore_ascii_case("upgrade"))
        && !header_tokens(headers, header::UPGRADE)
            .any(|protocol| protocol.eq_ignore_ascii_case("h2c"))
}

/// What an upstream's 101 must say to complete the upgrade a request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeExpected {
    /// The protocols the request named in `Upgrade`.
    protocols: String,
    /// For WebSocket, the `Sec-WebSocket-Accept` that proves the upstream read the key.
    accept: Option<String>,
}

/// GUID appended to a WebSocket key (RFC 6455 §1.3).
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

impl UpgradeExpected {
    /// What to expect for an upgrade request's `headers`.
    pub(crate) fn of(headers: &HeaderMap) -> UpgradeExpected {
        let protocols = header_tokens(headers, header::UPGRADE)
            .collect::<Vec<_>>()
            .join(",");
        let websocket = header_tokens(headers, header::UPGRADE)
            .any(|protocol| protocol.eq_ignore_ascii_case("websocket"));
        let accept = websocket.then(|| {
            let key = headers
                .get(header::SEC_WEBSOCKET_KEY)
                .map(|key| key.as_bytes())
                .unwrap_or_default();
            websocket_accept(key)
        });
        UpgradeExpected { protocols, accept }
    }

    /// Whether a 101 with `response`'s fields completes the upgrade: it switches to one of the
    /// protocols asked for, and for WebSocket proves it read the key.
    pub(crate) fn accepted_by(&self, response: &HeaderMap) -> bool {
        let mut switched = header_tokens(response, header::UPGRADE);
        let protocol_asked = switched.next().is_some_and(|protocol| {
            self.protocols
                .split(',')
                .any(|asked| asked.eq_ignore_ascii_case(protocol))
        }) && switched.next().is_none();
        let accept_matches = match &self.accept {
            Some(expected) => response
                .get(header::SEC_WEBSOCKET_ACCEPT)
                .is_some_and(|accept| accept.as_bytes() == expected.as_bytes()),
            None => true,
        };
        protocol_asked && accept_matches
    }
}

/// `Sec-WebSocket-Accept` for a key: base64 of SHA-1 of the key and the GUID.
fn websocket_accept(key: &[u8]) -> String {
    use base64::Engine as _;
    let mut sha1 = sha1_smol::Sha1::new();
    sha1.update(key);
    sha1.update(WEBSOCKET_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha1.digest().bytes())
}

/// The comma-separated tokens of every `name` field (`Connection: keep-alive, Upgrade`).
pub(crate) fn header_tokens(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

/// Removes hop-by-hop headers, including those the `Connection` header names, before a
/// message is forwarded. With `keep_upgrade`, `Upgrade` and `Connection: upgrade` stay for the
/// next hop. A message that came with `Transfer-Encoding` also loses its `Content-Length`
/// (RFC 9112 §6.3): its body was framed by the coding and goes on framed anew, and a length
/// left beside it would let the next hop read a different message boundary.
///
/// `Transfer_Encoding` and `Content_Length` go too: some servers read `_` as `-`, and would
/// frame the message by a field the gateway never saw as framing.
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages carry none, and most that do carry only `Connection: keep-alive` (or
    // `close`), which names no field: one pass over the names instead of a lookup per name.
    let (mut connection, mut others) = (false, false);
    for name in headers.keys() {
        if *name == header::CONNECTION {
            connection = true;
        } else if *name == header::UPGRADE
            || HOP_BY_HOP.contains(name)
            || is_framing_in_disguise(name)
        {
            others = true;
        }
    }
    if keep_upgrade || others {
        remove_every_hop_by_hop(headers, keep_upgrade);
    } else if connection {
        let names_a_field = header_tokens(headers, header::CONNECTION).any(|token| {
            !token.eq_ignore_ascii_case("keep-alive") && !token.eq_ignore_ascii_case("close")
        });
        if names_a_field {
            remove_every_hop_by_hop(headers, keep_upgrade);
        } else {
            headers.remove(header::CONNECTION);
        }
    }
}

/// [`remove_hop_by_hop`] the long way, whatever the message carries.
fn remove_every_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    for disguised in UNDERSCORED_FRAMING {
        headers.remove(disguised);
    }
    let named: Vec<HeaderName> = header_tokens(headers, header::CONNECTION)
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .filter(|name| !(keep_upgrade && *name == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// Whether the connection a response came on may carry another request, as far as the
/// response tells: not after `Connection: close`, nor after a message whose framing is
/// suspect — an answer that has no body (a 204, a 304, one to HEAD) yet announces one with
/// `Transfer-Encoding` or a `Content-Length` other than 0. A buggy upstream may send the body
/// it announced, and those bytes would answer the next request on the connection: another
/// client's. Both upstream clients ask this.
pub(crate) fn may_reuse_after(method: &Method, status: StatusCode, headers: &HeaderMap) -> bool {
    if header_tokens(headers, header::CONNECTION).any(|token| token.eq_ignore_ascii_case("close")) {
        return false;
    }
    if *method != Method::HEAD && !is_bodyless(status) {
        return true;
    }
    let announces_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|length| length.as_bytes().trim_ascii() != b"0");
    !announces_body
}

/// Drops request fields whose names have an underscore (nginx's `underscores_in_headers off`):
/// CGI and WSGI servers read `X_User_Id` as `X-User-Id`, so a client could pass a field that
/// the gateway never saw as the one it checked. Framing fields in disguise are dropped by
/// [`remove_hop_by_hop`] whatever this says.
pub(crate) fn remove_underscored(headers: &mut HeaderMap) {
    if !headers.keys().any(|name| name.as_str().contains('_')) {
        return;
    }
    let underscored: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .cloned()
        .collect();
    for name in underscored {
        headers.remove(name);
    }
}

/// Joins the `cookie` fields of a request into one, with `; ` (RFC 9113 §8.2.3: HTTP/2 clients
/// may split the cookie into several fields, and an HTTP/1.1 server expects one line).
pub(crate) fn join_cookies(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::COOKIE).iter();
    if values.next().is_none() || values.next().is_none() {
        return;
    }
    let joined: Vec<u8> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn an_h2c_upgrade_is_never_an_upgrade_and_loses_its_fields() {
        let mut h2c = fields(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ]);
        assert!(!is_upgrade(&h2c));
        remove_hop_by_hop(&mut h2c, false);
        assert!(h2c.is_empty(), "{h2c:?}");
        // Not even hidden among other protocols, or with its settings not named in Connection.
        let mut mixed = fields(&[("connection", "upgrade"), ("upgrade", "websocket, H2C")]);
        assert!(!is_upgrade(&mixed));
        mixed.insert("http2-settings", HeaderValue::from_static("AAMA"));
        remove_hop_by_hop(&mut mixed, false);
        assert!(mixed.is_empty(), "{mixed:?}");
    }

    #[test]
    fn a_websocket_upgrade_completes_only_with_the_proof_of_its_key() {
        // The example of RFC 6455 §1.3.
        let request = fields(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let expected = UpgradeExpected::of(&request);
        let accepted = fields(&[
            ("upgrade", "WebSocket"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ]);
        assert!(expected.accepted_by(&accepted));
        let wrong_proof = fields(&[
            ("upgrade", "websocket"),
            ("sec-websocket-accept", "AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        ]);
        assert!(!expected.accepted_by(&wrong_proof));
        assert!(!expected.accepted_by(&fields(&[("upgrade", "websocket")])));
        let other_protocol = fields(&[
            ("upgrade", "h2c"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ]);
        assert!(!expected.accepted_by(&other_protocol));
        assert!(!expected.accepted_by(&HeaderMap::new()));
    }

    #[test]
    fn other_upgrades_complete_when_the_upstream_switches_to_a_protocol_asked_for() {
        let expected = UpgradeExpected::of(&fields(&[
            ("connection", "upgrade"),
            ("upgrade", "foo/2, bar"),
        ]));
        assert!(expected.accepted_by(&fields(&[("upgrade", "bar")])));
        assert!(!expected.accepted_by(&fields(&[("upgrade", "baz")])));
        assert!(!expected.accepted_by(&fields(&[("upgrade", "bar, foo/2")])));
    }

    #[test]
    fn framing_fields_spelled_with_underscores_are_dropped() {
        let mut headers = fields(&[
            ("transfer_encoding", "chunked"),
            ("content_length", "5"),
            ("x_user_id", "kept"),
        ]);
        remove_hop_by_hop(&mut headers, false);
        let names: Vec<&str> = headers.keys().map(|name| name.as_str()).collect();
        assert_eq!(names, ["x_user_id"]);
    }

    #[test]
    fn a_bodyless_answer_that_announces_a_body_ends_the_connection() {
        let reuse = |method: Method, status: u16, pairs: &[(&'static str, &'static str)]| {
            may_reuse_after(
                &method,
                StatusCode::from_u16(status).unwrap(),
                &fields(pairs),
            )
        };
        assert!(reuse(Method::GET, 200, &[("content-length", "5")]));
        assert!(reuse(Method::GET, 204, &[]));
        assert!(reuse(Method::GET, 304, &[("content-length", "0")]));
        assert!(reuse(Method::HEAD, 200, &[]));
        assert!(!reuse(Method::GET, 204, &[("content-length", "5")]));
        assert!(!reuse(
            Method::GET,
            304,
            &[("transfer-encoding", "chunked")]
        ));
        assert!(!reuse(Method::HEAD, 200, &[("content-length", "100")]));
        assert!(!reuse(
            Method::GET,
            200,
            &[("connection", "keep-alive, Close")]
        ));
    }

    #[test]
    fn cookie_fields_are_joined_into_one_line() {
        let mut headers = fields(&[("cookie", "a=1"), ("x", "y"), ("cookie", "b=2")]);
        join_cookies(&mut headers);
        let cookies: Vec<&HeaderValue> = headers.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
        let mut one = fields(&[("cookie", "a=1")]);
        join_cookies(&mut one);
        assert_eq!(one[header::COOKIE], "a=1");
    }

    #[test]
    fn every_field_with_an_underscore_goes_when_asked() {
        let mut headers = fields(&[("x_user_id", "1"), ("x-user-id", "2"), ("a_b", "3")]);
        remove_underscored(&mut headers);
        let names: Vec<&str> = headers.keys().map(|name| name.as_str()).collect();
        assert_eq!(names, ["x-user-id"]);
    }

    #[test]
    fn a_transfer_coded_message_loses_its_content_length() {
        let mut headers = HeaderMap::new();
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::CONTENT_LENGTH, "3".parse().unwrap());
        remove_hop_by_hop(&mut headers, false);
        assert!(headers.is_empty(), "{headers:?}");

        let mut length_only = HeaderMap::new();
        length_only.insert(header::CONTENT_LENGTH, "3".parse().unwrap());
        remove_hop_by_hop(&mut length_only, false);
        assert_eq!(length_only[header::CONTENT_LENGTH], "3");
    }

    #[test]
    fn bodyless_statuses_are_1xx_204_and_304() {
        for status in [100, 101, 103, 204, 304] {
            assert!(
                is_bodyless(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [200, 201, 205, 301, 404, 500] {
            assert!(
                !is_bodyless(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }

    #[test]
    fn hop_by_hop_headers_go_including_those_named_by_connection() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            "keep-alive, x-secret-hop".parse().unwrap(),
        );
        headers.insert("x-secret-hop", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert(header::TE, "trailers".parse().unwrap());
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        headers.insert("x-end-to-end", "kept".parse().unwrap());
        remove_hop_by_hop(&mut headers, false);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers["x-end-to-end"], "kept");
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(is_upgrade(&headers));
        remove_hop_by_hop(&mut headers, true);
        assert_eq!(headers[header::UPGRADE], "websocket");
        assert_eq!(headers[header::CONNECTION], "upgrade");
    }

    #[test]
    fn the_short_ways_out_remove_what_the_long_way_does() {
        let fields: [&[(&str, &str)]; 9] = [
            &[],
            &[("content-length", "5")],
            &[("connection", "keep-alive"), ("content-length", "5")],
            &[("connection", "Close")],
            &[("connection", "keep-alive, x-secret"), ("x-secret", "1")],
            &[("connection", "keep-alive"), ("keep-alive", "timeout=5")],
            &[
                ("connection", "keep-alive"),
                ("transfer-encoding", "chunked"),
                ("content-length", "5"),
            ],
            &[("connection", "upgrade"), ("upgrade", "websocket")],
            &[("connection", "keep-alive"), ("content_length", "9")],
        ];
        for case in fields {
            for keep_upgrade in [false, true] {
                let mut headers = HeaderMap::new();
                for (name, value) in case {
                    headers.append(
                        HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        HeaderValue::from_static(value),
                    );
                }
                let mut long_way = headers.clone();
                super::remove_every_hop_by_hop(&mut long_way, keep_upgrade);
                remove_hop_by_hop(&mut headers, keep_upgrade);
                assert_eq!(headers, long_way, "{case:?}, keep_upgrade {keep_upgrade}");
            }
        }
    }
}
