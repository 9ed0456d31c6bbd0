//! Extracting each limit's key from a request.
//!
//! Network keys are kept in clear (`v6:2001:db8:1:2::/64`); every value that comes from the
//! request itself (header, query, cookie, body field) is reduced to a keyed hash before it
//! goes anywhere near a store, so no email or token is ever stored in clear.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

mod carried;
mod hasher;
mod json;

use crate::config::costs::{Field, ReadCost};
use crate::config::{KeySource, Limit, Missing, Normalize, Tier, TierSource};
use crate::geoip::{self, Country, Origin};
use crate::limit::{KeyPart, KeyParts};
use crate::settle::{self, Reading};
pub use carried::carried_tier;
pub use hasher::KeyHasher;
#[cfg(test)]
use hasher::REMEMBERED;
use json::{JsonBody, UnambiguousJson, AMBIGUOUS_KEY};

/// What the key extraction reads from one request. Bodies are parsed at most once.
pub struct RequestFacts<'a> {
    pub client: IpAddr,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    /// The buffered body, for routes whose limits read it.
    pub body: Option<&'a [u8]>,
    /// The claims of the request's verified token, for routes whose limits read them.
    pub claims: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// What `[geoip]` says of the client, for limits keyed by or exempting it.
    pub origin: Origin,
    /// The JA4 fingerprint of the connection's TLS ClientHello (or the asking proxy's).
    pub ja4: Option<&'a str>,
    json: OnceCell<JsonBody>,
    form: OnceCell<Vec<(String, String)>>,
}

impl<'a> RequestFacts<'a> {
    pub fn new(
        client: IpAddr,
        headers: &'a HeaderMap,
        query: Option<&'a str>,
        body: Option<&'a [u8]>,
    ) -> RequestFacts<'a> {
        RequestFacts {
            client,
            headers,
            query,
            body,
            claims: None,
            origin: Origin::default(),
            ja4: None,
            json: OnceCell::new(),
            form: OnceCell::new(),
        }
    }

    /// The same facts, with the claims of a verified token.
    pub fn with_claims(
        self,
        claims: Option<&'a serde_json::Map<String, serde_json::Value>>,
    ) -> RequestFacts<'a> {
        RequestFacts { claims, ..self }
    }

    /// The same facts, with the client's origin and the connection's TLS fingerprint.
    pub fn with_client(self, origin: Origin, ja4: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts {
            origin,
            ja4,
            ..self
        }
    }

    fn json(&self) -> &JsonBody {
        self.json.get_or_init(|| match self.body {
            None => JsonBody::Unreadable,
            Some(body) => match serde_json::from_slice::<UnambiguousJson>(body) {
                Ok(UnambiguousJson(value)) => JsonBody::Parsed(value),
                Err(error) if error.to_string().starts_with(AMBIGUOUS_KEY) => JsonBody::Ambiguous,
                Err(_) => JsonBody::Unreadable,
            },
        })
    }

    fn form(&self) -> &[(String, String)] {
        self.form.get_or_init(|| {
            self.body
                .map(|body| form_urlencoded::parse(body).into_owned().collect())
                .unwrap_or_default()
        })
    }
}

/// Why a request cannot be keyed: answered 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("missing {what} required by limit {limit:?}")]
    Missing { limit: String, what: String },
    #[error("{what} appears several times with different values")]
    Ambiguous { what: String },
    /// The request says a key's value two ways, and the application may read the other one.
    #[error("{0}")]
    Unclear(String),
    /// A `missing = "reject"` limit keyed by a token's claim, and no verified token carries it:
    /// answered 401.
    #[error("no token with {what}, required by limit {limit:?}")]
    Unauthenticated { limit: String, what: String },
}

