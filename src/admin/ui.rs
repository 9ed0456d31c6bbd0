//! `GET /ui` on the admin listener: one self-contained page (`ui.html`: inline CSS and
//! script, no other asset) that shows whom the gateway stops, from the same API `tollgate
//! top` reads. The page holds no data, so it is served without the token; it asks for the
//! token and sends it with each call. A Content-Security-Policy lets only its own script and
//! style run, and only toward this listener.

use std::sync::OnceLock;

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use http::StatusCode;

use crate::body::Body;
use crate::respond;

const PAGE: &str = include_str!("ui.html");

/// The page with its headers.
pub(super) fn page() -> http::Response<Body> {
    let mut response = respond::full(StatusCode::OK, "text/html; charset=utf-8", PAGE);
    let headers = response.headers_mut();
    let policy = HeaderValue::from_str(policy()).expect("a policy of ASCII");
    headers.insert(http::header::CONTENT_SECURITY_POLICY, policy);
    for (name, value) in [
        (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (http::header::REFERRER_POLICY, "no-referrer"),
        (http::header::CACHE_CONTROL, "no-store"),
        (HeaderName::from_static("x-frame-options"), "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The Content-Security-Policy: the page's one script and one style by their hashes, calls
/// to this origin only, nothing else.
fn policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash_of(between(PAGE, "<script>", "</script>")),
            hash_of(between(PAGE, "<style>", "</style>")),
        )
    })
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    let start = text.find(open).map_or(0, |at| at + open.len());
    let end = text[start..]
        .find(close)
        .map_or(text.len(), |at| start + at);
    &text[start..end]
}

fn hash_of(source: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, source.as_bytes());
    let encoded = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    format!("sha256-{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_the_pages_one_script_and_one_style() {
        assert_eq!(
            PAGE.matches("<script").count(),
            1,
            "one inline script, no src"
        );
        assert_eq!(PAGE.matches("<style").count(), 1);
        assert!(
            !PAGE.contains(" style=\""),
            "no style attributes: the policy refuses them"
        );
        assert!(!PAGE.contains("innerHTML"), "values go in as text");
        let policy = policy();
        assert!(
            policy.starts_with("default-src 'none'; script-src 'sha256-"),
            "{policy}"
        );
        assert!(!policy.contains("unsafe"), "{policy}");
        assert_eq!(between("a<s>b</s>c", "<s>", "</s>"), "b");
    }
}
