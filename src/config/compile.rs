//! Raw TOML → validated [`Policy`]. Every error names the file, the line and column, the key
//! path and what would be valid; all errors of a file are reported at once.

mod auth;
mod costs;
mod decision;
mod geoip;
mod limits;
mod routes;
mod server;
mod shaping;
mod store;
mod tiers;
mod upstreams;

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::raw::{self, RawConfig};
use super::{ConfigError, ConfigErrors, Limit, PathMatch, Policy, Upstream};

/// Collects errors with their positions while the policy is compiled.
pub(super) struct Errors<'a> {
    file: &'a str,
    text: &'a str,
    found: Vec<ConfigError>,
}

impl Errors<'_> {
    pub(super) fn at(
        &mut self,
        span: Option<Range<usize>>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (position, excerpt) = match span {
            Some(span) => {
                let (line, column) = line_and_column(self.text, span.start);
                let excerpt = self
                    .text
                    .lines()
                    .nth(line - 1)
                    .map(|l| l.trim_end().to_owned());
                (Some((line, column)), excerpt)
            }
            None => (None, None),
        };
        self.found.push(ConfigError {
            file: self.file.to_owned(),
            position,
            key: key.into(),
            message: message.into(),
            excerpt,
        });
    }
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |newline| before.len() - newline - 1)
        + 1;
    (line, column)
}

pub(super) fn compile(file: &str, text: &str, base: Option<&Path>) -> Result<Policy, ConfigErrors> {
    let mut errors = Errors {
        file,
        text,
        found: Vec::new(),
    };
    let Some(raw) = parse(text, &mut errors) else {
        return Err(ConfigErrors(errors.found));
    };
    let policy = compile_raw(raw, base, &mut errors);
    if errors.found.is_empty() {
        Ok(policy)
    } else {
        Err(ConfigErrors(errors.found))
    }
}

/// The most errors one file reports: past that, the rest is noise.
const MAX_PARSE_ERRORS: usize = 50;

