//! Raw TOML → validated [`Policy`]. Every error names the file, the line and column, the key
//! path and what would be valid; all errors of a file are reported at once.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Uri};
use ipnet::IpNet;
use toml::Spanned;

use super::raw::{self, RawConfig, RawKey};
use super::{Adaptive, Overload};
use super::{
    AdminSettings, Backend, ClientIpSettings, ConfigError, ConfigErrors, KeySource, Limit, Missing,
    Mode, Normalize, PathMatch, Policy, RedisSettings, Route, RouteLimit, ServerSettings,
    StoreSettings, TlsFiles, Upstream, UpstreamTarget,
};
use crate::client_ip::Trust;
use crate::limit::AdaptiveParams;
use crate::path;

const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
const DEFAULT_MAX_KEYS: i64 = 1_000_000;
/// hyper cannot read request heads into a buffer smaller than this.
const MIN_HEADER_BYTES: i64 = 8192;

/// Collects errors with their positions while the policy is compiled.
struct Errors<'a> {
    file: &'a str,
    text: &'a str,
    found: Vec<ConfigError>,
}

impl Errors<'_> {
    fn at(
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
    let raw: RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(error) => {
            let key = error
                .span()
                .map(|span| key_path_at(text, span.start))
                .unwrap_or_default();
            errors.at(error.span(), key, error.message().trim_end());
            return Err(ConfigErrors(errors.found));
        }
    };
    let policy = compile_raw(raw, base, &mut errors);
    if errors.found.is_empty() {
        Ok(policy)
    } else {
        Err(ConfigErrors(errors.found))
    }
}

/// The dotted key path of the `key = value` line at `offset` (`server.listen`,
/// `routes[1].limits`), read from the nearest table header above it.
fn key_path_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |newline| newline + 1);
    let line = text[line_start..].lines().next().unwrap_or_default().trim();
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
fn resolve(base: Option<&Path>, path: &str) -> PathBuf {
    match base {
        Some(base) if Path::new(path).is_relative() => base.join(path),
        _ => PathBuf::from(path),
    }
}

fn compile_raw(raw: RawConfig, base: Option<&Path>, errors: &mut Errors<'_>) -> Policy {
    let server = compile_server(raw.server, base, errors);
    let admin = compile_admin(raw.admin, errors);
    let client_ip = compile_client_ip(raw.client_ip, errors);
    let store = compile_store(raw.store, base, errors);
    let overload = raw
        .overload
        .and_then(|overload| compile_overload(overload, errors));
    let upstreams: Vec<Arc<Upstream>> = raw
        .upstreams
        .into_iter()
        .filter_map(|(name, upstream)| compile_upstream(name, upstream, base, errors))
        .map(Arc::new)
        .collect();
    let limits: Vec<Arc<Limit>> = raw
        .limits
        .into_iter()
        .filter_map(|(name, limit)| compile_limit(name, limit, &client_ip, errors))
        .map(Arc::new)
        .collect();
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
        routes.extend(compile_route(index, route, &upstreams, &limits, errors));
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
    policy
}

fn duration_or(value: Option<raw::HumanDuration>, default: Duration) -> Duration {
    value.map_or(default, |duration| duration.0)
}