/// The key of `limit` for this request: `Ok(None)` when the limit does not apply to it
/// (exempt client, or missing key with `missing = "skip"`).
pub fn extract(
    limit: &Limit,
    facts: &RequestFacts<'_>,
    hasher: &KeyHasher,
) -> Result<Option<KeyParts>, KeyError> {
    if exempts(limit, facts.client, facts.origin) {
        return Ok(None);
    }
    let mut parts = KeyParts::new();
    for source in &limit.key {
        let part = match source {
            KeySource::Global => continue,
            KeySource::ClientNetwork => Some(KeyPart::Network(client_network(
                facts.client,
                limit.ipv4_prefix,
                limit.ipv6_prefix,
            ))),
            KeySource::ClientAsn => facts.origin.asn.map(KeyPart::Asn),
            KeySource::ClientCountry => facts.origin.country.map(KeyPart::Country),
            _ => value_of(source, facts)?.map(|value| {
                KeyPart::Digest(hasher.digest(normalize(&value, limit.normalize).as_bytes()))
            }),
        };
        match part {
            Some(part) => parts.push(part),
            None => {
                return match limit.missing {
                    Missing::Skip => Ok(None),
                    Missing::Reject if matches!(source, KeySource::JwtClaim(_)) => {
                        Err(KeyError::Unauthenticated {
                            limit: limit.name.to_string(),
                            what: describe(source),
                        })
                    }
                    Missing::Reject => Err(KeyError::Missing {
                        limit: limit.name.to_string(),
                        what: describe(source),
                    }),
                }
            }
        }
    }
    Ok(Some(parts))
}

/// Whether the client is one `limit` never applies to: its network, autonomous system or
/// country exempt.
pub fn exempts(limit: &Limit, client: IpAddr, origin: Origin) -> bool {
    limit.exempt.iter().any(|network| network.contains(&client))
        || origin
            .asn
            .is_some_and(|asn| limit.exempt_asns.contains(&asn))
        || origin
            .country
            .is_some_and(|country| limit.exempt_countries.contains(&country))
}

/// Why values an operator names are not a key of a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValuesError {
    #[error("a global limit has one bucket: name no key")]
    Global,
    #[error("name the key: {0}")]
    OneValue(String),
    #[error("name {count} key values, one per part, in order: {parts}")]
    Values { count: usize, parts: String },
    #[error("{0:?} is not an IP address")]
    Address(String),
    #[error("{0:?} is not an autonomous system number such as AS64500")]
    Asn(String),
    #[error("{0:?} is not a two-letter country code such as DE")]
    Country(String),
    #[error("an empty key value")]
    Empty,
}

