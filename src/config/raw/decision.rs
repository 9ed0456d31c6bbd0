//! `[decision]`: the listener other proxies ask, and its gRPC descriptor rules, as written.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::StoreFailurePolicy;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDecision {
    pub listen: Option<Spanned<String>>,
    pub allow: Option<Spanned<Vec<String>>>,
    pub refuse_status: Option<Spanned<i64>>,
    #[serde(default)]
    pub descriptors: Vec<Spanned<RawDescriptorRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptorRule {
    pub domain: Spanned<String>,
    pub entries: Spanned<Vec<RawDescriptorEntry>>,
    pub limit: Spanned<String>,
    pub on_store_failure: Option<StoreFailurePolicy>,
}

/// An entry of a rule: `"key"` (its value is the bucket's key) or `{ key = "k", value = "v" }`
/// (a fixed value the descriptor must carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDescriptorEntry {
    pub key: String,
    pub value: Option<String>,
}

impl<'de> Deserialize<'de> for RawDescriptorEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fixed {
            key: String,
            value: String,
        }

        struct EntryVisitor;

        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = RawDescriptorEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a descriptor key such as \"remote_address\", or a table { key = \"generic_key\", value = \"login\" }")
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<RawDescriptorEntry, E> {
                Ok(RawDescriptorEntry {
                    key: key.to_owned(),
                    value: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawDescriptorEntry, A::Error> {
                let fixed = Fixed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawDescriptorEntry {
                    key: fixed.key,
                    value: Some(fixed.value),
                })
            }
        }

        deserializer.deserialize_any(EntryVisitor)
    }
}