fn compile_server(
    raw: raw::RawServer,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> ServerSettings {
    let listen = match raw.listen {
        Some(listen) => {
            let span = listen.span();
            if listen.get_ref().is_empty() {
                errors.at(
                    Some(span.clone()),
                    "server.listen",
                    "at least one address is needed, such as \"0.0.0.0:8080\" or \"[::]:8080\"",
                );
            }
            listen
                .into_inner()
                .iter()
                .filter_map(|address| {
                    socket_address(address, "server.listen", Some(span.clone()), errors)
                })
                .collect()
        }
        None => vec![DEFAULT_LISTEN
            .parse()
            .expect("the default listen address is valid")],
    };
    let tls = raw.tls.map(|tls| {
        let tls = tls.into_inner();
        TlsFiles {
            cert: resolve(base, &tls.cert),
            key: resolve(base, &tls.key),
        }
    });
    let max_header_bytes = match raw.max_header_bytes {
        Some(bytes) if (MIN_HEADER_BYTES..=1 << 20).contains(bytes.get_ref()) => {
            *bytes.get_ref() as usize
        }
        Some(bytes) => {
            errors.at(
                Some(bytes.span()),
                "server.max_header_bytes",
                format!(
                    "{} is out of range: expected {MIN_HEADER_BYTES} to 1048576",
                    bytes.get_ref()
                ),
            );
            16384
        }
        None => 16384,
    };
    let max_buffered_body = match raw.max_buffered_body {
        Some(size) if size.get_ref().0 == 0 => {
            errors.at(
                Some(size.span()),
                "server.max_buffered_body",
                "must be greater than zero, such as \"64KiB\"",
            );
            0
        }
        Some(size) => usize::try_from(size.get_ref().0).unwrap_or(usize::MAX),
        None => 64 * 1024,
    };
    let header_read_timeout = duration_or(raw.header_read_timeout, Duration::from_secs(10));
    let idle_timeout = duration_or(raw.idle_timeout, Duration::from_secs(60));
    for (key, value) in [
        ("server.header_read_timeout", header_read_timeout),
        ("server.idle_timeout", idle_timeout),
    ] {
        if value.is_zero() {
            errors.at(None, key, "must be longer than zero");
        }
    }
    ServerSettings {
        listen,
        tls,
        header_read_timeout,
        idle_timeout,
        max_header_bytes,
        max_buffered_body,
        grace_period: duration_or(raw.grace_period, Duration::from_secs(30)),
        ratelimit_headers: raw.ratelimit_headers.unwrap_or_default(),
    }
}

fn socket_address(
    text: &str,
    key: &str,
    span: Option<Range<usize>>,
    errors: &mut Errors<'_>,
) -> Option<SocketAddr> {
    match text.parse() {
        Ok(address) => Some(address),
        Err(_) => {
            errors.at(span, key, format!("invalid address {text:?}: expected IP:port such as \"0.0.0.0:8080\", \"127.0.0.1:9090\" or \"[::]:8080\""));
            None
        }
    }
}

fn compile_admin(raw: raw::RawAdmin, errors: &mut Errors<'_>) -> AdminSettings {
    let listen = match raw.listen {
        Some(listen) => socket_address(
            listen.get_ref(),
            "admin.listen",
            Some(listen.span()),
            errors,
        ),
        None => None,
    };
    AdminSettings {
        listen: listen.unwrap_or_else(|| {
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("the default admin address is valid")
        }),
    }
}

fn prefix_length(
    value: Option<&Spanned<i64>>,
    max: i64,
    default: u8,
    key: &str,
    errors: &mut Errors<'_>,
) -> u8 {
    match value {
        None => default,
        Some(value) if (0..=max).contains(value.get_ref()) => *value.get_ref() as u8,
        Some(value) => {
            errors.at(
                Some(value.span()),
                key,
                format!(
                    "prefix length {} is out of range: expected 0 to {max}",
                    value.get_ref()
                ),
            );
            default
        }
    }
}

fn compile_client_ip(raw: raw::RawClientIp, errors: &mut Errors<'_>) -> ClientIpSettings {
    let ipv4_prefix = prefix_length(
        raw.ipv4_prefix.as_ref(),
        32,
        32,
        "client_ip.ipv4_prefix",
        errors,
    );
    let ipv6_prefix = prefix_length(
        raw.ipv6_prefix.as_ref(),
        128,
        64,
        "client_ip.ipv6_prefix",
        errors,
    );
    let trust = match (raw.trusted_hops, raw.trusted_proxies) {
        (Some(hops), Some(_)) => {
            errors.at(Some(hops.span()), "client_ip", "trusted_hops and trusted_proxies are both set: choose one (hops counts proxies from the right, proxies names their networks)");
            Trust::Hops(0)
        }
        (Some(hops), None) => match usize::try_from(*hops.get_ref()) {
            Ok(count) if count <= 32 => Trust::Hops(count),
            _ => {
                errors.at(
                    Some(hops.span()),
                    "client_ip.trusted_hops",
                    format!(
                        "{} is out of range: expected 0 (the TCP peer is the client) to 32",
                        hops.get_ref()
                    ),
                );
                Trust::Hops(0)
            }
        },
        (None, Some(proxies)) => {
            let span = proxies.span();
            Trust::Proxies(networks(
                proxies.get_ref(),
                "client_ip.trusted_proxies",
                span,
                errors,
            ))
        }
        (None, None) => Trust::Hops(0),
    };
    ClientIpSettings {
        trust,
        ipv4_prefix,
        ipv6_prefix,
    }
}

/// Parses networks (`"10.0.0.0/8"`) and single addresses (`"10.0.0.1"`, taken as /32 or /128).
fn networks(
    texts: &[String],
    key: &str,
    span: Range<usize>,
    errors: &mut Errors<'_>,
) -> Vec<IpNet> {
    texts
        .iter()
        .filter_map(|text| {
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(network) => Some(network.trunc()),
                Err(_) => {
                    errors.at(Some(span.clone()), key, format!("invalid network {text:?}: expected CIDR such as \"10.0.0.0/8\" or \"fd00::/8\", or an address"));
                    None
                }
            }
        })
        .collect()
}

