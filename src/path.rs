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
    /// The canonical path, and a format suffix of its last segment ignored (`/login.json` as
    /// `/login`), for applications that route them alike (Rails, Phoenix, Django REST).
    #[serde(rename = "without_format")]
    WithoutFormat,
}

/// A request's path as routes compare with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchPath<'a> {
    /// The normalized path, in canonical form unless `[server] path_matching = "strict"`:
    /// what prefixes match.
    pub path: Cow<'a, str>,
    /// How much of it exact paths compare with: all of it, or all but a format suffix with
    /// `path_matching = "without_format"`.
    exact_len: usize,
}

impl<'a> MatchPath<'a> {
    /// A path that routes compare with as it is.
    pub fn exactly(path: &'a str) -> MatchPath<'a> {
        MatchPath {
            path: Cow::Borrowed(path),
            exact_len: path.len(),
        }
    }

    /// What exact paths compare with.
    pub fn exact(&self) -> &str {
        &self.path[..self.exact_len]
    }
}

/// What routes are compared with: the normalized path, in canonical form unless `[server]
/// path_matching = "strict"`.
pub fn for_matching(normalized: &str, matching: PathMatching) -> MatchPath<'_> {
    let path = match matching {
        PathMatching::Canonical | PathMatching::WithoutFormat => canonical(normalized),
        PathMatching::Strict => Cow::Borrowed(normalized),
    };
    let exact_len = match matching {
        PathMatching::WithoutFormat => format_suffix_at(&path).unwrap_or(path.len()),
        _ => path.len(),
    };
    MatchPath { path, exact_len }
}

/// The path without a format suffix on its last segment: a dot and 1 to 8 ASCII letters or
/// digits after at least one other character (`/login.json` → `/login`, `/feed.rss2` →
/// `/feed`; `/.well-known` and `/a/` stay).
pub fn without_format(path: &str) -> &str {
    &path[..format_suffix_at(path).unwrap_or(path.len())]
}

/// Where the format suffix of the last segment starts (its dot), if it has one.
fn format_suffix_at(path: &str) -> Option<usize> {
    let last = path.rfind('/').map_or(0, |slash| slash + 1);
    let dot = last + path[last..].rfind('.')?;
    let suffix = &path[dot + 1..];
    let is_format = dot > last
        && (1..=8).contains(&suffix.len())
        && suffix.bytes().all(|byte| byte.is_ascii_alphanumeric());
    is_format.then_some(dot)
}

/// The form of a normalized path that routes are matched on with `[server] path_matching =
/// "canonical"`: what common application servers route alike is alike here too. ASCII case
/// is folded (Express and ASP.NET route `/LOGIN` as `/login`), `;` parameters are removed
/// from each segment (Tomcat and Spring read `/login;x` and `/login/..;/login` as `/login`),
/// `\` (or `%5C`) is a `/` and trailing dots of a segment are dropped (IIS and Windows read
/// `/login.` as `/login`); the result is normalized again. The upstream still receives the
/// normalized path.
///
/// Cost: one pass over the path when there is nothing to change (the usual case).
pub fn canonical(normalized: &str) -> Cow<'_, str> {
    let plain = normalized
        .bytes()
        .all(|byte| !byte.is_ascii_uppercase() && byte != b';' && byte != b'\\');
    let trailing_dot = normalized.ends_with('.') || normalized.contains("./");
    if plain && !trailing_dot {
        return Cow::Borrowed(normalized);
    }
    let slashes = normalized.replace('\\', "/").replace("%5C", "/");
    let mut folded = String::with_capacity(slashes.len());
    for (index, segment) in slashes.split('/').enumerate() {
        if index > 0 {
            folded.push('/');
        }
        let without_parameters = segment.split(';').next().unwrap_or_default();
        let without_dots = match without_parameters.trim_end_matches('.') {
            "" => without_parameters,
            trimmed => trimmed,
        };
        folded.push_str(&without_dots.to_ascii_lowercase());
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
    use super::{canonical, for_matching, normalize, Cow, PathMatching};
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
            "/login.",
            "/LOGIN..",
            "/x./../login",
        ] {
            let normalized = normalize(variant);
            let canonical = canonical(&normalized);
            assert!(
                canonical == "/login" || canonical == "/login/",
                "{variant} -> {normalized} -> {canonical}"
            );
        }
        assert!(matches!(canonical("/api/v1/users"), Cow::Borrowed(_)));
        assert!(matches!(canonical("/static/app.js"), Cow::Borrowed(_)));
        assert_eq!(canonical("/a;b/c;d"), "/a/c");
        assert_eq!(canonical("/v1.2/x"), "/v1.2/x", "inner dots stay");
    }

    #[test]
    fn without_format_ignores_a_format_suffix_of_the_last_segment_only() {
        let exact = |path: &str| {
            for_matching(path, PathMatching::WithoutFormat)
                .exact()
                .to_owned()
        };
        assert_eq!(exact("/login.json"), "/login");
        assert_eq!(exact("/Login.XML"), "/login");
        assert_eq!(exact("/feed.rss2"), "/feed");
        assert_eq!(exact("/login"), "/login");
        assert_eq!(exact("/v1.2/users"), "/v1.2/users");
        assert_eq!(
            exact("/.well-known"),
            "/.well-known",
            "a dot first is no suffix"
        );
        assert_eq!(exact("/a.b-c"), "/a.b-c", "a suffix is letters and digits");
        assert_eq!(exact("/report.longerthan8"), "/report.longerthan8");
        // Prefixes still see the whole path.
        let path = for_matching("/api/users.json", PathMatching::WithoutFormat);
        assert_eq!(path.path, "/api/users.json");
        assert_eq!(
            for_matching("/login.json", PathMatching::Canonical).exact(),
            "/login.json"
        );
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
