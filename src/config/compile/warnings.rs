//! Valid but suspicious policy: what `check` warns about and `run` logs once at start.

use std::sync::Arc;

use http::Method;

use super::decision;
use crate::config::{
    CarriedNumbers, KeySource, Limit, NumberSource, PathMatch, Policy, Route, TierSource,
};

/// Every warning of `policy`, in the order `check` prints them.
pub(super) fn warnings(policy: &Policy) -> Vec<String> {
    let mut warnings = Vec::new();
    limit_warnings(policy, &mut warnings);
    for upstream in &policy.upstreams {
        if !policy
            .routes
            .iter()
            .any(|route| Arc::ptr_eq(&route.upstream, upstream))
        {
            warnings.push(format!(
                "upstream {:?} is not used by any route",
                upstream.name
            ));
        }
    }
    for route in &policy.routes {
        route_warnings(route, &mut warnings);
    }
    unreachable_warnings(policy, &mut warnings);
    super::edge::warnings(policy, &mut warnings);
    if policy.decision.is_some() {
        warnings.extend(decision::warnings(policy));
    }
    let catch_all = policy.routes.iter().any(|route| {
        route.host.is_none()
            && route.methods.is_none()
            && route.path == PathMatch::Prefix("/".to_owned())
    });
    if let Some(redis) = &policy.store.redis {
        if redis
            .nodes
            .iter()
            .any(|url| super::store::url_has_password(url))
        {
            warnings.push("store.url carries a password: move it to the environment (password_env = \"TOLLGATE_REDIS_PASSWORD\", with username) so that the policy file holds no secret".to_owned());
        }
    }
    if policy.store.redis.is_none() && policy.overrides.file.is_none() {
        warnings.push("overrides set through the admin API end with the process: set [overrides] file to keep them across restarts".to_owned());
    }
    if !catch_all {
        warnings.push("no catch-all route (path_prefix = \"/\"): requests that match no route get 404 from the gateway".to_owned());
    }
    warnings
}

/// Whether a route, or a gRPC descriptor rule, charges `limit`.
fn used(policy: &Policy, limit: &Arc<Limit>) -> bool {
    let in_rules = policy.decision.as_ref().is_some_and(|decision| {
        decision
            .descriptors
            .iter()
            .any(|rule| Arc::ptr_eq(&rule.limit, limit))
    });
    in_rules || policy.routes.iter().any(|route| charges(route, limit))
}

fn charges(route: &Route, limit: &Arc<Limit>) -> bool {
    route
        .limits
        .iter()
        .any(|entry| Arc::ptr_eq(&entry.limit, limit))
}

/// Limits no route uses, and settings a limit has that nothing reads.
fn limit_warnings(policy: &Policy, warnings: &mut Vec<String>) {
    for limit in &policy.limits {
        if !used(policy, limit) {
            warnings.push(format!("limit {:?} is not used by any route", limit.name));
        }
        if limit.lease.is_some() && policy.store.redis.is_none() {
            warnings.push(format!("limit {:?} has a lease, which only the Redis store uses: on the memory store every request is decided as usual", limit.name));
        }
        let fingerprinted = policy.server.tls.is_some() || policy.decision.is_some();
        if !fingerprinted && limit.key.contains(&KeySource::TlsJa4) {
            warnings.push(format!("limit {:?} is keyed by tls_ja4, but no listener serves TLS (and no [decision] listener is asked with X-Tollgate-JA4): the key is always missing", limit.name));
        }
        if let Some(TierSource::Header(name)) = &limit.tier {
            warnings.push(format!("limit {:?} takes its tier from the {name} header: a client that can set it picks its own tier, so only a proxy in front must set it (and remove what clients send)", limit.name));
        }
        let carried_headers = limit.carried.iter().flat_map(CarriedNumbers::sources);
        for (number, source) in carried_headers {
            if let (NumberSource::Header(name), false) = (source, policy.server.listen.is_empty()) {
                warnings.push(format!("limit {:?} reads its {number} from the {name} header on a proxy listener: any client can write it; max is the most it gets", limit.name));
            }
        }
    }
}

/// A route without limits, one whose limits read a body its requests rarely have, and a
/// gRPC service sent to an HTTP/1.1 upstream.
fn route_warnings(route: &Route, warnings: &mut Vec<String>) {
    if route.limits.is_empty() {
        warnings.push(format!(
            "route {:?} has no limits: its requests are never refused",
            route.name
        ));
    }
    let get_only = route.methods.as_ref().is_some_and(|methods| {
        methods
            .iter()
            .all(|method| *method == Method::GET || *method == Method::HEAD)
    });
    if get_only && route.reads_body {
        warnings.push(format!("route {:?} only matches GET/HEAD but a limit reads the request body, which such requests rarely have", route.name));
    }
    let http1_upstream = route
        .upstream
        .targets
        .iter()
        .any(|target| target.url.scheme_str() == Some("http"));
    if let PathMatch::Prefix(prefix) = &route.path {
        if looks_like_grpc_service(prefix) && http1_upstream {
            warnings.push(format!("route {:?} looks like a gRPC service ({prefix}) but its upstream {:?} is http://, which speaks HTTP/1.1: gRPC needs h2c://host:port or an https:// upstream that speaks HTTP/2", route.name, route.upstream.name));
        }
    }
}

/// Routes an earlier route always matches first, and limits only such routes use.
fn unreachable_warnings(policy: &Policy, warnings: &mut Vec<String>) {
    let mut dead = Vec::new();
    for (index, route) in policy.routes.iter().enumerate() {
        if let Some(earlier) = policy.routes[..index]
            .iter()
            .find(|earlier| always_matches_first(earlier, route))
        {
            warnings.push(format!("route {:?} can never match: route {:?} above it matches every request it would (put the more specific route first)", route.name, earlier.name));
            dead.push(route);
        }
    }
    for limit in &policy.limits {
        let users: Vec<&Route> = policy
            .routes
            .iter()
            .filter(|route| charges(route, limit))
            .collect();
        let dead = |route: &&Route| dead.iter().any(|dead| std::ptr::eq(*dead, *route));
        if !users.is_empty() && users.iter().all(dead) {
            warnings.push(format!(
                "limit {:?} never applies: only routes that can never match use it",
                limit.name
            ));
        }
    }
}

/// Whether a path prefix names a gRPC service, `/package.Service/`: one segment, dotted, its
/// last part capitalized as service names are.
fn looks_like_grpc_service(prefix: &str) -> bool {
    let name = prefix.trim_start_matches('/').trim_end_matches('/');
    let service = name.rsplit('.').next().unwrap_or_default();
    name.contains('.')
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'.')
        && service.starts_with(|first: char| first.is_ascii_uppercase())
}

/// Whether `earlier` matches every request `later` would, so that `later` is never reached.
fn always_matches_first(earlier: &Route, later: &Route) -> bool {
    let hosts = earlier.host.is_none() || earlier.host == later.host;
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(earlier), Some(later)) => later.iter().all(|method| earlier.contains(method)),
    };
    let paths = match (&earlier.match_path, &later.match_path) {
        (PathMatch::Prefix(prefix), PathMatch::Prefix(path) | PathMatch::Exact(path)) => {
            prefix == "/"
                || path == prefix
                || path
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        }
        (PathMatch::Exact(earlier), PathMatch::Exact(later)) => earlier == later,
        (PathMatch::Exact(_), PathMatch::Prefix(_)) => false,
    };
    hosts && methods && paths
}