fn compile_store(
    raw: raw::RawStore,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> StoreSettings {
    let backend = raw
        .backend
        .as_ref()
        .map_or(Backend::Memory, |backend| *backend.get_ref());
    let max_keys = match raw.max_keys {
        None => DEFAULT_MAX_KEYS as usize,
        Some(keys) if *keys.get_ref() >= 1 => *keys.get_ref() as usize,
        Some(keys) => {
            errors.at(
                Some(keys.span()),
                "store.max_keys",
                format!("{} is out of range: expected at least 1", keys.get_ref()),
            );
            1
        }
    };
    if let Some(key) = &raw.hash_key {
        if key.get_ref().len() < 16 {
            errors.at(
                Some(key.span()),
                "store.hash_key",
                "too short: use at least 16 characters of secret (or set TOLLGATE_HASH_KEY)",
            );
        }
    }
    let hash_key = raw.hash_key.map(Spanned::into_inner).or_else(|| {
        std::env::var("TOLLGATE_HASH_KEY")
            .ok()
            .filter(|key| !key.is_empty())
    });
    let redis = match backend {
        Backend::Memory => None,
        Backend::Redis => {
            let span = raw.backend.as_ref().map(Spanned::span);
            if hash_key.is_none() {
                errors.at(
                    span.clone(),
                    "store.hash_key",
                    "the redis backend needs a secret shared by every replica to hash keys taken from requests: set hash_key or the TOLLGATE_HASH_KEY environment variable",
                );
            }
            let timeout = duration_or(raw.timeout, Duration::from_millis(50));
            if timeout.is_zero() {
                errors.at(span.clone(), "store.timeout", "must be longer than zero");
            }
            match &raw.url {
                None => {
                    errors.at(
                        span,
                        "store.url",
                        "backend = \"redis\" needs url = \"redis://host:6379/0\" (or \"redis+cluster://host:port,host:port\")",
                    );
                    None
                }
                Some(url) => match redis_nodes(url.get_ref(), raw.cluster.unwrap_or(false)) {
                    Ok((nodes, cluster)) => Some(RedisSettings {
                        nodes,
                        cluster,
                        timeout,
                        prefix: raw.prefix.clone().unwrap_or_else(|| "tollgate:".to_owned()),
                        ca_file: raw.ca_file.as_deref().map(|path| resolve(base, path)),
                    }),
                    Err(message) => {
                        errors.at(Some(url.span()), "store.url", message);
                        None
                    }
                },
            }
        }
    };
    StoreSettings {
        backend,
        max_keys,
        hash_key,
        redis,
    }
}

/// Splits a store URL into one URL per node: `redis://[user:pass@]host:port[/db]`,
/// `rediss://...` (TLS), `redis+cluster://host:port,host:port` (or `cluster = true`).
fn redis_nodes(url: &str, cluster: bool) -> Result<(Vec<String>, bool), String> {
    let expected = "expected \"redis://[user:password@]host:port[/db]\", \"rediss://...\" or \"redis+cluster://host:port,host:port\"";
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("invalid url {url:?}: {expected}"))?;
    let (scheme, cluster) = match scheme {
        "redis" | "rediss" => (scheme, cluster),
        "redis+cluster" => ("redis", true),
        "rediss+cluster" => ("rediss", true),
        _ => {
            return Err(format!(
                "invalid url {url:?}: unknown scheme {scheme:?}; {expected}"
            ))
        }
    };
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{userinfo}{host}{path}"))
        .collect();
    if nodes.is_empty() {
        return Err(format!("invalid url {url:?}: no host; {expected}"));
    }
    if !cluster && nodes.len() > 1 {
        return Err(format!("invalid url {url:?}: several hosts need a cluster (\"redis+cluster://...\" or cluster = true)"));
    }
    for node in &nodes {
        redis::IntoConnectionInfo::into_connection_info(node.as_str())
            .map_err(|error| format!("invalid url {url:?}: {error}; {expected}"))?;
    }
    Ok((nodes, cluster))
}