/// The key `limit` gives the values an operator names (the admin API): one value per part of
/// the key, in order, normalized and hashed exactly as a request's would be; for
/// `client_network`, an address, masked as the limit masks it.
pub fn parts_of_values(
    limit: &Limit,
    values: &[&str],
    hasher: &KeyHasher,
) -> Result<KeyParts, ValuesError> {
    if values.len() != limit.key.len() {
        return Err(match limit.key.len() {
            0 => ValuesError::Global,
            1 => ValuesError::OneValue(describe(&limit.key[0])),
            count => ValuesError::Values {
                count,
                parts: limit
                    .key
                    .iter()
                    .map(describe)
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        });
    }
    let mut parts = KeyParts::new();
    for (source, value) in limit.key.iter().zip(values) {
        let value = value.trim();
        parts.push(match source {
            KeySource::ClientNetwork => {
                let address: IpAddr = value
                    .parse()
                    .map_err(|_| ValuesError::Address(value.to_owned()))?;
                KeyPart::Network(client_network(
                    address.to_canonical(),
                    limit.ipv4_prefix,
                    limit.ipv6_prefix,
                ))
            }
            KeySource::ClientAsn => KeyPart::Asn(
                geoip::parse_asn(value).ok_or_else(|| ValuesError::Asn(value.to_owned()))?,
            ),
            KeySource::ClientCountry => KeyPart::Country(
                Country::parse(value).ok_or_else(|| ValuesError::Country(value.to_owned()))?,
            ),
            _ if value.is_empty() => return Err(ValuesError::Empty),
            _ => KeyPart::Digest(hasher.digest(normalize(value, limit.normalize).as_bytes())),
        });
    }
    Ok(parts)
}

/// The network a client belongs to, with IPv4 and IPv6 masked to their own prefixes.
pub fn client_network(client: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpNet {
    let prefix = match client {
        IpAddr::V4(_) => ipv4_prefix,
        IpAddr::V6(_) => ipv6_prefix,
    };
    IpNet::new(client, prefix)
        .map(|network| network.trunc())
        .unwrap_or_else(|_| IpNet::from(client))
}

fn normalize(value: &str, normalize: Normalize) -> Cow<'_, str> {
    match normalize {
        Normalize::None => value.into(),
        // Surrounding spaces are no part of an account name: " Alice" is alice.
        Normalize::Lowercase => value.trim().to_lowercase().into(),
        Normalize::Email => value.trim().to_lowercase().into(),
    }
}

pub fn describe(source: &KeySource) -> String {
    match source {
        KeySource::ClientNetwork => "client network".to_owned(),
        KeySource::Global => "global".to_owned(),
        KeySource::Header(name) => format!("header {name:?}"),
        KeySource::Query(name) => format!("query parameter {name:?}"),
        KeySource::Cookie(name) => format!("cookie {name:?}"),
        KeySource::JsonField(path) => format!("JSON body field {path:?}"),
        KeySource::FormField(name) => format!("form field {name:?}"),
        KeySource::JwtClaim(path) => format!("JWT claim {path:?}"),
        KeySource::ClientAsn => "client autonomous system ([geoip] asn_db)".to_owned(),
        KeySource::ClientCountry => "client country ([geoip] country_db)".to_owned(),
        KeySource::TlsJa4 => "TLS fingerprint (JA4)".to_owned(),
    }
}

/// A header's value: repeated fields are one list, their values joined with commas.
#[inline]
fn header_value<'f>(facts: &'f RequestFacts<'_>, name: &http::HeaderName) -> Option<Cow<'f, str>> {
    let mut values = facts
        .headers
        .get_all(name)
        .iter()
        .map(|value| match value.to_str() {
            // Visible ASCII and tabs, the usual value: Unicode's trim is ASCII's here.
            Ok(text) => Cow::Borrowed(text.trim_ascii()),
            Err(_) => trimmed(String::from_utf8_lossy(value.as_bytes())),
        })
        .filter(|value| !value.is_empty());
    values.next().map(|first| match values.next() {
        None => first,
        Some(second) => {
            let mut joined = first.into_owned();
            for value in std::iter::once(second).chain(values) {
                joined.push(',');
                joined.push_str(&value);
            }
            Cow::Owned(joined)
        }
    })
}

/// A query parameter's one value (named twice, the key is unclear).
fn query_value(
    source: &KeySource,
    facts: &RequestFacts<'_>,
    name: &str,
) -> Result<Option<String>, KeyError> {
    let pairs = facts
        .query
        .map(|query| {
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let values = pairs
        .iter()
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.as_str());
    Ok(single_value(source, values)?.map(str::to_owned))
}

/// A form field's one value. A field the query string names too is unclear: some frameworks
/// read the query's first (Servlet getParameter), so the limit and the application could
/// disagree.
fn form_value<'f>(
    source: &KeySource,
    facts: &'f RequestFacts<'_>,
    name: &str,
) -> Result<Option<Cow<'f, str>>, KeyError> {
    let in_query = facts
        .query
        .is_some_and(|query| form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == name));
    if in_query {
        return Err(KeyError::Unclear(format!(
            "{} is also in the query string",
            describe(source)
        )));
    }
    let values = facts
        .form()
        .iter()
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.as_str());
    Ok(single_value(source, values)?.map(Cow::Borrowed))
}

/// The value a source names in this request; empty values count as missing. Borrowed from
/// the request where it can be (a header or cookie sent once, the usual case).
fn value_of<'f>(
    source: &KeySource,
    facts: &'f RequestFacts<'_>,
) -> Result<Option<Cow<'f, str>>, KeyError> {
    let value = match source {
        KeySource::ClientNetwork
        | KeySource::Global
        | KeySource::ClientAsn
        | KeySource::ClientCountry => None,
        KeySource::TlsJa4 => facts.ja4.map(Cow::Borrowed),
        KeySource::Header(name) => header_value(facts, name),
        KeySource::Query(name) => query_value(source, facts, name)?.map(Cow::Owned),
        KeySource::Cookie(name) => {
            let cookies = facts
                .headers
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .flat_map(|line| line.split(';'))
                .filter_map(|pair| pair.trim().split_once('='))
                .filter(|(key, _)| key.trim() == name)
                .map(|(_, value)| value.trim().trim_matches('"'));
            single_value(source, cookies)?.map(Cow::Borrowed)
        }
        KeySource::FormField(name) => form_value(source, facts, name)?,
        KeySource::JwtClaim(path) => facts.claims.and_then(|claims| scalar_at(claims, path)),
        KeySource::JsonField(path) => match facts.json() {
            JsonBody::Parsed(serde_json::Value::Object(json)) => scalar_at(json, path),
            JsonBody::Parsed(_) => None,
            JsonBody::Unreadable => None,
            JsonBody::Ambiguous => {
                return Err(KeyError::Unclear(
                    "the JSON body names a key twice, or in two cases".to_owned(),
                ))
            }
        },
    };
    Ok(value.filter(|value| !value.trim().is_empty()))
}

