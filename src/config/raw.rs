//! The policy file as written: serde types that mirror the TOML, unknown keys refused.
//!
//! Values with a human form (durations, sizes, rates) are parsed here, so that a bad value is
//! reported by the TOML parser with its line, column and key. Everything that needs more than
//! one value to judge is checked in `compile.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::units::{self, Rate};

mod decision;
mod edge;
mod limit;
mod overrides;
mod route_limit;
mod scan;
mod tls;
mod top;
mod traces;

pub use decision::{RawDecision, RawDescriptorEntry, RawDescriptorRule};
pub use edge::{RawConnections, RawHttp3, RawNetworkRate, RawProxyProtocol};
pub use limit::{RawBan, RawCarried, RawLimit, RawNumber, RawRefusal, RawTier, RawTierSource};
pub use overrides::RawOverrides;
pub use route_limit::{RawCost, RawReadCost, RawRouteLimit, RawSettle, RawSettleField};
pub use scan::RawScan;
pub use tls::{RawAcme, RawCertificate, RawTls};
pub use top::RawTop;
pub use traces::RawTracing;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub client_ip: RawClientIp,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub upstreams: BTreeMap<String, Spanned<RawUpstream>>,
    #[serde(default)]
    pub limits: BTreeMap<String, Spanned<RawLimit>>,
    #[serde(default)]
    pub routes: Vec<Spanned<RawRoute>>,
    pub overload: Option<Spanned<RawOverload>>,
    #[serde(default)]
    pub auth: RawAuth,
    pub decision: Option<Spanned<RawDecision>>,
    pub geoip: Option<Spanned<RawGeoIp>>,
    #[serde(default)]
    pub overrides: RawOverrides,
    pub tracing: Option<RawTracing>,
    #[serde(default)]
    pub top: RawTop,
    pub scan: Option<Spanned<RawScan>>,
}

/// `[geoip]`: MaxMind DB files for the `client_asn` and `client_country` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGeoIp {
    pub asn_db: Option<Spanned<String>>,
    pub country_db: Option<Spanned<String>>,
}

/// An entry of `exempt_asns`: `15169` or `"AS15169"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawAsn {
    Number(i64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub jwt: Option<Spanned<RawJwt>>,
}

/// `[auth.jwt]`: where tokens are found and what verifies them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    pub from: Option<Spanned<RawTokenSource>>,
    pub jwks_file: Option<Spanned<String>>,
    pub secret_env: Option<Spanned<String>>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Option<HumanDuration>,
}

/// `{ header = "authorization" }` or `{ cookie = "session" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenSource {
    pub header: Option<String>,
    pub cookie: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<Spanned<Vec<String>>>,
    /// Not `Spanned`: `[[server.tls.certificates]]` alone makes the table implicitly, which
    /// toml cannot span.
    pub tls: Option<RawTls>,
    pub plain_listen: Option<Spanned<Vec<String>>>,
    pub header_read_timeout: Option<HumanDuration>,
    pub idle_timeout: Option<HumanDuration>,
    pub max_header_bytes: Option<Spanned<i64>>,
    pub max_buffered_body: Option<Spanned<HumanSize>>,
    pub grace_period: Option<HumanDuration>,
    pub ratelimit_headers: Option<HeaderMode>,
    pub http1: Option<Http1Path>,
    pub path_matching: Option<crate::path::PathMatching>,
    pub underscores_in_headers: Option<bool>,
    pub connections: Option<RawConnections>,
    pub proxy_protocol: Option<Spanned<RawProxyProtocol>>,
    pub http3: Option<Spanned<RawHttp3>>,
}

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderMode {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    #[default]
    Legacy,
    /// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers.
    Ietf,
    Both,
    None,
}

