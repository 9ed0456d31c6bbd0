//! `[limits.NAME]` as written: what a limit counts, its key, tiers, ban and refusal.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::{
    HeaderMode, HumanDuration, HumanRate, Missing, Mode, Normalize, OnLimit, RawAdaptive, RawAsn,
    RawKey,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub key: Spanned<RawKey>,
    pub normalize: Option<Normalize>,
    pub missing: Option<Missing>,
    /// A token bucket: `capacity` and `rate`; or a calendar quota: `quota` and `period`.
    /// Each a number, or one the request carries.
    pub capacity: Option<Spanned<RawNumber<f64>>>,
    pub rate: Option<Spanned<RawNumber<HumanRate>>>,
    pub quota: Option<Spanned<RawNumber<f64>>>,
    pub period: Option<Spanned<crate::limit::calendar::Period>>,
    /// A concurrency limit: at most this many requests of a key in flight.
    pub concurrency: Option<Spanned<i64>>,
    /// What a request that finds too few tokens gets: refused, or held until they come.
    pub on_limit: Option<Spanned<OnLimit>>,
    pub max_delay: Option<Spanned<HumanDuration>>,
    /// Token leases: each replica takes up to `rate × lease` tokens per store call.
    pub lease: Option<Spanned<HumanDuration>>,
    pub timezone: Option<Spanned<String>>,
    pub mode: Option<Mode>,
    pub exempt: Option<Spanned<Vec<String>>>,
    /// Autonomous systems and countries (`[geoip]`) this limit never applies to.
    pub exempt_asns: Option<Spanned<Vec<RawAsn>>>,
    pub exempt_countries: Option<Spanned<Vec<String>>>,
    pub ipv4_prefix: Option<Spanned<i64>>,
    pub ipv6_prefix: Option<Spanned<i64>>,
    pub adaptive: Option<Spanned<RawAdaptive>>,
    pub charge_on_status: Option<Spanned<BTreeMap<String, f64>>>,
    pub tier: Option<Spanned<RawTierSource>>,
    /// Accept a tier from a header, which only a proxy in front may set.
    pub trust_header: Option<bool>,
    pub tiers: Option<Spanned<BTreeMap<String, RawTier>>>,
    /// `[limits.NAME.ban]`: a key refused often is refused entirely for a while.
    pub ban: Option<Spanned<RawBan>>,
    /// `[limits.NAME.refusal]`: how this limit's refusals are answered.
    pub refusal: Option<Spanned<RawRefusal>>,
}

/// `[limits.NAME.refusal]`: the status, headers and body of this limit's refusals.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRefusal {
    pub status: Option<Spanned<i64>>,
    pub headers: Option<HeaderMode>,
    pub retry_after: Option<bool>,
    pub body_file: Option<Spanned<String>>,
    pub content_type: Option<Spanned<String>>,
}

/// `[limits.NAME.ban]`: `after` refusals within `within` ban the key for `duration`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBan {
    pub after: Spanned<i64>,
    pub within: Spanned<HumanDuration>,
    pub duration: Spanned<HumanDuration>,
}

/// `tier = { jwt_claim = "plan" }` or `tier = { header = "x-plan" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTierSource {
    pub jwt_claim: Option<String>,
    pub header: Option<String>,
}

/// An entry of `[limits.X.tiers]`: `"exempt"`, or the numbers that replace the limit's own.
#[derive(Debug)]
pub enum RawTier {
    Exempt,
    Numbers {
        capacity: Option<f64>,
        rate: Option<HumanRate>,
        quota: Option<f64>,
    },
}

impl<'de> Deserialize<'de> for RawTier {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Numbers {
            capacity: Option<f64>,
            rate: Option<HumanRate>,
            quota: Option<f64>,
        }

        struct TierVisitor;

        impl<'de> Visitor<'de> for TierVisitor {
            type Value = RawTier;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"exempt\" or a table such as { capacity = 1000, rate = \"100/s\" }")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawTier, E> {
                match text {
                    "exempt" => Ok(RawTier::Exempt),
                    other => Err(E::custom(format!(
                        "{other:?}: expected \"exempt\" or a table such as {{ capacity = 1000, rate = \"100/s\" }}"
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawTier, A::Error> {
                let numbers = Numbers::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawTier::Numbers {
                    capacity: numbers.capacity,
                    rate: numbers.rate,
                    quota: numbers.quota,
                })
            }
        }

        deserializer.deserialize_any(TierVisitor)
    }
}

/// A limit's number: written in the policy (`capacity = 100`), or carried by the request
/// (`capacity = { jwt_claim = "rl.capacity", default = 100, max = 10000 }`).
#[derive(Debug, Clone, PartialEq)]
pub enum RawNumber<T> {
    Fixed(T),
    Carried(RawCarried<T>),
}

/// A number the request carries: one of `jwt_claim` and `header` (with `trust_header`), the
/// `default` when it carries none, and the `max` it may ask for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCarried<T> {
    pub jwt_claim: Option<String>,
    pub header: Option<String>,
    pub trust_header: Option<bool>,
    pub default: Option<T>,
    pub max: Option<T>,
}

impl<T: Clone> RawNumber<T> {
    /// The number the limit is known by: as written, or the default of one the request
    /// carries.
    pub fn value(&self) -> Option<T> {
        match self {
            RawNumber::Fixed(value) => Some(value.clone()),
            RawNumber::Carried(carried) => carried.default.clone(),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for RawNumber<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(deserializer)? {
            toml::Value::Table(table) => RawCarried::deserialize(table)
                .map(RawNumber::Carried)
                .map_err(de::Error::custom),
            value => T::deserialize(value)
                .map(RawNumber::Fixed)
                .map_err(de::Error::custom),
        }
    }
}
