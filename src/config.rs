//! The policy: the TOML file (`raw.rs`) compiled into validated runtime types (`compile.rs`)
//! that requests read. A compiled [`Policy`] is immutable; a reload compiles a new one.

mod compile;
pub mod costs;
#[cfg(test)]
pub(crate) use compile::testing;
pub mod decision;
mod edge;
pub mod raw;
mod summary;
mod tls;
mod traces;
pub mod units;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Uri};
use ipnet::IpNet;

pub use decision::{DecisionSettings, DescriptorEntry, DescriptorRule};
pub use edge::{ConnectionLimits, Http3Settings, NetworkRate, ProxyProtocol};
pub use raw::{
    Backend, HeaderMode, Http1Path, KeySource, Missing, Mode, Normalize, Reuse, StoreFailurePolicy,
};
pub use units::Rate;

pub use crate::limit::redis::RedisSettings;
pub use crate::path::PathMatching;
pub use tls::{
    AcmeChallenge, AcmeSettings, CertificateFiles, HostPattern, TlsFiles, TlsSettings, TlsVersion,
};
pub use traces::{OtlpProtocol, TraceSettings};

use crate::client_ip::Trust;

/// A validated policy, ready to serve.
#[derive(Debug, Clone)]
pub struct Policy {
    pub server: ServerSettings,
    pub admin: AdminSettings,
    pub client_ip: ClientIpSettings,
    pub store: StoreSettings,
    pub upstreams: Vec<Arc<Upstream>>,
    pub limits: Vec<Arc<Limit>>,
    /// In match order: the first that matches wins.
    pub routes: Vec<Route>,
    /// Scale every limit's rate while the upstream struggles.
    pub overload: Option<Overload>,
    /// `[auth.jwt]`: verifies the tokens whose claims key limits or pick their tiers.
    pub jwt: Option<Arc<crate::jwt::JwtVerifier>>,
    /// `[decision]`: the listener other proxies ask for decisions.
    pub decision: Option<DecisionSettings>,
    /// `[geoip]`: the databases of the `client_asn` and `client_country` keys, opened.
    pub geoip: Option<Arc<crate::geoip::GeoIp>>,
    /// `[overrides]`: where the memory store keeps them, and how long one may last.
    pub overrides: OverrideSettings,
    /// `[tracing]` (or `OTEL_EXPORTER_OTLP_ENDPOINT`): request spans exported over OTLP.
    pub tracing: Option<TraceSettings>,
    /// `[top]`: heavy hitters tracked per limit.
    pub top: TopSettings,
    /// `[scan]`: keys that walk many paths answered "not found", detected and perhaps banned.
    pub scan: Option<Arc<ScanSettings>>,
    /// Suspicious but valid policy (`tollgate check` prints them, `run` logs them).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    /// TLS on every `listen` address (ALPN h2 and http/1.1).
    pub tls: Option<TlsSettings>,
    /// Plain HTTP listeners beside the TLS ones (`plain_listen`).
    pub plain_listen: Vec<SocketAddr>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_buffered_body: usize,
    pub grace_period: Duration,
    pub ratelimit_headers: HeaderMode,
    pub http1: Http1Path,
    pub path_matching: PathMatching,
    /// Keep request fields whose names have underscores (`x_user_id`); by default they are
    /// dropped, as nginx does, since CGI-style servers read `x_user_id` and `X-User-Id` alike.
    pub underscores_in_headers: bool,
    /// `[server.connections]`, checked as a proxy listener accepts.
    pub connections: ConnectionLimits,
    /// Peers that must begin their connections with a PROXY header.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// `[server.http3]`: QUIC listeners beside the TLS ones.
    pub http3: Option<Http3Settings>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// `token_env`: `/limits` then requires this bearer token.
    pub token: Option<AdminToken>,
    /// Connections served at once; past them, a connection gets one short answer (`/healthz`
    /// still 200) and is closed.
    pub max_connections: usize,
}

/// The admin API's bearer token, as `token_env` named it when the policy was read. Its
/// `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// The environment variable it came from.
    pub variable: String,
    token: String,
}

impl AdminToken {
    pub fn new(variable: String, token: String) -> AdminToken {
        AdminToken { variable, token }
    }

    /// The token, for a client of the admin API (`tollgate inspect`).
    pub fn secret(&self) -> &str {
        &self.token
    }

