//! What a plain listener beside TLS answers itself, before any route: ACME http-01
//! validations, and with `redirect_plain` every other request, sent to the same host and target
//! over `https` at the TLS listener's port.

use http::uri::Authority;
use http::{HeaderValue, Request};

use crate::reject::Reject;
use crate::runtime::Runtime;
use crate::shared::Shared;

/// Where http-01 validations ask (RFC 8555 §8.3).
const ACME_CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";

/// The answer a plain request gets instead of its route, if any.
pub(crate) fn answer<B>(
    shared: &Shared,
    runtime: &Runtime,
    request: &Request<B>,
    host: Option<&HeaderValue>,
) -> Option<Reject> {
    if let Some(acme) = &shared.acme {
        if let Some(token) = request.uri().path().strip_prefix(ACME_CHALLENGE_PATH) {
            return Some(Reject::AcmeChallenge(acme.http_challenge(token)));
        }
    }
    let tls = runtime.policy.server.tls.as_ref()?;
    if !tls.redirect_plain {
        return None;
    }
    let target = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let https_port = shared.https_port.get().copied().unwrap_or(443);
    Some(redirect(host, target, https_port))
}

/// The redirect for a request to `host` (its Host field, port and all) for `target`.
fn redirect(host: Option<&HeaderValue>, target: &str, https_port: u16) -> Reject {
    let location = host
        .and_then(|host| host.to_str().ok())
        .and_then(|host| location(host, target, https_port));
    match location {
        Some(location) => Reject::ToHttps(location),
        None => Reject::BadRequest("a request redirected to https needs a Host".to_owned()),
    }
}

/// `https://` the host's name, the port unless it is 443, then the target.
fn location(host: &str, target: &str, https_port: u16) -> Option<HeaderValue> {
    // A Host names a host and port, never a user.
    if host.contains('@') {
        return None;
    }
    let authority: Authority = host.parse().ok()?;
    let name = authority.host();
    let location = if https_port == 443 {
        format!("https://{name}{target}")
    } else {
        format!("https://{name}:{https_port}{target}")
    };
    HeaderValue::from_str(&location).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_host_and_target_over_https() {
        let cases = [
            (
                "shop.example.com",
                "/a?b=c",
                443,
                "https://shop.example.com/a?b=c",
            ),
            ("shop.example.com:80", "/", 443, "https://shop.example.com/"),
            (
                "shop.example.com:8080",
                "/x",
                8443,
                "https://shop.example.com:8443/x",
            ),
            ("[::1]:80", "/", 443, "https://[::1]/"),
            ("127.0.0.1", "/", 8443, "https://127.0.0.1:8443/"),
        ];
        for (host, target, port, expected) in cases {
            assert_eq!(location(host, target, port).unwrap(), expected, "{host}");
        }
    }

    #[test]
    fn a_host_that_is_no_authority_is_a_bad_request() {
        for host in ["", "a b", "evil.com/path", "user@evil.com"] {
            let host = HeaderValue::from_str(host).unwrap();
            assert!(
                matches!(redirect(Some(&host), "/", 443), Reject::BadRequest(_)),
                "{host:?}"
            );
        }
        assert!(matches!(redirect(None, "/", 443), Reject::BadRequest(_)));
    }
}
