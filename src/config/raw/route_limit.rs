//! An entry of a route's `limits` as written: `"name"`, or a table with what the route
//! charges the limit — a fixed `cost` or one read from the request — and how the charge is
//! `settle`d after the response.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// `"name"` or `{ limit = "name", cost = …, settle = …, scale = … }`.
#[derive(Debug)]
pub struct RawRouteLimit {
    pub limit: String,
    pub cost: Option<RawCost>,
    pub settle: Option<RawSettle>,
    pub scale: Option<f64>,
}

/// `cost = 10`, or `cost = { json = "max_tokens", default = 256, max = 8192 }`.
#[derive(Debug, Clone, PartialEq)]
pub enum RawCost {
    Fixed(f64),
    Read(RawReadCost),
}

/// A cost read from the request: one of `json` and `header`, with its `default` and `max`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReadCost {
    pub json: Option<String>,
    pub header: Option<String>,
    pub default: Option<f64>,
    pub max: Option<f64>,
}

/// `settle = "upstream_ms"` (or another measure by name), or a field of the response.
#[derive(Debug, Clone, PartialEq)]
pub enum RawSettle {
    Measure(String),
    Field(RawSettleField),
}

/// `{ json = "usage.total_tokens" }` or `{ header = "x-tokens" }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettleField {
    pub json: Option<String>,
    pub header: Option<String>,
}

impl<'de> Deserialize<'de> for RawRouteLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            limit: String,
            cost: Option<RawCost>,
            settle: Option<RawSettle>,
            scale: Option<f64>,
        }

        struct RouteLimitVisitor;

        impl<'de> Visitor<'de> for RouteLimitVisitor {
            type Value = RawRouteLimit;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a limit name or a table { limit = \"name\", cost = N }")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<RawRouteLimit, E> {
                Ok(RawRouteLimit {
                    limit: name.to_owned(),
                    cost: None,
                    settle: None,
                    scale: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRouteLimit, A::Error> {
                let entry = Entry::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawRouteLimit {
                    limit: entry.limit,
                    cost: entry.cost,
                    settle: entry.settle,
                    scale: entry.scale,
                })
            }
        }

        deserializer.deserialize_any(RouteLimitVisitor)
    }
}

impl<'de> Deserialize<'de> for RawCost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;

        impl<'de> Visitor<'de> for CostVisitor {
            type Value = RawCost;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a number, or a table { json = \"field\" } or { header = \"name\" } with default and max",
                )
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawCost, E> {
                Ok(RawCost::Fixed(value as f64))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawCost, E> {
                Ok(RawCost::Fixed(value as f64))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<RawCost, E> {
                Ok(RawCost::Fixed(value))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawCost, A::Error> {
                RawReadCost::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawCost::Read)
            }
        }

        deserializer.deserialize_any(CostVisitor)
    }
}

impl<'de> Deserialize<'de> for RawSettle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SettleVisitor;

        impl<'de> Visitor<'de> for SettleVisitor {
            type Value = RawSettle;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "\"upstream_ms\", \"response_bytes\", or a table { json = \"field\" } or { header = \"name\" }",
                )
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<RawSettle, E> {
                Ok(RawSettle::Measure(name.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSettle, A::Error> {
                RawSettleField::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawSettle::Field)
            }
        }

        deserializer.deserialize_any(SettleVisitor)
    }
}
