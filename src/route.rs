//! Matching a request to its route: host, method and normalized path; first match wins.

use http::Method;

use crate::config::{PathMatch, Route};
use crate::path::MatchPath;

/// The first route that matches, if any: of the policy's routes or the runtime's.
///
/// `host` is the request's host, lower-case and without port; `path` is the request's match
/// path (`path::canonical` of the normalized path, unless matching is strict).
/// Cost: linear in the number of routes, each a few comparisons.
pub fn find<'r, R: AsRef<Route>>(
    routes: &'r [R],
    host: Option<&str>,
    method: &Method,
    path: &MatchPath<'_>,
) -> Option<&'r R> {
    routes
        .iter()
        .find(|route| matches(route.as_ref(), host, method, path))
}

/// [`find`], for routes whose state the caller updates (a replay's tallies).
pub fn find_mut<'r, R: AsRef<Route>>(
    routes: &'r mut [R],
    host: Option<&str>,
    method: &Method,
    path: &MatchPath<'_>,
) -> Option<&'r mut R> {
    routes
        .iter_mut()
        .find(|route| matches((**route).as_ref(), host, method, path))
}

fn matches(route: &Route, host: Option<&str>, method: &Method, path: &MatchPath<'_>) -> bool {
    if let Some(expected) = &route.host {
        if host != Some(expected.as_str()) {
            return false;
        }
    }
    // Methods are case-sensitive (RFC 9110 §9.1), but a route's `methods` must not be
    // escaped by `post` where it names POST: an application may treat them alike.
    if let Some(methods) = &route.methods {
        let named = |listed: &Method| listed.as_str().eq_ignore_ascii_case(method.as_str());
        if !methods.iter().any(named) {
            return false;
        }
    }
    match &route.match_path {
        rule @ PathMatch::Exact(_) => path_matches(rule, path.exact()),
        rule @ PathMatch::Prefix(_) => path_matches(rule, &path.path),
    }
}

/// A request's host as routes compare it: lower case, without its port.
pub fn host_name(host: &str) -> String {
    host.parse::<http::uri::Authority>()
        .map(|authority| authority.host().to_ascii_lowercase())
        .unwrap_or_else(|_| host.to_ascii_lowercase())
}

/// Exact paths tolerate one trailing slash; prefixes match whole segments only.
pub fn path_matches(rule: &PathMatch, path: &str) -> bool {
    match rule {
        PathMatch::Exact(exact) => {
            path == exact
                || (path.len() == exact.len() + 1
                    && path.starts_with(exact.as_str())
                    && path.ends_with('/'))
        }
        PathMatch::Prefix(prefix) if prefix == "/" => true,
        PathMatch::Prefix(prefix) => match path.strip_prefix(prefix.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;

    fn policy() -> Policy {
        Policy::parse(
            "test.toml",
            r#"
            [upstreams.app]
            url = "http://127.0.0.1:3000"

            [[routes]]
            name = "login"
            methods = ["POST"]
            path = "/login"
            upstream = "app"

            [[routes]]
            name = "shop-api"
            host = "Shop.Example.com"
            path_prefix = "/api/"
            upstream = "app"

            [[routes]]
            name = "search"
            path_prefix = "/api/search"
            upstream = "app"

            [[routes]]
            name = "api"
            path_prefix = "/api/"
            upstream = "app"

            [[routes]]
            name = "default"
            path_prefix = "/"
            upstream = "app"
            "#,
        )
        .unwrap()
    }

    fn route(policy: &Policy, host: Option<&str>, method: Method, path: &str) -> String {
        let path = MatchPath::exactly(path);
        let route = find(&policy.routes, host, &method, &path).expect("the catch-all matches");
        route.name.to_string()
    }

    #[test]
    fn first_match_wins_on_method_host_and_path() {
        let p = policy();
        assert_eq!(route(&p, None, Method::POST, "/login"), "login");
        assert_eq!(route(&p, None, Method::POST, "/login/"), "login");
        assert_eq!(route(&p, None, Method::GET, "/login"), "default");
        assert_eq!(route(&p, None, Method::POST, "/login/x"), "default");
        assert_eq!(route(&p, None, Method::POST, "/loginx"), "default");
        assert_eq!(
            route(&p, Some("shop.example.com"), Method::GET, "/api/search"),
            "shop-api"
        );
        assert_eq!(
            route(&p, Some("other.example.com"), Method::GET, "/api/search"),
            "search"
        );
        assert_eq!(route(&p, None, Method::GET, "/api/search/books"), "search");
        assert_eq!(route(&p, None, Method::GET, "/api/searching"), "api");
        assert_eq!(route(&p, None, Method::GET, "/api"), "api");
        assert_eq!(route(&p, None, Method::GET, "/apiary"), "default");
    }

    #[test]
    fn no_route_without_a_catch_all() {
        let routes = &policy().routes[..1];
        assert!(find(routes, None, &Method::GET, &MatchPath::exactly("/")).is_none());
    }

    #[test]
    fn exact_root() {
        let rule = PathMatch::Exact("/".to_owned());
        assert!(path_matches(&rule, "/"));
        assert!(!path_matches(&rule, "/a"));
    }
}
