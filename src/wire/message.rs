//! What HTTP/1.1 says about a message's fields, for every path that frames or forwards one:
//! connection tokens, hop-by-hop fields, upgrades, bodyless statuses, and how many fields a
//! head may carry. The own server path, the own upstream client and the gateway's rewriting
//! of hyper's messages all call these, so a rule changes in one place.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

/// Request head fields at most (hyper's default; beyond it hyper answers 431, and so does the
/// own path by handing the head to hyper).
pub(crate) const MAX_REQUEST_FIELDS: usize = 100;
/// Response head fields at most, read from an upstream.
pub(crate) const MAX_RESPONSE_FIELDS: usize = 128;

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Whether a response with this status never has a body, whatever its fields say (1xx, 204,
/// 304; RFC 9112 §6.3). A response to HEAD has none either.
pub(crate) fn is_bodyless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// Whether the request asks to switch protocols (WebSocket): `Upgrade` named in `Connection`.
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && header_tokens(headers, header::CONNECTION)
            .any(|token| token.eq_ignore_ascii_case("upgrade"))
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
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages carry none: one pass over the names instead of a lookup per name.
    let any = headers
        .keys()
        .any(|name| *name == header::UPGRADE || HOP_BY_HOP.contains(name));
    if !any && !keep_upgrade {
        return;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
