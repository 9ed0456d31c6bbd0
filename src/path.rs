//! Path normalization: the one form of a path that routes are matched on and that is forwarded.
//!
//! Every variant that an ordinary upstream would route to `/login` must normalize to `/login`
//! (or `/login/`), or it could escape that route's limits: percent-encoded unreserved characters
//! are decoded (`/%6Cogin`), other percent-encodings are upper-cased, repeated slashes merged
//! (`//login`) and dot-segments resolved (`/./login`, `/a/../login`, `/%2e%2e/login`).

use std::borrow::Cow;

use serde::Deserialize;

/// What routes are matched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathMatching {
    /// The canonical path (`path::canonical`): case folded, `;` parameters removed, `\` as
    /// `/`, so that every variant an application routes alike meets the same route.
    #[default]
    Canonical,
    /// The normalized path as it is, for applications that route case-sensitively.
    Strict,
}

/// What routes are compared with: the normalized path, in canonical form unless `[server]
/// path_matching = "strict"`.
pub fn for_matching(normalized: &str, matching: PathMatching) -> Cow<'_, str> {
    match matching {
        PathMatching::Canonical => canonical(normalized),
        PathMatching::Strict => Cow::Borrowed(normalized),
    }
}

/// The form of a normalized path that routes are matched on with `[server] path_matching =
/// "canonical"`: what common application servers route alike is alike here too. ASCII case
/// is folded (Express and ASP.NET route `/LOGIN` as `/login`), `;` parameters are removed
/// from each segment (Tomcat and Spring read `/login;x` and `/login/..;/login` as `/login`),
/// and `\` (or `%5C`) is a `/` (IIS); the result is normalized again. The upstream still
/// receives the normalized path.
///
/// Cost: one pass over the path when there is nothing to change (the usual case).
pub fn canonical(normalized: &str) -> Cow<'_, str> {
    let plain = normalized
        .bytes()
        .all(|byte| !byte.is_ascii_uppercase() && byte != b';' && byte != b'\\');
    if plain {
        return Cow::Borrowed(normalized);
    }
    let slashes = normalized.replace('\\', "/").replace("%5C", "/");
    let mut folded = String::with_capacity(slashes.len());
    for (index, segment) in slashes.split('/').enumerate() {
        if index > 0 {
            folded.push('/');
        }
        let without_parameters = segment.split(';').next().unwrap_or_default();
        folded.push_str(&without_parameters.to_ascii_lowercase());
    }
    Cow::Owned(normalize(&folded).into_owned())
}

/// Returns the normalized form of `path` (the path component only, without the query).
///
/// Cost: one pass over a path that is already normal (the usual case), borrowed as it is;
/// otherwise one pass to decode, one over the segments, and one allocation for the result.
pub fn normalize(path: &str) -> Cow<'_, str> {
    if is_normal(path) {
        return Cow::Borrowed(path);
    }
    Cow::Owned(normalize_in_full(path))
}

fn normalize_in_full(path: &str) -> String {
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded.split('/') {
        trailing_slash = false;
        match segment {
            "" | "." => trailing_slash = true,
            ".." => {
                segments.pop();
                trailing_slash = true;
            }
            _ => segments.push(segment),
        }
    }
    let mut normalized = String::with_capacity(decoded.len() + 1);
    for segment in &segments {
        normalized.push('/');
        normalized.push_str(segment);
    }
    if trailing_slash || segments.is_empty() {
        normalized.push('/');
    }
    normalized
}

/// Whether `path` is already in normal form: the common case, checked in one pass.
fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.contains('%') {
        return false;
    }
    // No empty, "." or ".." segment; an empty last segment is a trailing slash: allowed.
    let mut segments = rest.split('/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            "" if last => {}
            "" | "." | ".." => return false,
            _ => {}
        }
    }
    true
}

/// Decodes `%XX` where XX encodes an unreserved character (RFC 3986 §2.3: ALPHA, DIGIT,
/// `-`, `.`, `_`, `~`); upper-cases the hex digits of every other valid encoding and leaves
/// invalid `%` sequences as they are.
fn decode_unreserved(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                let byte = high << 4 | low;
                if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                    out.push(byte as char);
                } else {
                    out.push('%');
                    out.push(bytes[i + 1].to_ascii_uppercase() as char);
                    out.push(bytes[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // `i` is always on a char boundary: escapes are ASCII and chars are copied whole.
        let ch_len = utf8_len(bytes[i]);
        out.push_str(&path[i..i + ch_len]);
        i += ch_len;
    }
    Cow::Owned(out)
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{canonical, normalize, Cow};
    use proptest::prelude::*;

    #[test]
    fn what_application_servers_route_alike_is_one_canonical_path() {
        for variant in [
            "/LOGIN",
            "/Login",
            "/login;x",
            "/login;jsessionid=abc",
            "/login/..;/login",
            "/login\\",
            "/x\\..\\login",
            "/login%5C",
            "/login%5c",
        ] {
            let normalized = normalize(variant);
            let canonical = canonical(&normalized);
            assert!(
                canonical == "/login" || canonical == "/login/",
                "{variant} -> {normalized} -> {canonical}"
            );
        }
        assert!(matches!(canonical("/api/v1/users"), Cow::Borrowed(_)));
        assert_eq!(canonical("/a;b/c;d"), "/a/c");
    }

    #[test]
    fn variants_of_login_all_normalize_to_login() {
        for variant in [
            "/login",
            "//login",
            "///login",
            "/./login",
            "/a/../login",
            "/a/b/../../login",
            "/../login",
            "/%6Cogin",
            "/%6cogin",
            "/%6C%6F%67%69%6E",
            "/%2e/login",
            "/%2E%2E/login",
            "/x/%2e%2e/login",
        ] {
            assert_eq!(normalize(variant), "/login", "{variant}");
        }
        for variant in ["/login/", "/login//", "/login/.", "/login/./", "//login/"] {
            assert_eq!(normalize(variant), "/login/", "{variant}");
        }
    }

    #[test]
    fn reserved_encodings_stay_encoded_in_upper_case() {
        assert_eq!(normalize("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize("/a%3Fb"), "/a%3Fb");
        assert_eq!(normalize("/caf%c3%a9"), "/caf%C3%A9");
    }

    #[test]
    fn invalid_percent_sequences_are_left_alone() {
        assert_eq!(normalize("/a%zz"), "/a%zz");
        assert_eq!(normalize("/a%4"), "/a%4");
        assert_eq!(normalize("/a%"), "/a%");
    }

    #[test]
    fn root_and_empty() {
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize(""), "/");
        assert_eq!(normalize("/.."), "/");
        assert_eq!(normalize("/a/.."), "/");
    }

    #[test]
    fn non_ascii_passes_through() {
        assert_eq!(normalize("/ünïcode//x"), "/ünïcode/x");
    }

    proptest! {
        /// The fast path agrees with the full algorithm.
        #[test]
        fn paths_taken_as_normal_are_normal(path in "(/|[a-z]|\\.|%2[eE]){0,24}") {
            if super::is_normal(&path) {
                prop_assert_eq!(super::normalize_in_full(&path), path);
            }
        }

        #[test]
        fn normalization_is_idempotent(path in "(/|[a-z]|\\.|%2[eE]|%6[cC]|%2[fF]){0,24}") {
            let once = normalize(&path);
            prop_assert_eq!(normalize(&once), once.clone());
            prop_assert!(once.starts_with('/'));
            prop_assert!(!once.contains("//"));
            prop_assert!(!once.split('/').any(|s| s == "." || s == ".."));
        }
    }
}
