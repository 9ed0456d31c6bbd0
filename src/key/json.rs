//! Request bodies read as JSON, refusing objects that name a key twice or in two cases.

/// A request body read as JSON.
pub(super) enum JsonBody {
    Parsed(serde_json::Value),
    /// Not JSON (or no body): the field is missing.
    Unreadable,
    /// An object names a key twice, in the same case or another: a parser that keeps the
    /// first, or one that binds keys ignoring case (Go, ASP.NET), would read another value
    /// than the limit did.
    Ambiguous,
}

pub(super) const AMBIGUOUS_KEY: &str = "ambiguous key";

/// A JSON value whose objects name each key once, ignoring ASCII case.
pub(super) struct UnambiguousJson(pub(super) serde_json::Value);

impl<'de> serde::Deserialize<'de> for UnambiguousJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnambiguousVisitor)
    }
}

struct UnambiguousVisitor;

impl<'de> serde::de::Visitor<'de> for UnambiguousVisitor {
    type Value = UnambiguousJson;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_i64<E>(self, value: i64) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_str<E>(self, value: &str) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_string<E>(self, value: String) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(value.into()))
    }

    fn visit_unit<E>(self) -> Result<UnambiguousJson, E> {
        Ok(UnambiguousJson(serde_json::Value::Null))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut items: A,
    ) -> Result<UnambiguousJson, A::Error> {
        let mut values = Vec::new();
        while let Some(UnambiguousJson(value)) = items.next_element()? {
            values.push(value);
        }
        Ok(UnambiguousJson(serde_json::Value::Array(values)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut entries: A,
    ) -> Result<UnambiguousJson, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if object.keys().any(|seen| seen.eq_ignore_ascii_case(&key)) {
                return Err(serde::de::Error::custom(AMBIGUOUS_KEY));
            }
            let UnambiguousJson(value) = entries.next_value()?;
            object.insert(key, value);
        }
        Ok(UnambiguousJson(serde_json::Value::Object(object)))
    }
}
