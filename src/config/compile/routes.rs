//! `[[routes]]`: what a request is matched on, which upstream it goes to, and which limits
//! at which cost apply to it.

use std::collections::HashSet;
use std::sync::Arc;

use http::Method;
use toml::Spanned;

use super::costs;
use super::limits::valid_name;
use super::{list_or_none, Errors};
use crate::config::costs::Field;
use crate::config::raw;
use crate::config::{Limit, PathMatch, PathMatching, Route, RouteLimit, Upstream};
use crate::path;

pub(super) fn compile_route(
    index: usize,
    raw: Spanned<raw::RawRoute>,
    upstreams: &[Arc<Upstream>],
    limits: &[Arc<Limit>],
    matching: PathMatching,
    errors: &mut Errors<'_>,
) -> Option<Route> {
    let span = raw.span();
    let raw = raw.into_inner();
    let name = raw.name.get_ref().clone();
    let key = format!("routes[{index}]");
    if !valid_name(&name) {
        errors.at(
            Some(raw.name.span()),
            format!("{key}.name"),
            format!("invalid route name {name:?}: use letters, digits, '_', '-' and '.'"),
        );
    }
    let key = format!("{key} ({name:?})");
    let path = route_path_rule(&raw, span, &key, errors);
    let methods = route_methods(&raw, &key, errors);
    let host = route_host(&raw, &key, errors);
    let upstream = route_upstream(&raw, upstreams, &key, errors);
    let route_limits = route_limits(&raw, limits, &key, errors);
    let reads_body = route_limits.iter().any(|entry| {
        entry.limit.reads_body()
            || matches!(&entry.read_cost, Some(read) if matches!(read.field, Field::Json(_)))
    });
    let reads_token = route_limits.iter().any(|entry| entry.limit.reads_token());
    let reads_origin = route_limits.iter().any(|entry| entry.limit.reads_origin());
    Some(Route {
        name: Arc::from(name.as_str()),
        host,
        methods,
        match_path: match_path(path.as_ref()?, matching),
        path: path?,
        upstream: upstream?,
        limits: route_limits,
        on_store_failure: raw.on_store_failure.unwrap_or_default(),
        reads_body,
        reads_token,
        reads_origin,
        scan_bans: false,
    })
}