fn compile_upstream(
    name: String,
    raw: Spanned<raw::RawUpstream>,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<Upstream> {
    let key = format!("upstreams.{name}");
    let span = raw.span();
    let raw = raw.into_inner();
    let (urls, urls_span) = match (raw.url, raw.urls) {
        (Some(_), Some(urls)) => {
            errors.at(
                Some(urls.span()),
                &key,
                "both url and urls are set: use url for one address or urls for several",
            );
            return None;
        }
        (Some(url), None) => {
            let span = url.span();
            (vec![url.into_inner()], span)
        }
        (None, Some(urls)) => {
            let span = urls.span();
            (urls.into_inner(), span)
        }
        (None, None) => {
            errors.at(
                Some(span),
                &key,
                "no url: set url = \"http://host:port\" or urls = [...]",
            );
            return None;
        }
    };
    if urls.is_empty() {
        errors.at(
            Some(urls_span.clone()),
            &key,
            "urls is empty: list at least one \"http://host:port\"",
        );
    }
    let mut targets = Vec::with_capacity(urls.len());
    for text in &urls {
        match upstream_target(text) {
            Ok(target) => targets.push(target),
            Err(message) => errors.at(Some(urls_span.clone()), format!("{key}.url"), message),
        }
    }
    let connect_timeout = duration_or(raw.connect_timeout, Duration::from_secs(2));
    let timeout = duration_or(raw.timeout, Duration::from_secs(30));
    if connect_timeout.is_zero() || timeout.is_zero() {
        errors.at(
            Some(span),
            &key,
            "connect_timeout and timeout must be longer than zero",
        );
    }
    Some(Upstream {
        name,
        targets,
        connect_timeout,
        timeout,
        ca_file: raw.ca_file.as_deref().map(|path| resolve(base, path)),
    })
}

fn upstream_target(text: &str) -> Result<UpstreamTarget, String> {
    let url: Uri = text
        .parse()
        .map_err(|_| format!("invalid url {text:?}: expected \"http://host:port\""))?;
    match url.scheme_str() {
        Some("http") | Some("https") => {}
        _ => {
            return Err(format!(
                "invalid url {text:?}: expected \"http://host:port\""
            ))
        }
    }
    if url.authority().is_none() {
        return Err(format!(
            "invalid url {text:?}: no host; expected \"http://host:port\""
        ));
    }
    if url.query().is_some() {
        return Err(format!(
            "invalid url {text:?}: an upstream url cannot carry a query"
        ));
    }
    let base_path = url.path().trim_end_matches('/').to_owned();
    Ok(UpstreamTarget { url, base_path })
}

fn compile_limit(
    name: String,
    raw: Spanned<raw::RawLimit>,
    client_ip: &ClientIpSettings,
    errors: &mut Errors<'_>,
) -> Option<Limit> {
    let key = format!("limits.{name}");
    let span = raw.span();
    let raw = raw.into_inner();
    if !valid_name(&name) {
        errors.at(
            Some(span.clone()),
            &key,
            format!("invalid limit name {name:?}: use letters, digits, '_', '-' and '.'"),
        );
    }
    let capacity = *raw.capacity.get_ref();
    let adaptive = raw
        .adaptive
        .map(|adaptive| compile_adaptive(adaptive, &key, capacity, errors));
    let charge_on_status = raw
        .charge_on_status
        .map(|charges| compile_charges(charges, &key, errors))
        .unwrap_or_default();
    if !(capacity.is_finite() && capacity > 0.0) {
        errors.at(Some(raw.capacity.span()), format!("{key}.capacity"), format!("{capacity} is out of range: a capacity (burst, in tokens) must be greater than zero"));
    }
    let sources = match raw.key.get_ref() {
        RawKey::One(source) => vec![source.clone()],
        RawKey::Composite(sources) => sources.clone(),
    };
    if sources.len() > 1 && sources.contains(&KeySource::Global) {
        errors.at(
            Some(raw.key.span()),
            format!("{key}.key"),
            "\"global\" cannot be part of a composite key: it is one bucket for everyone",
        );
    }
    let key_sources: Vec<KeySource> = sources
        .into_iter()
        .filter(|source| *source != KeySource::Global)
        .collect();
    let exempt = raw
        .exempt
        .as_ref()
        .map(|exempt| {
            networks(
                exempt.get_ref(),
                &format!("{key}.exempt"),
                exempt.span(),
                errors,
            )
        })
        .unwrap_or_default();
    let ipv4_prefix = prefix_length(
        raw.ipv4_prefix.as_ref(),
        32,
        client_ip.ipv4_prefix,
        &format!("{key}.ipv4_prefix"),
        errors,
    );
    let ipv6_prefix = prefix_length(
        raw.ipv6_prefix.as_ref(),
        128,
        client_ip.ipv6_prefix,
        &format!("{key}.ipv6_prefix"),
        errors,
    );
    let rate = raw.rate.get_ref().0;
    let normalize = raw.normalize.unwrap_or_default();
    let fingerprint = fingerprint(&[
        &format!("{key_sources:?}"),
        &format!("{normalize:?}"),
        &capacity.to_bits().to_string(),
        &rate.per_second().to_bits().to_string(),
        &ipv4_prefix.to_string(),
        &ipv6_prefix.to_string(),
    ]);
    Some(Limit {
        name: Arc::from(name.as_str()),
        key: key_sources,
        normalize,
        missing: raw.missing.unwrap_or_default(),
        capacity,
        rate,
        mode: raw.mode.unwrap_or_default(),
        exempt,
        ipv4_prefix,
        ipv6_prefix,
        fingerprint,
        adaptive,
        charge_on_status,
    })
}

fn status_code(value: i64) -> Option<u16> {
    u16::try_from(value)
        .ok()
        .filter(|status| (100..=599).contains(status))
}

fn compile_adaptive(
    raw: Spanned<raw::RawAdaptive>,
    key: &str,
    capacity: f64,
    errors: &mut Errors<'_>,
) -> Adaptive {
    let span = Some(raw.span());
    let raw = raw.into_inner();
    let key = format!("{key}.adaptive");
    let mut on_status = Vec::new();
    for status in &raw.on_status {
        match status_code(*status) {
            Some(status) => on_status.push(status),
            None => errors.at(
                span.clone(),
                format!("{key}.on_status"),
                format!("{status} is not an HTTP status: expected 100 to 599"),
            ),
        }
    }
    if raw.on_status.is_empty() {
        errors.at(
            span.clone(),
            format!("{key}.on_status"),
            "empty: list the upstream statuses that count as errors, such as [401, 403]",
        );
    }
    let threshold = match u32::try_from(raw.threshold) {
        Ok(threshold) if (1..=1000).contains(&threshold) => threshold,
        _ => {
            errors.at(
                span.clone(),
                format!("{key}.threshold"),
                format!(
                    "{} is out of range: expected 1 to 1000 errors",
                    raw.threshold
                ),
            );
            1
        }
    };
    check_factor(raw.factor, &format!("{key}.factor"), span.clone(), errors);
    let min_capacity = raw.min_capacity.unwrap_or(1.0);
    if !(min_capacity.is_finite() && min_capacity > 0.0 && min_capacity <= capacity) {
        errors.at(span.clone(), format!("{key}.min_capacity"), format!("{min_capacity} is out of range: expected more than 0 and at most the limit's capacity {capacity}"));
    }
    if raw.window.0.is_zero() {
        errors.at(
            span.clone(),
            format!("{key}.window"),
            "must be longer than zero",
        );
    }
    if raw.hold.0 < raw.window.0 {
        errors.at(
            span,
            format!("{key}.hold"),
            format!(
                "hold ({}) must be at least the window ({})",
                humantime::format_duration(raw.hold.0),
                humantime::format_duration(raw.window.0)
            ),
        );
    }
    Adaptive {
        on_status,
        params: AdaptiveParams {
            threshold,
            window: raw.window.0.as_secs_f64(),
            factor: raw.factor,
            min_capacity,
            hold: raw.hold.0.as_secs_f64(),
        },
    }
}

fn compile_charges(
    raw: Spanned<BTreeMap<String, f64>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Vec<(u16, f64)> {
    let span = Some(raw.span());
    let mut charges = Vec::new();
    for (status, tokens) in raw.into_inner() {
        let Some(code) = status.parse::<i64>().ok().and_then(status_code) else {
            errors.at(
                span.clone(),
                format!("{key}.charge_on_status"),
                format!("{status:?} is not an HTTP status: expected 100 to 599, such as 404 = 5"),
            );
            continue;
        };
        if !(tokens.is_finite() && tokens >= 0.0) {
            errors.at(
                span.clone(),
                format!("{key}.charge_on_status.{status}"),
                format!("{tokens} is out of range: a charge is 0 or more tokens"),
            );
            continue;
        }
        charges.push((code, tokens));
    }
    charges
}

/// A multiplier that shrinks limits: in (0, 1].
fn check_factor(factor: f64, key: &str, span: Option<Range<usize>>, errors: &mut Errors<'_>) {
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
        errors.at(
            span,
            key,
            format!("{factor} is out of range: expected a factor in (0, 1], such as 0.5"),
        );
    }
}

fn compile_overload(raw: Spanned<raw::RawOverload>, errors: &mut Errors<'_>) -> Option<Overload> {
    let span = Some(raw.span());
    let raw = raw.into_inner();
    check_factor(raw.factor, "overload.factor", span.clone(), errors);
    let max_inflight = match raw.max_inflight {
        Some(value) if value >= 1 => Some(value as u64),
        Some(value) => {
            errors.at(
                span.clone(),
                "overload.max_inflight",
                format!("{value} is out of range: expected at least 1"),
            );
            None
        }
        None => None,
    };
    let latency_target = raw.latency_target.map(|target| target.0);
    if latency_target.is_some_and(|target| target.is_zero()) {
        errors.at(
            span.clone(),
            "overload.latency_target",
            "must be longer than zero",
        );
    }
    if max_inflight.is_none() && latency_target.is_none() {
        errors.at(
            span,
            "overload",
            "set max_inflight, latency_target or both: what counts as overloaded",
        );
        return None;
    }
    Some(Overload {
        max_inflight,
        latency_target,
        factor: raw.factor,
    })
}

fn fingerprint(parts: &[&str]) -> u64 {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
}

fn compile_route(
    index: usize,
    raw: Spanned<raw::RawRoute>,
    upstreams: &[Arc<Upstream>],
    limits: &[Arc<Limit>],
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
    let path = match (&raw.path, &raw.path_prefix) {
        (Some(path), None) => route_path(path, &key, "path", errors).map(PathMatch::Exact),
        (None, Some(prefix)) => {
            route_path(prefix, &key, "path_prefix", errors).map(PathMatch::Prefix)
        }
        (Some(path), Some(_)) => {
            errors.at(Some(path.span()), &key, "both path and path_prefix are set: use path for one exact path or path_prefix for a subtree");
            None
        }
        (None, None) => {
            errors.at(
                Some(span.clone()),
                &key,
                "no path: set path = \"/login\" (exact) or path_prefix = \"/api/\" (subtree)",
            );
            None
        }
    };
    let methods = raw.methods.as_ref().map(|methods| {
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
    });
    let host = raw.host.as_ref().map(|host| {
        let text = host.get_ref().trim().to_ascii_lowercase();
        if text.is_empty() || text.parse::<http::uri::Authority>().is_err() || text.contains(':') && !text.starts_with('[') {
            errors.at(Some(host.span()), format!("{key}.host"), format!("invalid host {:?}: expected a host name such as \"shop.example.com\" (no port)", host.get_ref()));
        }
        text
    });
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
        let cost = match entry.cost {
            Some(cost) => positive_cost(
                &Spanned::new(entry_span.clone(), cost),
                &format!("{key}.limits"),
                errors,
            ),
            None => route_cost,
        };
        let capacity = limit.capacity;
        if cost > capacity {
            errors.at(Some(entry_span), format!("{key}.limits"), format!("cost {cost} is larger than limit {:?}'s capacity {capacity}: no request could ever pass; raise the capacity or lower the cost", entry.limit));
        }
        route_limits.push(RouteLimit {
            limit: limit.clone(),
            cost,
        });
    }
    let reads_body = route_limits.iter().any(|entry| entry.limit.reads_body());
    Some(Route {
        name: Arc::from(name.as_str()),
        host,
        methods,
        path: path?,
        upstream: upstream?,
        limits: route_limits,
        on_store_failure: raw.on_store_failure.unwrap_or_default(),
        reads_body,
    })
}

