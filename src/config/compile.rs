//! Raw TOML → validated [`Policy`]. Every error names the file, the line and column, the key
//! path and what would be valid; all errors of a file are reported at once.

mod auth;
mod carried;
mod costs;
mod decision;
mod edge;
mod geoip;
mod limits;
mod penalties;
mod refusal;
mod routes;
mod scan;
mod server;
mod shaping;
mod store;
mod tiers;
mod tls;
mod top;
mod traces;
mod upstreams;
mod warnings;

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::raw::{self, RawConfig};
use super::{ConfigError, ConfigErrors, Limit, Policy, Upstream};

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
    compile_with_environment(file, text, base, &|name| std::env::var(name).ok())
}

/// As [`compile`], reading `[tracing]`'s `OTEL_*` variables from `env`.
pub(super) fn compile_with_environment(
    file: &str,
    text: &str,
    base: Option<&Path>,
    env: traces::Environment<'_>,
) -> Result<Policy, ConfigErrors> {
    let mut errors = Errors {
        file,
        text,
        found: Vec::new(),
    };
    let Some(raw) = parse(text, &mut errors) else {
        return Err(ConfigErrors(errors.found));
    };
    let mistyped = errors.found.len();
    let policy = compile_raw(raw, base, env, &mut errors);
    drop_consequences(&mut errors.found, mistyped);
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
        let unknown_key = error.message().starts_with("unknown field");
        let message = match unknown_key {
            true => suggested(error.message().trim_end()),
            false => error.message().trim_end().to_owned(),
        };
        errors.at(error.span(), key, message);
        reported += 1;
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

/// serde's `unknown field `capacty`, expected one of `key`, …, `capacity`, …` with the one
/// field the typo is nearest to, as cargo and clap suggest one (`did you mean `capacity`?`);
/// the whole list where none is near.
fn suggested(message: &str) -> String {
    let quoted = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let Some((unknown, expected)) = message.split_once(", expected one of ") else {
        return message.to_owned();
    };
    let Some(field) = quoted(unknown).into_iter().next() else {
        return message.to_owned();
    };
    let nearest = quoted(expected)
        .into_iter()
        .map(|candidate| (strsim::damerau_levenshtein(&field, &candidate), candidate))
        .min();
    match nearest {
        Some((distance, candidate)) if distance <= (field.chars().count() / 3).max(1) => {
            format!("{unknown}: did you mean `{candidate}`?")
        }
        _ => message.to_owned(),
    }
}

/// Drops the errors that follow from an unknown key reported earlier (`mistyped` is how many
/// the reading reported): one mistake is one error. A key unknown in a table (`capacty` in
/// `[limits.per_account]`) leaves that table half read, so what is said of the table, or of
/// its name elsewhere (a route naming `per_account`), is the same mistake again.
fn drop_consequences(found: &mut Vec<ConfigError>, mistyped: usize) {
    let tables: Vec<(String, String)> = found[..mistyped]
        .iter()
        .filter(|error| error.message.starts_with("unknown field"))
        .filter_map(|error| {
            // On a table's header the whole table is unknown; on a `key = value` line, the
            // table the line is in is half read.
            let header = error
                .excerpt
                .as_deref()
                .is_some_and(|line| line.trim_start().starts_with('['));
            let table = match error.key.rsplit_once('.') {
                _ if header => error.key.as_str(),
                Some((table, _)) => table,
                None => "",
            };
            let name = table.rsplit('.').next().filter(|name| !name.is_empty())?;
            Some((table.to_owned(), format!("{name:?}")))
        })
        .collect();
    if tables.is_empty() {
        return;
    }
    let mut index = 0;
    found.retain(|error| {
        index += 1;
        index <= mistyped
            || !tables.iter().any(|(table, name)| {
                error.key == *table
                    || error.key.starts_with(&format!("{table}."))
                    || error.message.contains(name.as_str())
            })
    });
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

fn compile_raw(
    raw: RawConfig,
    base: Option<&Path>,
    env: traces::Environment<'_>,
    errors: &mut Errors<'_>,
) -> Policy {
    let tracing = traces::compile_tracing(raw.tracing, env, errors);
    let listen_span = raw.server.listen.as_ref().map(toml::Spanned::span);
    let listen_empty = raw
        .server
        .listen
        .as_ref()
        .is_some_and(|listen| listen.get_ref().is_empty());
    let (server, admin) = compile_listeners(raw.server, raw.admin, base, errors);
    let client_ip = server::compile_client_ip(raw.client_ip, errors);
    let store = store::compile_store(raw.store, base, errors);
    let overrides = store::compile_overrides(raw.overrides, &store, base, errors);
    let overload = raw
        .overload
        .and_then(|overload| penalties::compile_overload(overload, errors));
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
            limits::compile_limit(name, limit, &client_ip, (jwt_configured, base), errors)
        })
        .map(Arc::new)
        .collect();
    geoip::check_databases(&limits, geoip.as_deref(), errors);
    let path_matching = server.path_matching;
    let mut routes = compile_routes(raw.routes, &upstreams, &limits, path_matching, errors);
    let scan = raw
        .scan
        .and_then(|scan| scan::compile_scan(scan, &client_ip, jwt_configured, errors));
    if let Some(scan) = &scan {
        scan::mark_routes(scan, &mut routes);
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
        check_decision_listener(decision, &server, &admin, errors);
    }
    if routes.is_empty() {
        errors.at(
            None,
            "routes",
            "no [[routes]]: every request would get 404; add at least one route",
        );
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
        overrides,
        tracing,
        top: top::compile_top(raw.top, errors),
        scan: scan.map(Arc::new),
        warnings: Vec::new(),
    };
    policy.warnings = warnings::warnings(&policy);
    policy.warnings.extend(geoip_warnings);
    policy
}