/// Which HTTP/1.1 server serves plain bodyless requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Http1Path {
    /// The gateway's own keep-alive path (`server/http1.rs`); hyper serves everything else.
    #[default]
    Fast,
    /// hyper serves every request.
    Hyper,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<Spanned<String>>,
    /// The environment variable holding the bearer token `/limits` requires.
    pub token_env: Option<Spanned<String>>,
    pub max_connections: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientIp {
    pub trusted_hops: Option<Spanned<i64>>,
    pub trusted_proxies: Option<Spanned<Vec<String>>>,
    pub ipv4_prefix: Option<Spanned<i64>>,
    pub ipv6_prefix: Option<Spanned<i64>>,
    pub x_real_ip: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Memory,
    Redis,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub backend: Option<Spanned<Backend>>,
    pub max_keys: Option<Spanned<i64>>,
    pub url: Option<Spanned<String>>,
    pub cluster: Option<bool>,
    pub timeout: Option<HumanDuration>,
    pub connect_timeout: Option<HumanDuration>,
    pub prefix: Option<String>,
    /// PEM roots to verify a `rediss://` server with (else the system's).
    pub ca_file: Option<String>,
    /// How long a concurrency slot held in Redis lasts unless its request renews it.
    pub lease: Option<HumanDuration>,
    /// Secret for the keyed hash of request-derived key values (else `TOLLGATE_HASH_KEY`).
    pub hash_key: Option<Spanned<String>>,
    /// An ACL user, and the environment variable holding the password: never in the file.
    pub username: Option<Spanned<String>>,
    pub password_env: Option<Spanned<String>>,
    /// The variable holding the sentinels' password, when they require one.
    pub sentinel_password_env: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub url: Option<Spanned<String>>,
    pub urls: Option<Spanned<Vec<String>>>,
    pub connect_timeout: Option<HumanDuration>,
    pub timeout: Option<HumanDuration>,
    pub ca_file: Option<String>,
    pub reuse: Option<Reuse>,
}

/// Which requests an idle upstream connection may carry next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reuse {
    /// Any client's.
    #[default]
    Shared,
    /// Only those of the client connection whose requests it carried (HAProxy's
    /// `http-reuse safe`): bytes a buggy upstream sends after a response can answer no other
    /// client.
    PerClient,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdaptive {
    pub on_status: Vec<i64>,
    pub threshold: i64,
    pub window: HumanDuration,
    pub factor: f64,
    pub min_capacity: Option<f64>,
    pub hold: HumanDuration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverload {
    pub max_inflight: Option<i64>,
    pub latency_target: Option<HumanDuration>,
    pub factor: f64,
}

/// How a key value is normalized before it is hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalize {
    #[default]
    None,
    Lowercase,
    /// Trim surrounding white space and lowercase.
    Email,
}

/// What happens when a request does not carry a limit's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missing {
    /// The limit does not apply to that request.
    #[default]
    Skip,
    /// The request is answered 400.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    #[default]
    Refuse,
    /// Book the tokens and hold the request until they come (within `max_delay`).
    Delay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    /// Decide and count, never refuse.
    Shadow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreFailurePolicy {
    /// Admit, counted as degraded.
    #[default]
    Allow,
    /// Refuse with 503.
    Deny,
    /// Decide with in-process buckets of the same limits.
    Local,
}

impl StoreFailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreFailurePolicy::Allow => "allow",
            StoreFailurePolicy::Deny => "deny",
            StoreFailurePolicy::Local => "local",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Spanned<String>,
    pub methods: Option<Spanned<Vec<String>>>,
    pub path: Option<Spanned<String>>,
    pub path_prefix: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub upstream: Spanned<String>,
    pub cost: Option<Spanned<f64>>,
    #[serde(default)]
    pub limits: Vec<Spanned<RawRouteLimit>>,
    pub on_store_failure: Option<StoreFailurePolicy>,
}

/// A limit's `key`: one source, or a list of sources forming a composite key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RawKey {
    One(KeySource),
    Composite(Vec<KeySource>),
}