fn trimmed(value: Cow<'_, str>) -> Cow<'_, str> {
    match value {
        Cow::Borrowed(text) => Cow::Borrowed(text.trim()),
        Cow::Owned(text) => Cow::Owned(text.trim().to_owned()),
    }
}

/// One value, even if repeated; different values would let the limit count one and the
/// application use another.
fn single_value<'v>(
    source: &KeySource,
    mut values: impl Iterator<Item = &'v str>,
) -> Result<Option<&'v str>, KeyError> {
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.any(|other| other != first) {
        return Err(KeyError::Ambiguous {
            what: describe(source),
        });
    }
    Ok(Some(first))
}

/// The value at a dotted path (`user.email`, `org.id`) of a JSON object.
fn value_at<'j>(
    object: &'j serde_json::Map<String, serde_json::Value>,
    path: &str,
) -> Option<&'j serde_json::Value> {
    let mut segments = path.split('.');
    let mut current = object.get(segments.next()?)?;
    for segment in segments {
        current = current.as_object()?.get(segment)?;
    }
    Some(current)
}

/// Follows a dotted path (`user.email`, `org.id`) from a JSON object to a scalar: a string as
/// it is, a number or a boolean as JSON writes it.
fn scalar_at<'j>(
    object: &'j serde_json::Map<String, serde_json::Value>,
    path: &str,
) -> Option<Cow<'j, str>> {
    match value_at(object, path)? {
        serde_json::Value::String(text) => Some(Cow::Borrowed(text)),
        serde_json::Value::Number(number) => Some(Cow::Owned(number.to_string())),
        serde_json::Value::Bool(flag) => Some(Cow::Owned(flag.to_string())),
        _ => None,
    }
}

/// What a request reserves of a cost it names (`cost = { json | header, default, max }`):
/// its value when that is one non-negative number, else the default; never above `max`.
pub fn read_cost(read: &ReadCost, facts: &RequestFacts<'_>) -> f64 {
    let reading = match &read.field {
        Field::Json(path) => match facts.json() {
            JsonBody::Parsed(serde_json::Value::Object(json)) => value_at(json, path)
                .and_then(serde_json::Value::as_f64)
                .map_or(Reading::Absent, Reading::of),
            _ => Reading::Absent,
        },
        Field::Header(name) => sent_once(facts.headers, name).map_or(Reading::Absent, |value| {
            settle::parse_number(value.as_bytes())
        }),
    };
    reading
        .number()
        .map_or(read.default, |value| value.min(read.max))
}

/// The tier this request is decided with: the entry of the limit's `tiers` that its tier value
/// names, or `None` (the limit's own numbers) for any other value, or none.
pub fn tier<'l>(limit: &'l Limit, facts: &RequestFacts<'_>) -> Option<&'l Tier> {
    let value: Cow<'_, str> = match limit.tier.as_ref()? {
        TierSource::JwtClaim(path) => scalar_at(facts.claims?, path)?,
        // Sent twice, the tier is unclear: the limit's own numbers apply.
        TierSource::Header(name) => {
            Cow::Borrowed(sent_once(facts.headers, name)?.to_str().ok()?.trim())
        }
    };
    limit
        .tiers
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, tier)| tier)
}

/// A header's value when the request sends it exactly once: a number or a tier sent twice
/// is unclear, and the limit's own applies.
fn sent_once<'h>(
    headers: &'h http::HeaderMap,
    name: &http::HeaderName,
) -> Option<&'h http::HeaderValue> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => Some(value),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