fn positive_cost(cost: &Spanned<f64>, key: &str, errors: &mut Errors<'_>) -> f64 {
    let value = *cost.get_ref();
    if !(value.is_finite() && value > 0.0) {
        errors.at(Some(cost.span()), key, format!("cost {value} is out of range: a cost must be greater than zero (use mode = \"shadow\" on the limit to observe without refusing)"));
        return 1.0;
    }
    value
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

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Valid but suspicious policy.
fn warnings(policy: &Policy) -> Vec<String> {
    let mut warnings = Vec::new();
    for limit in &policy.limits {
        if !policy.routes.iter().any(|route| {
            route
                .limits
                .iter()
                .any(|entry| Arc::ptr_eq(&entry.limit, limit))
        }) {
            warnings.push(format!("limit {:?} is not used by any route", limit.name));
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
    }
    let catch_all = policy.routes.iter().any(|route| {
        route.host.is_none()
            && route.methods.is_none()
            && route.path == PathMatch::Prefix("/".to_owned())
    });
    if !catch_all {
        warnings.push("no catch-all route (path_prefix = \"/\"): requests that match no route get 404 from the gateway".to_owned());
    }
    warnings
}

pub(super) fn summary(policy: &Policy) -> String {
    let mut out = String::new();
    let listen: Vec<String> = policy
        .server
        .listen
        .iter()
        .map(ToString::to_string)
        .collect();
    let _ = writeln!(
        out,
        "listen {}   admin {}",
        listen.join(", "),
        policy.admin.listen
    );
    let trust = match &policy.client_ip.trust {
        Trust::Hops(0) => "the TCP peer is the client (trusted_hops = 0)".to_owned(),
        Trust::Hops(hops) => format!("trust {hops} X-Forwarded-For hop(s)"),
        Trust::Proxies(networks) => {
            let networks: Vec<String> = networks.iter().map(ToString::to_string).collect();
            format!("trust proxies in {}", networks.join(", "))
        }
    };
    let _ = writeln!(
        out,
        "client address: {trust}; networks /{} (IPv4), /{} (IPv6)",
        policy.client_ip.ipv4_prefix, policy.client_ip.ipv6_prefix
    );
    let _ = writeln!(
        out,
        "store: {}, max {} keys",
        policy.store.backend.as_str(),
        policy.store.max_keys
    );
    let _ = writeln!(out, "\nroutes (first match wins):");
    let _ = writeln!(
        out,
        "  {:<16} {:<10} {:<28} {:<12} {:<16} limits (cost)",
        "name", "methods", "path", "upstream", "on store failure"
    );
    for route in &policy.routes {
        let methods = route.methods.as_ref().map_or("any".to_owned(), |methods| {
            methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(",")
        });
        let path = match &route.path {
            PathMatch::Exact(path) => path.clone(),
            PathMatch::Prefix(prefix) => format!("{}/*", prefix.trim_end_matches('/')),
        };
        let path = match &route.host {
            Some(host) => format!("{host}{path}"),
            None => path,
        };
        let limits: Vec<String> = route
            .limits
            .iter()
            .map(|entry| format!("{} ({})", entry.limit.name, entry.cost))
            .collect();
        let _ = writeln!(
            out,
            "  {:<16} {:<10} {:<28} {:<12} {:<16} {}",
            route.name,
            methods,
            path,
            route.upstream.name,
            route.on_store_failure.as_str(),
            if limits.is_empty() {
                "-".to_owned()
            } else {
                limits.join(", ")
            }
        );
    }
    let _ = writeln!(out, "\nlimits:");
    let _ = writeln!(
        out,
        "  {:<16} {:<30} {:>9} {:>14} {:>12}  notes",
        "name", "key", "capacity", "rate", "refill"
    );
    for limit in &policy.limits {
        let key = if limit.key.is_empty() {
            "global".to_owned()
        } else {
            limit
                .key
                .iter()
                .map(describe_source)
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let mut notes = Vec::new();
        if limit.mode == Mode::Shadow {
            notes.push("shadow".to_owned());
        }
        if limit.missing == Missing::Reject {
            notes.push("missing key → 400".to_owned());
        }
        if limit.normalize != Normalize::None {
            notes.push(format!("normalize {:?}", limit.normalize).to_lowercase());
        }
        if !limit.exempt.is_empty() {
            notes.push(format!("{} exempt network(s)", limit.exempt.len()));
        }
        if let Some(adaptive) = &limit.adaptive {
            let statuses: Vec<String> = adaptive.on_status.iter().map(u16::to_string).collect();
            let params = adaptive.params;
            notes.push(format!(
                "adaptive: {} × {} within {} → ×{} (min {}) for {}",
                params.threshold,
                statuses.join("/"),
                humantime::format_duration(Duration::from_secs_f64(params.window)),
                params.factor,
                params.min_capacity,
                humantime::format_duration(Duration::from_secs_f64(params.hold)),
            ));
        }
        for (status, tokens) in &limit.charge_on_status {
            notes.push(format!("{status} costs +{tokens}"));
        }
        let _ = writeln!(
            out,
            "  {:<16} {:<30} {:>9} {:>14} {:>12}  {}",
            limit.name,
            key,
            limit.capacity,
            limit.rate.to_string(),
            humantime::format_duration(Duration::from_secs_f64(
                limit.refill_seconds().min(1e9).round()
            ))
            .to_string(),
            notes.join(", ")
        );
    }
    if let Some(overload) = &policy.overload {
        let mut triggers = Vec::new();
        if let Some(max) = overload.max_inflight {
            triggers.push(format!("more than {max} upstream requests in flight"));
        }
        if let Some(target) = overload.latency_target {
            triggers.push(format!(
                "upstream latency above {}",
                humantime::format_duration(target)
            ));
        }
        let _ = writeln!(
            out,
            "\noverload: every rate × {} while {} (per replica)",
            overload.factor,
            triggers.join(" or ")
        );
    }
    let upstreams: BTreeMap<&str, String> = policy
        .upstreams
        .iter()
        .map(|upstream| {
            let urls: Vec<String> = upstream
                .targets
                .iter()
                .map(|target| target.url.to_string())
                .collect();
            (upstream.name.as_str(), urls.join(", "))
        })
        .collect();
    let _ = writeln!(out, "\nupstreams:");
    for (name, urls) in upstreams {
        let _ = writeln!(out, "  {name:<16} {urls}");
    }
    for warning in &policy.warnings {
        let _ = writeln!(out, "\nwarning: {warning}");
    }
    out
}

fn describe_source(source: &KeySource) -> String {
    match source {
        KeySource::ClientNetwork => "client_network".to_owned(),
        KeySource::Global => "global".to_owned(),
        KeySource::Header(name) => format!("header {name}"),
        KeySource::Query(name) => format!("query {name}"),
        KeySource::Cookie(name) => format!("cookie {name}"),
        KeySource::JsonField(name) => format!("json {name}"),
        KeySource::FormField(name) => format!("form {name}"),
    }
}