/// Where one part of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeySource {
    ClientNetwork,
    Global,
    /// A header field, its name checked and lower-cased when the policy is read.
    Header(http::HeaderName),
    Query(String),
    Cookie(String),
    /// A dotted path into a JSON body.
    JsonField(String),
    FormField(String),
    /// A dotted path into a verified token's claims (`[auth.jwt]`).
    JwtClaim(String),
    /// The client's autonomous system (`[geoip] asn_db`).
    ClientAsn,
    /// The client's country (`[geoip] country_db`).
    ClientCountry,
    /// The JA4 fingerprint of the connection's TLS ClientHello.
    TlsJa4,
}

const KEY_EXPECTED: &str = "\"client_network\", \"global\", \"client_asn\", \"client_country\", \"tls_ja4\", { header = \"..\" }, { query = \"..\" }, { cookie = \"..\" }, { json_field = \"..\" }, { form_field = \"..\" }, { jwt_claim = \"..\" }, or a list of these";

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KeySourceVisitor)
    }
}

struct KeySourceVisitor;

impl<'de> Visitor<'de> for KeySourceVisitor {
    type Value = KeySource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(KEY_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<KeySource, E> {
        match name {
            "client_network" => Ok(KeySource::ClientNetwork),
            "global" => Ok(KeySource::Global),
            "client_asn" => Ok(KeySource::ClientAsn),
            "client_country" => Ok(KeySource::ClientCountry),
            "tls_ja4" => Ok(KeySource::TlsJa4),
            other => Err(E::custom(format!(
                "unknown key {other:?}: expected {KEY_EXPECTED}"
            ))),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeySource, A::Error> {
        let Some((kind, name)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom(format!(
                "empty key table: expected {KEY_EXPECTED}"
            )));
        };
        if map.next_key::<String>()?.is_some() {
            return Err(de::Error::custom(
                "a key table names exactly one source; use a list for a composite key",
            ));
        }
        if name.is_empty() {
            return Err(de::Error::custom(format!("{kind} name must not be empty")));
        }
        match kind.as_str() {
            "header" => http::HeaderName::from_bytes(name.as_bytes())
                .map(KeySource::Header)
                .map_err(|_| de::Error::custom(format!("{name:?} is not a valid header name"))),
            "query" => Ok(KeySource::Query(name)),
            "cookie" => Ok(KeySource::Cookie(name)),
            "json_field" => Ok(KeySource::JsonField(name)),
            "form_field" => Ok(KeySource::FormField(name)),
            "jwt_claim" => Ok(KeySource::JwtClaim(name)),
            other => Err(de::Error::custom(format!(
                "unknown key source {other:?}: expected {KEY_EXPECTED}"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for RawKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RawKeyVisitor;

        impl<'de> Visitor<'de> for RawKeyVisitor {
            type Value = RawKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(KEY_EXPECTED)
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<RawKey, E> {
                KeySourceVisitor.visit_str(name).map(RawKey::One)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawKey, A::Error> {
                KeySourceVisitor.visit_map(map).map(RawKey::One)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawKey, A::Error> {
                let mut sources = Vec::new();
                while let Some(source) = seq.next_element::<KeySource>()? {
                    sources.push(source);
                }
                match sources.len() {
                    0 => Err(de::Error::custom(format!(
                        "empty composite key: expected {KEY_EXPECTED}"
                    ))),
                    1 => Ok(RawKey::One(sources.remove(0))),
                    _ => Ok(RawKey::Composite(sources)),
                }
            }
        }

        deserializer.deserialize_any(RawKeyVisitor)
    }
}

/// A duration in its human form (`"30s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        units::parse_duration(&text)
            .map(HumanDuration)
            .map_err(de::Error::custom)
    }
}

/// A byte size: an integer or a string such as `"64KiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl<'de> Deserialize<'de> for HumanSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = HumanSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 16384 or \"64KiB\"")
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<HumanSize, E> {
                u64::try_from(bytes)
                    .map(HumanSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanSize, E> {
                units::parse_size(text).map(HumanSize).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// A rate in its human form (`"5/s"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HumanRate(pub Rate);

impl<'de> Deserialize<'de> for HumanRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        units::parse_rate(&text)
            .map(HumanRate)
            .map_err(de::Error::custom)
    }
}