    /// Whether `candidate` is the token, compared in constant time (for a given length).
    pub fn accepts(&self, candidate: &[u8]) -> bool {
        let token = self.token.as_bytes();
        candidate.len() == token.len()
            && candidate
                .iter()
                .zip(token)
                .fold(0u8, |difference, (a, b)| difference | (a ^ b))
                == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminToken(${})", self.variable)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClientIpSettings {
    pub trust: Trust,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Write `X-Real-IP` with the resolved client on forwarded requests (`x_real_ip`).
    pub x_real_ip: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    pub backend: Backend,
    pub max_keys: usize,
    /// Secret for hashing request-derived key values (`hash_key`, else `TOLLGATE_HASH_KEY`);
    /// `None` only with the memory backend: then a random one per process.
    pub hash_key: Option<String>,
    /// Set when `backend = "redis"`.
    pub redis: Option<RedisSettings>,
}

/// `[scan]`.
#[derive(Debug, Clone)]
pub struct ScanSettings {
    /// The key, as a limit named `scan` keys it (sources, normalization, prefixes, exempt
    /// networks); a request without it is not counted.
    pub key: Arc<Limit>,
    /// The upstream statuses that count.
    pub statuses: Vec<u16>,
    /// Distinct paths within `within` that make a key a scanner.
    pub distinct_paths: usize,
    pub within: Duration,
    /// How long a detected key is refused on every route; `None`: detection only.
    pub ban: Option<Duration>,
}

/// `[top]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopSettings {
    /// Counters per limit and thing counted; 0 turns top keys off.
    pub keys_per_limit: usize,
}

impl Default for TopSettings {
    fn default() -> Self {
        TopSettings {
            keys_per_limit: 1000,
        }
    }
}

/// `[overrides]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverrideSettings {
    /// With the memory store: the file overrides are kept in across restarts.
    pub file: Option<std::path::PathBuf>,
    /// The longest an override may last; also how long one without a `ttl` lasts.
    pub max_ttl: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub targets: Vec<UpstreamTarget>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// Roots for `https://` targets; `None`: the system's.
    pub ca_file: Option<PathBuf>,
    pub reuse: Reuse,
}

/// One address of an upstream: where requests go, and the path they are put under.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTarget {
    /// `http://` (HTTP/1.1), `h2c://` (HTTP/2 without TLS, by prior knowledge) or `https://`
    /// (HTTP/2 when the target's TLS picks `h2`, else HTTP/1.1).
    pub url: Uri,
    /// The URL's path without its trailing slash (`""` for the root).
    pub base_path: String,
}

impl UpstreamTarget {
    /// `h2c://`: HTTP/2 from the first byte.
    pub fn speaks_http2_only(&self) -> bool {
        self.url.scheme_str() == Some("h2c")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: Arc<str>,
    /// The parts of the key; empty for `global`.
    pub key: Vec<KeySource>,
    pub normalize: Normalize,
    pub missing: Missing,
    pub capacity: f64,
    pub rate: Rate,
    pub mode: Mode,
    pub exempt: Vec<IpNet>,
    /// Autonomous systems and countries the limit never applies to (`[geoip]`).
    pub exempt_asns: Vec<u32>,
    pub exempt_countries: Vec<crate::geoip::Country>,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Identifies this definition; buckets of a redefined limit start fresh.
    pub fingerprint: u64,
    pub adaptive: Option<Adaptive>,
    /// Extra tokens charged after the response, by status.
    pub charge_on_status: Vec<(u16, f64)>,
    /// Where a request's tier comes from; `None`: one set of numbers for everyone.
    pub tier: Option<TierSource>,
    /// `[limits.X.tiers]`, by tier value.
    pub tiers: Vec<(String, Tier)>,
    /// A calendar quota (`quota`, `period`, `timezone`): `capacity` is the quota, counted per
    /// period without refill, and `rate` only spreads it over a nominal period for display.
    pub calendar: Option<crate::limit::calendar::Calendar>,
    /// A concurrency limit (`concurrency`): at most this many of a key's requests in flight,
    /// each holding a slot until its response ends; `capacity` is the same number.
    pub concurrency: Option<u32>,
    /// `on_limit = "delay"`: a request that would find its tokens within this long books
    /// them and waits, instead of being refused.
    pub max_delay: Option<Duration>,
    /// Token leases (`lease`): each replica takes up to `rate × lease` tokens per store call
    /// and spends them locally (the Redis store; the memory store decides as usual).
    pub lease: Option<Duration>,
    /// `[limits.NAME.ban]`: a key refused `after` times within `within` is refused entirely
    /// for `duration`.
    pub ban: Option<crate::limit::ban::Ban>,
    /// `[limits.NAME.refusal]`: how this limit's refusals are answered, when not as usual.
    pub refusal: Option<Arc<Refusal>>,
    /// Numbers the request carries (a claim or a trusted header), in place of `capacity`,
    /// `rate` (or a quota's `capacity`), which are then their defaults.
    pub carried: Option<CarriedNumbers>,
}

/// A limit's numbers as requests carry them; those not carried are the limit's own.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CarriedNumbers {
    pub capacity: Option<Carried<f64>>,
    pub rate: Option<Carried<Rate>>,
    pub quota: Option<Carried<f64>>,
}