/// The file as serde reads it, with every syntax error and unknown key reported, not only the
/// first: each one is recorded, the line it is on (for a table header, the whole table) is
/// blanked out (offsets stay put, so later errors keep their lines), and the text is read again.
/// Another kind of error (a value of the wrong type, a missing key) ends the reading: what
/// follows from it would be noise.
fn parse(text: &str, errors: &mut Errors<'_>) -> Option<RawConfig> {
    let mut masked = text.as_bytes().to_vec();
    let mut reported = 0;
    loop {
        let current = String::from_utf8_lossy(&masked).into_owned();
        // Syntax first: the TOML parser stops at the first syntax error.
        let (error, syntax) = match current.parse::<toml::Table>() {
            Err(error) => (error, true),
            // With errors reported, compiling goes on: its errors are reported too.
            Ok(_) => match toml::from_str::<RawConfig>(&current) {
                Ok(raw) => return Some(raw),
                Err(error) => (error, false),
            },
        };
        let key = error
            .span()
            .map(|span| key_path_at(text, span.start))
            .unwrap_or_default();
        errors.at(error.span(), key, error.message().trim_end());
        reported += 1;
        let unknown_key = error.message().starts_with("unknown field");
        match error.span() {
            Some(span) if (syntax || unknown_key) && reported < MAX_PARSE_ERRORS => {
                if !blank_out(&mut masked, span.start) {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// Blanks out the line at `offset` (a table header: the table, up to the next header) with
/// spaces behind a `#`, keeping every byte offset; false when there was nothing left to blank.
fn blank_out(text: &mut [u8], offset: usize) -> bool {
    let offset = offset.min(text.len());
    let start = text[..offset]
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |newline| newline + 1);
    let line_end = |from: usize| {
        text[from..]
            .iter()
            .position(|byte| *byte == b'\n')
            .map_or(text.len(), |at| from + at)
    };
    let mut end = line_end(start);
    let is_header =
        |line: &[u8]| line.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[');
    if is_header(&text[start..end]) {
        while end < text.len() {
            let next = line_end(end + 1);
            if is_header(&text[end + 1..next]) {
                break;
            }
            end = next;
        }
    }
    let line = &mut text[start..end];
    if line
        .iter()
        .all(|byte| byte.is_ascii_whitespace() || *byte == b'#')
    {
        return false;
    }
    for byte in line.iter_mut() {
        if *byte != b'\n' {
            *byte = b' ';
        }
    }
    if let Some(first) = line.first_mut() {
        *first = b'#';
    }
    true
}

/// The dotted key path of the `key = value` line at `offset` (`server.listen`,
/// `routes[1].limits`), read from the nearest table header above it; on a table header, the
/// header's own name.
fn key_path_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |newline| newline + 1);
    let line = text[line_start..].lines().next().unwrap_or_default().trim();
    if let Some(header) = line.strip_prefix('[') {
        let name = header.trim_start_matches('[');
        return name.split(']').next().unwrap_or_default().trim().to_owned();
    }
    let key = match line.split_once('=') {
        Some((key, _)) if !line.starts_with('[') => key.trim().trim_matches('"'),
        _ => "",
    };
    let mut table = String::new();
    let mut array_counts: BTreeMap<String, usize> = BTreeMap::new();
    for header in text[..line_start].lines().map(str::trim) {
        if let Some(name) = header
            .strip_prefix("[[")
            .and_then(|rest| rest.split("]]").next())
        {
            let name = name.trim().to_owned();
            let count = array_counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{count}]");
            *count += 1;
        } else if let Some(name) = header
            .strip_prefix('[')
            .and_then(|rest| rest.split(']').next())
        {
            table = name.trim().to_owned();
        }
    }
    match (table.is_empty(), key.is_empty()) {
        (_, true) => table,
        (true, false) => key.to_owned(),
        (false, false) => format!("{table}.{key}"),
    }
}

/// A path from the policy file: relative ones are relative to the file's folder.
pub(super) fn resolve(base: Option<&Path>, path: &str) -> PathBuf {
    match base {
        Some(base) if Path::new(path).is_relative() => base.join(path),
        _ => PathBuf::from(path),
    }
}

fn compile_raw(raw: RawConfig, base: Option<&Path>, errors: &mut Errors<'_>) -> Policy {
    let listen_span = raw.server.listen.as_ref().map(toml::Spanned::span);
    let listen_empty = raw
        .server
        .listen
        .as_ref()
        .is_some_and(|listen| listen.get_ref().is_empty());
    let server = server::compile_server(raw.server, base, errors);
    let admin_span = raw.admin.listen.as_ref().map(toml::Spanned::span);
    let admin = server::compile_admin(raw.admin, errors);
    if let Some(public) = server
        .listen
        .iter()
        .find(|public| server::same_listener(public, &admin.listen))
    {
        errors.at(
            admin_span,
            "admin.listen",
            format!("{} is also a public listener ({public}): /metrics and /limits must never be served to clients; give the admin listener its own port", admin.listen),
        );
    }
    let client_ip = server::compile_client_ip(raw.client_ip, errors);
    let store = store::compile_store(raw.store, base, errors);
    let overload = raw
        .overload
        .and_then(|overload| limits::compile_overload(overload, errors));
    let upstreams: Vec<Arc<Upstream>> = raw
        .upstreams
        .into_iter()
        .filter_map(|(name, upstream)| upstreams::compile_upstream(name, upstream, base, errors))
        .map(Arc::new)
        .collect();
    let jwt_configured = raw.auth.jwt.is_some();
    let jwt = raw
        .auth
        .jwt
        .and_then(|jwt| auth::compile_jwt(jwt, base, errors));
    let (geoip, geoip_warnings) = raw
        .geoip
        .map(|geoip| geoip::compile_geoip(geoip, base, errors))
        .unwrap_or_default();
    let limits: Vec<Arc<Limit>> = raw
        .limits
        .into_iter()
        .filter_map(|(name, limit)| {
            limits::compile_limit(name, limit, &client_ip, jwt_configured, errors)
        })
        .map(Arc::new)
        .collect();
    geoip::check_databases(&limits, geoip.as_deref(), errors);
    let mut routes = Vec::with_capacity(raw.routes.len());
    let mut route_names = HashSet::new();
    for (index, route) in raw.routes.into_iter().enumerate() {
        let name = route.get_ref().name.clone();
        if !route_names.insert(name.get_ref().clone()) {
            errors.at(
                Some(name.span()),
                format!("routes[{index}].name"),
                format!("duplicate route name {:?}: route names must be unique (they label the metrics)", name.get_ref()),
            );
        }
        routes.extend(routes::compile_route(
            index,
            route,
            &upstreams,
            &limits,
            server.path_matching,
            errors,
        ));
    }
    let decision_configured = raw.decision.is_some();
    let decision = raw
        .decision
        .and_then(|decision| decision::compile_decision(decision, &limits, errors));
    if listen_empty && !decision_configured {
        errors.at(
            listen_span,
            "server.listen",
            "at least one address is needed, such as \"0.0.0.0:8080\" or \"[::]:8080\" (or a [decision] listener, for a gateway that only answers other proxies)",
        );
    }
    if let Some(decision) = &decision {
        let taken = server.listen.iter().chain([&admin.listen]);
        if let Some(other) = taken
            .into_iter()
            .find(|other| server::same_listener(other, &decision.listen))
        {
            errors.at(
                None,
                "decision.listen",
                format!("{} is also the address of another listener ({other}): give the decision listener its own port", decision.listen),
            );
        }
    }
    let mut policy = Policy {
        server,
        admin,
        client_ip,
        store,
        upstreams,
        limits,
        routes,
        overload,
        jwt,
        decision,
        geoip,
        warnings: Vec::new(),
    };
    if policy.routes.is_empty() {
        errors.at(
            None,
            "routes",
            "no [[routes]]: every request would get 404; add at least one route",
        );
    }
    policy.warnings = warnings(&policy);
    policy.warnings.extend(geoip_warnings);
    policy
}

pub(super) fn duration_or(value: Option<raw::HumanDuration>, default: Duration) -> Duration {
    value.map_or(default, |duration| duration.0)
}

pub(super) fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Valid but suspicious policy.
fn warnings(policy: &Policy) -> Vec<String> {
    let mut warnings = Vec::new();
    let in_rules = |limit: &Arc<Limit>| {
        policy.decision.as_ref().is_some_and(|decision| {
            decision
                .descriptors
                .iter()
                .any(|rule| Arc::ptr_eq(&rule.limit, limit))
        })
    };
    for limit in &policy.limits {
        if !in_rules(limit)
            && !policy.routes.iter().any(|route| {
                route
                    .limits
                    .iter()
                    .any(|entry| Arc::ptr_eq(&entry.limit, limit))
            })
        {
            warnings.push(format!("limit {:?} is not used by any route", limit.name));
        }
        if limit.lease.is_some() && policy.store.redis.is_none() {
            warnings.push(format!("limit {:?} has a lease, which only the Redis store uses: on the memory store every request is decided as usual", limit.name));
        }
        let fingerprinted = policy.server.tls.is_some() || policy.decision.is_some();
        if !fingerprinted && limit.key.contains(&super::KeySource::TlsJa4) {
            warnings.push(format!("limit {:?} is keyed by tls_ja4, but no listener serves TLS (and no [decision] listener is asked with X-Tollgate-JA4): the key is always missing", limit.name));
        }
        if let Some(super::TierSource::Header(name)) = &limit.tier {
            warnings.push(format!("limit {:?} takes its tier from the {name} header: a client that can set it picks its own tier, so only a proxy in front must set it (and remove what clients send)", limit.name));
        }
    }
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
        let users: Vec<&super::Route> = policy
            .routes
            .iter()
            .filter(|route| {
                route
                    .limits
                    .iter()
                    .any(|entry| Arc::ptr_eq(&entry.limit, limit))
            })
            .collect();
        if !users.is_empty()
            && users
                .iter()
                .all(|route| dead.iter().any(|dead| std::ptr::eq(*dead, *route)))
        {
            warnings.push(format!(
                "limit {:?} never applies: only routes that can never match use it",
                limit.name
            ));
        }
    }
    let catch_all = policy.routes.iter().any(|route| {
        route.host.is_none()
            && route.methods.is_none()
            && route.path == PathMatch::Prefix("/".to_owned())
    });
    if policy.decision.is_some() {
        warnings.extend(decision::warnings(policy));
    }
    if !catch_all {
        warnings.push("no catch-all route (path_prefix = \"/\"): requests that match no route get 404 from the gateway".to_owned());
    }
    warnings
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
fn always_matches_first(earlier: &super::Route, later: &super::Route) -> bool {
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

/// Compiling policy text in unit tests of the sections.
#[cfg(test)]
pub(crate) mod testing;