/// `[server]` and `[admin]`; the admin listener never on a public listener's address.
fn compile_listeners(
    mut raw_server: raw::RawServer,
    raw_admin: raw::RawAdmin,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> (super::ServerSettings, super::AdminSettings) {
    let connections = edge::compile_connections(raw_server.connections.take(), errors);
    let proxy_protocol = edge::compile_proxy_protocol(raw_server.proxy_protocol.take(), errors);
    let http3 = raw_server.http3.take();
    let mut server = super::ServerSettings {
        connections,
        proxy_protocol,
        ..server::compile_server(raw_server, base, errors)
    };
    server.http3 = http3.and_then(|http3| edge::compile_http3(http3, &server, errors));
    let admin_span = raw_admin.listen.as_ref().map(toml::Spanned::span);
    let admin = server::compile_admin(raw_admin, errors);
    if let Some(public) = server
        .listen
        .iter()
        .chain(&server.plain_listen)
        .find(|public| server::same_listener(public, &admin.listen))
    {
        errors.at(
            admin_span,
            "admin.listen",
            format!("{} is also a public listener ({public}): /metrics and /limits must never be served to clients; give the admin listener its own port", admin.listen),
        );
    }
    (server, admin)
}

/// The decision listener never on another listener's address.
fn check_decision_listener(
    decision: &super::DecisionSettings,
    server: &super::ServerSettings,
    admin: &super::AdminSettings,
    errors: &mut Errors<'_>,
) {
    let taken = server
        .listen
        .iter()
        .chain(&server.plain_listen)
        .chain([&admin.listen]);
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

/// `[[routes]]`, in match order; route names are unique.
fn compile_routes(
    raw_routes: Vec<toml::Spanned<raw::RawRoute>>,
    upstreams: &[Arc<Upstream>],
    limits: &[Arc<Limit>],
    path_matching: super::PathMatching,
    errors: &mut Errors<'_>,
) -> Vec<super::Route> {
    let mut routes = Vec::with_capacity(raw_routes.len());
    let mut route_names = HashSet::new();
    for (index, route) in raw_routes.into_iter().enumerate() {
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
            upstreams,
            limits,
            path_matching,
            errors,
        ));
    }
    routes
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

/// Compiling policy text in unit tests of the sections.
#[cfg(test)]
pub(crate) mod testing;