impl CarriedNumbers {
    /// Where the numbers are read, each with the name the policy gives it.
    pub fn sources(&self) -> impl Iterator<Item = (&'static str, &NumberSource)> {
        [
            (
                "capacity",
                self.capacity.as_ref().map(|carried| &carried.source),
            ),
            ("rate", self.rate.as_ref().map(|carried| &carried.source)),
            ("quota", self.quota.as_ref().map(|carried| &carried.source)),
        ]
        .into_iter()
        .filter_map(|(name, source)| Some((name, source?)))
    }

    fn reads_token(&self) -> bool {
        self.sources()
            .any(|(_, source)| matches!(source, NumberSource::JwtClaim(_)))
    }
}

/// One number a request carries, and the most it may ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Carried<T> {
    pub source: NumberSource,
    pub max: T,
}

/// Where a request carries a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumberSource {
    /// A dotted path into the verified token's claims.
    JwtClaim(String),
    /// A header that a proxy in front sets (`trust_header = true`).
    Header(http::HeaderName),
}

/// How a limit's refusals are answered (`[limits.NAME.refusal]`): an anti-flood limit may
/// answer without advertising its numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: http::StatusCode,
    /// The rate-limit headers of its refusals; `None`: `[server] ratelimit_headers`.
    pub headers: Option<HeaderMode>,
    /// Whether its refusals say `Retry-After` (and the body's `retry_after`).
    pub retry_after: bool,
    /// The body, read from `body_file`, and its content type; `None`: the usual JSON.
    pub body: Option<(bytes::Bytes, Arc<str>)>,
}

/// Where a request's tier is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierSource {
    /// A dotted path into the verified token's claims.
    JwtClaim(String),
    /// A header that a proxy in front sets (`trust_header = true`).
    Header(http::HeaderName),
}

/// What a tier changes for its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tier {
    /// The limit does not apply.
    Exempt,
    /// The limit's bucket, with these numbers.
    Bucket { capacity: f64, rate: Rate },
}

/// A limit's `[adaptive]` table: which statuses are errors, and the penalty.
#[derive(Debug, Clone, PartialEq)]
pub struct Adaptive {
    pub on_status: Vec<u16>,
    pub params: crate::limit::AdaptiveParams,
}

/// `[overload]`: when the upstream counts as overloaded, and how much rates shrink then.
#[derive(Debug, Clone, PartialEq)]
pub struct Overload {
    pub max_inflight: Option<u64>,
    pub latency_target: Option<Duration>,
    pub factor: f64,
}

impl Limit {
    /// Whether the key reads the request body (which then has to be buffered).
    pub fn reads_body(&self) -> bool {
        self.key
            .iter()
            .any(|source| matches!(source, KeySource::JsonField(_) | KeySource::FormField(_)))
    }

    /// Whether the key or the tier reads a claim of the request's token (which then has to be
    /// verified).
    pub fn reads_token(&self) -> bool {
        self.key
            .iter()
            .any(|source| matches!(source, KeySource::JwtClaim(_)))
            || matches!(self.tier, Some(TierSource::JwtClaim(_)))
            || self
                .carried
                .as_ref()
                .is_some_and(CarriedNumbers::reads_token)
    }

    /// Whether the key or an exemption reads what `[geoip]` says of the client.
    pub fn reads_origin(&self) -> bool {
        self.key
            .iter()
            .any(|source| matches!(source, KeySource::ClientAsn | KeySource::ClientCountry))
            || !self.exempt_asns.is_empty()
            || !self.exempt_countries.is_empty()
    }