/// `path` (exact) or `path_prefix` (a subtree): exactly one of them.
fn route_path_rule(
    raw: &raw::RawRoute,
    span: std::ops::Range<usize>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<PathMatch> {
    match (&raw.path, &raw.path_prefix) {
        (Some(path), None) => route_path(path, key, "path", errors).map(PathMatch::Exact),
        (None, Some(prefix)) => {
            route_path(prefix, key, "path_prefix", errors).map(PathMatch::Prefix)
        }
        (Some(path), Some(_)) => {
            errors.at(Some(path.span()), key, "both path and path_prefix are set: use path for one exact path or path_prefix for a subtree");
            None
        }
        (None, None) => {
            errors.at(
                Some(span.clone()),
                key,
                "no path: set path = \"/login\" (exact) or path_prefix = \"/api/\" (subtree)",
            );
            None
        }
    }
}

/// `methods`, upper-cased; CONNECT never.
fn route_methods(raw: &raw::RawRoute, key: &str, errors: &mut Errors<'_>) -> Option<Vec<Method>> {
    raw.methods.as_ref().map(|methods| {
        if methods.get_ref().is_empty() {
            errors.at(
                Some(methods.span()),
                format!("{key}.methods"),
                "empty: leave methods out to match any method",
            );
        }
        methods
            .get_ref()
            .iter()
            .filter_map(
                |method| match Method::from_bytes(method.to_ascii_uppercase().as_bytes()) {
                    Ok(method) if method != Method::CONNECT => Some(method),
                    Ok(_) => {
                        errors.at(
                            Some(methods.span()),
                            format!("{key}.methods"),
                            "CONNECT is never proxied",
                        );
                        None
                    }
                    Err(_) => {
                        errors.at(
                            Some(methods.span()),
                            format!("{key}.methods"),
                            format!("invalid method {method:?}: expected GET, POST, PUT, ..."),
                        );
                        None
                    }
                },
            )
            .collect::<Vec<_>>()
    })
}

/// `host`, lower-cased, without a port.
fn route_host(raw: &raw::RawRoute, key: &str, errors: &mut Errors<'_>) -> Option<String> {
    raw.host.as_ref().map(|host| {
        let text = host.get_ref().trim().to_ascii_lowercase();
        if text.is_empty() || text.parse::<http::uri::Authority>().is_err() || text.contains(':') && !text.starts_with('[') {
            errors.at(Some(host.span()), format!("{key}.host"), format!("invalid host {:?}: expected a host name such as \"shop.example.com\" (no port)", host.get_ref()));
        }
        text
    })
}

/// The upstream the route names, among those defined.
fn route_upstream(
    raw: &raw::RawRoute,
    upstreams: &[Arc<Upstream>],
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Arc<Upstream>> {
    let upstream = upstreams
        .iter()
        .find(|upstream| upstream.name == *raw.upstream.get_ref())
        .cloned();
    if upstream.is_none() {
        let known: Vec<&str> = upstreams
            .iter()
            .map(|upstream| upstream.name.as_str())
            .collect();
        errors.at(
            Some(raw.upstream.span()),
            format!("{key}.upstream"),
            format!(
                "unknown upstream {:?}; defined upstreams: {}",
                raw.upstream.get_ref(),
                list_or_none(&known)
            ),
        );
    }
    upstream
}

/// The route's limits, each with what the route charges it: its own `cost`, else the
/// route's. A cost applies to buckets only: a concurrency limit takes one slot a request.
fn route_limits(
    raw: &raw::RawRoute,
    limits: &[Arc<Limit>],
    key: &str,
    errors: &mut Errors<'_>,
) -> Vec<RouteLimit> {
    let route_cost = match &raw.cost {
        Some(cost) => positive_cost(cost, &format!("{key}.cost"), errors),
        None => 1.0,
    };
    let mut route_limits = Vec::with_capacity(raw.limits.len());
    let mut seen = HashSet::new();
    for entry in &raw.limits {
        let entry_span = entry.span();
        let entry = entry.get_ref();
        let Some(limit) = limits.iter().find(|limit| *limit.name == *entry.limit) else {
            let known: Vec<&str> = limits.iter().map(|limit| &*limit.name).collect();
            errors.at(
                Some(entry_span),
                format!("{key}.limits"),
                format!(
                    "unknown limit {:?}; defined limits: {}",
                    entry.limit,
                    list_or_none(&known)
                ),
            );
            continue;
        };
        if !seen.insert(&limit.name) {
            errors.at(
                Some(entry_span),
                format!("{key}.limits"),
                format!("limit {:?} is listed twice", entry.limit),
            );
            continue;
        }
        let charged = costs::entry_cost(
            entry,
            limit,
            route_cost,
            &entry_span,
            &format!("{key}.limits"),
            errors,
        );
        route_limits.push(RouteLimit {
            limit: limit.clone(),
            cost: charged.cost,
            read_cost: charged.read_cost,
            settle: charged.settle,
        });
    }
    route_limits
}

fn positive_cost(cost: &Spanned<f64>, key: &str, errors: &mut Errors<'_>) -> f64 {
    let value = *cost.get_ref();
    if !(value.is_finite() && value > 0.0) {
        errors.at(Some(cost.span()), key, format!("cost {value} is out of range: a cost must be greater than zero (use mode = \"shadow\" on the limit to observe without refusing)"));
        return 1.0;
    }
    value
}

/// What a route's path is matched as: in canonical form, unless matching is strict.
fn match_path(path: &PathMatch, matching: PathMatching) -> PathMatch {
    // A prefix is matched canonically (segment by segment), never without its format.
    let prefix_matching = match matching {
        PathMatching::WithoutFormat => PathMatching::Canonical,
        other => other,
    };
    let canonical = |text: &str, matching: PathMatching| {
        if matching == PathMatching::Strict {
            return text.to_owned();
        }
        let canonical = path::canonical(text);
        let canonical = match matching {
            PathMatching::WithoutFormat => path::without_format(&canonical),
            _ => &canonical,
        };
        match canonical.trim_end_matches('/') {
            "" => "/".to_owned(),
            trimmed => trimmed.to_owned(),
        }
    };
    match path {
        PathMatch::Exact(text) => PathMatch::Exact(canonical(text, matching)),
        PathMatch::Prefix(text) => PathMatch::Prefix(canonical(text, prefix_matching)),
    }
}

fn route_path(
    path: &Spanned<String>,
    key: &str,
    field: &str,
    errors: &mut Errors<'_>,
) -> Option<String> {
    let text = path.get_ref();
    if !text.starts_with('/') || text.contains(['?', '#']) {
        errors.at(
            Some(path.span()),
            format!("{key}.{field}"),
            format!(
                "invalid path {text:?}: expected an absolute path such as \"/login\" (no query)"
            ),
        );
        return None;
    }
    let normalized = path::normalize(text);
    let trimmed = normalized.trim_end_matches('/');
    Some(if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::Method;

    use super::super::testing::{error, policy};
    use crate::config::PathMatch;

    const LIMITS: &str = "[limits.a]\nkey = \"global\"\ncapacity = 5\nrate = \"1/s\"\n[limits.b]\nkey = { json_field = \"email\" }\ncapacity = 10\nrate = \"1/s\"\n";

    fn with_route(route: &str) -> String {
        format!("{LIMITS}[[routes]]\n{route}")
    }

    #[test]
    fn a_route_owns_its_limits_costs_and_upstream() {
        let policy = policy(&with_route(
            "name = \"login\"\npath = \"/login/\"\nmethods = [\"post\"]\nhost = \"Shop.Example.com\"\nupstream = \"app\"\ncost = 2\nlimits = [\"a\", { limit = \"b\", cost = 3 }]\n",
        ));
        let route = &policy.routes[0];
        assert_eq!(route.path, PathMatch::Exact("/login".to_owned()));
        assert_eq!(route.methods, Some(vec![Method::POST]));
        assert_eq!(route.host.as_deref(), Some("shop.example.com"));
        assert!(Arc::ptr_eq(&route.upstream, &policy.upstreams[0]));
        let costs: Vec<(&str, f64)> = route
            .limits
            .iter()
            .map(|entry| (&*entry.limit.name, entry.cost))
            .collect();
        assert_eq!(costs, [("a", 2.0), ("b", 3.0)]);
        assert!(
            Arc::ptr_eq(&route.limits[0].limit, &policy.limits[0]),
            "the route shares the policy's limit"
        );
        assert!(route.reads_body, "limit b reads a JSON field");
    }

    #[test]
    fn routes_are_matched_on_their_canonical_path_unless_matching_is_strict() {
        let route = "[[routes]]\nname = \"r\"\npath = \"/Admin;v=1/Panel/\"\nupstream = \"app\"\n";
        let canonical = policy(route);
        assert_eq!(
            canonical.routes[0].path,
            PathMatch::Exact("/Admin;v=1/Panel".to_owned())
        );
        assert_eq!(
            canonical.routes[0].match_path,
            PathMatch::Exact("/admin/panel".to_owned())
        );
        let strict = policy(&format!("[server]\npath_matching = \"strict\"\n{route}"));
        assert_eq!(strict.routes[0].match_path, strict.routes[0].path);
    }

    #[test]
    fn bad_routes_name_the_key_that_is_wrong() {
        let route = |extra: &str| {
            with_route(&format!(
                "name = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n{extra}"
            ))
        };
        assert_eq!(
            error(&route("limits = [\"nope\"]\n")),
            (
                "routes[0] (\"r\").limits".to_owned(),
                "unknown limit \"nope\"; defined limits: a, b".to_owned()
            )
        );
        assert_eq!(
            error(&route("limits = [\"a\", \"a\"]\n")).0,
            r#"routes[0] ("r").limits"#
        );
        assert_eq!(
            error(&route("limits = [{ limit = \"a\", cost = 6 }]\n")).0,
            r#"routes[0] ("r").limits"#,
            "a cost above the capacity could never pass"
        );
        assert_eq!(
            error(&route("methods = [\"CONNECT\"]\n")).0,
            r#"routes[0] ("r").methods"#
        );
        assert_eq!(error(&route("cost = -1\n")).0, r#"routes[0] ("r").cost"#);
        assert_eq!(
            error(&with_route(
                "name = \"r\"\npath_prefix = \"/\"\nupstream = \"nope\"\n"
            ))
            .0,
            r#"routes[0] ("r").upstream"#
        );
        assert_eq!(
            error(&with_route(
                "name = \"r\"\npath = \"/a\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
            ))
            .0,
            r#"routes[0] ("r")"#
        );
    }
}