    /// What one request costs this limit: with `tier`'s numbers (`None` for an exempt tier),
    /// the refill multiplied by `rate_factor` (an overload), and for a calendar quota the
    /// period `calendar_now` (Unix seconds, read only for a quota) falls in. The one place
    /// the gateway, the admin API and replay build a limit's charge.
    pub fn charge(
        &self,
        tier: Option<&Tier>,
        cost: f64,
        rate_factor: f64,
        calendar_now: impl FnOnce() -> f64,
    ) -> Option<crate::limit::Charge> {
        let (capacity, rate) = match tier {
            Some(Tier::Exempt) => return None,
            Some(Tier::Bucket { capacity, rate }) => (*capacity, *rate),
            None => (self.capacity, self.rate),
        };
        let period = self
            .calendar
            .as_ref()
            .map(|calendar| calendar.quota_period(calendar_now()));
        // A quota never refills: its count starts over with its period.
        let rate = if period.is_some() {
            0.0
        } else {
            rate.per_second() * rate_factor
        };
        Some(crate::limit::Charge {
            capacity,
            rate,
            cost,
            enforce: self.mode == Mode::Enforce,
            period,
            debt: self
                .max_delay
                .map_or(0.0, |max_delay| rate * max_delay.as_secs_f64()),
        })
    }

    /// Extra tokens charged after a response with this status.
    pub fn charge_for(&self, status: u16) -> f64 {
        self.charge_on_status
            .iter()
            .find(|(code, _)| *code == status)
            .map_or(0.0, |(_, tokens)| *tokens)
    }

    /// Whether this status counts as an error for the key's adaptive penalty.
    pub fn is_error(&self, status: u16) -> bool {
        self.adaptive
            .as_ref()
            .is_some_and(|adaptive| adaptive.on_status.contains(&status))
    }

    /// Seconds an empty bucket takes to fill up (a quota: its nominal period).
    pub fn refill_seconds(&self) -> f64 {
        self.capacity / self.rate.per_second()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: Arc<str>,
    /// Lower-case host name, without port.
    pub host: Option<String>,
    /// `None`: any method.
    pub methods: Option<Vec<Method>>,
    pub path: PathMatch,
    /// What requests' match paths are compared with: `path`, in canonical form unless
    /// `[server] path_matching = "strict"`.
    pub match_path: PathMatch,
    pub upstream: Arc<Upstream>,
    pub limits: Vec<RouteLimit>,
    pub on_store_failure: StoreFailurePolicy,
    /// Some limit of this route reads the body, so the body is buffered before deciding.
    pub reads_body: bool,
    /// Some limit of this route reads a token's claim, so a token it carries is verified.
    pub reads_token: bool,
    /// Some limit of this route (or `[scan]`'s key) reads the client's autonomous system or
    /// country.
    pub reads_origin: bool,
    /// `[scan]` bans keys: any request of the route may be refused as banned.
    pub scan_bans: bool,
}

impl AsRef<Route> for Route {
    fn as_ref(&self) -> &Route {
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteLimit {
    pub limit: Arc<Limit>,
    /// The tokens a request reserves: fixed, or `read_cost`'s default.
    pub cost: f64,
    /// The cost read from each request instead, when the entry says where.
    pub read_cost: Option<costs::ReadCost>,
    /// How the reservation is settled after the response, when the entry says.
    pub settle: Option<costs::Settle>,
}

/// How a route matches the normalized path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// This path, with or without one trailing slash (stored without it, `/` for the root).
    Exact(String),
    /// This path and everything below it, segment by segment (stored without trailing slash).
    Prefix(String),
}

/// One problem in a policy file, located as precisely as the file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based line and column.
    pub position: Option<(usize, usize)>,
    /// The TOML key path, such as `routes[2].limits` (empty when the parser did not say).
    pub key: String,
    pub message: String,
    /// The offending line of the file, when known.
    pub excerpt: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((line, column)) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        f.write_str(": ")?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)?;
        if let Some(excerpt) = &self.excerpt {
            write!(f, "\n    | {excerpt}")?;
        }
        Ok(())
    }
}

/// Every problem found in a policy file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// Compiles a policy file's text; relative paths in it are relative to `base`.
pub(crate) fn compile_file(
    file: &str,
    text: &str,
    base: Option<&Path>,
) -> Result<Policy, ConfigErrors> {
    compile::compile(file, text, base)
}

impl Policy {
    /// Compiles policy text; `file` names it in error messages. Relative paths in it are
    /// relative to the working directory. Files it names are not read (see [`Policy::load`]).
    pub fn parse(file: &str, text: &str) -> Result<Policy, ConfigErrors> {
        compile::compile(file, text, None)
    }

    /// Looks up a limit by name.
    pub fn limit(&self, name: &str) -> Option<&Limit> {
        self.limits
            .iter()
            .find(|limit| &*limit.name == name)
            .map(|limit| &**limit)
    }

    /// The compiled policy as a readable table (`tollgate check`).
    pub fn summary(&self) -> String {
        summary::summary(self)
    }
}

/// Where `run` and `check` look for the policy when `--config` is not given.
pub fn default_path() -> PathBuf {
    std::env::var_os("TOLLGATE_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("config/tollgate.toml"))
}
