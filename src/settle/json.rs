//! A number at a dotted path of a JSON document, read in one pass that builds nothing of the
//! rest (every other value is skipped as it is parsed).

use std::fmt;
use std::io::Read;

use bytes::{Buf, Bytes};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::Reading;

/// The number at `path` (`usage.total_tokens`) of the JSON document in `frames`, read where
/// the frames are (one frame in place, several through a reader: never copied together).
pub fn number_at(frames: &[Bytes], path: &str) -> Reading {
    let segments: Vec<&str> = path.split('.').collect();
    let seed = AtPath(&segments);
    let parsed = match frames {
        [] => return Reading::Invalid,
        [frame] => return number_in(frame, path),
        frames => {
            let reader = Frames(frames.iter().map(|frame| frame.clone().reader()).collect());
            let mut deserializer = serde_json::Deserializer::from_reader(reader);
            seed.deserialize(&mut deserializer)
                .and_then(|reading| deserializer.end().map(|_| reading))
        }
    };
    // Not JSON, a number out of range, or the field named twice: unparseable.
    parsed.unwrap_or(Reading::Invalid)
}

/// The number at `path` of the JSON document `bytes`.
pub(super) fn number_in(bytes: &[u8], path: &str) -> Reading {
    let segments: Vec<&str> = path.split('.').collect();
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    AtPath(&segments)
        .deserialize(&mut deserializer)
        .and_then(|reading| deserializer.end().map(|_| reading))
        .unwrap_or(Reading::Invalid)
}

/// The frames one after another, as one reader.
struct Frames(Vec<bytes::buf::Reader<Bytes>>);

impl Read for Frames {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        for frame in &mut self.0 {
            let read = frame.read(buf)?;
            if read > 0 {
                return Ok(read);
            }
        }
        Ok(0)
    }
}

/// Looks for the rest of the path in the value it is given.
struct AtPath<'p>(&'p [&'p str]);

impl<'de> DeserializeSeed<'de> for AtPath<'_> {
    type Value = Reading;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Reading, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AtPath<'_> {
    type Value = Reading;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Reading, E> {
        Ok(self.scalar(Reading::of(value as f64)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Reading, E> {
        Ok(self.scalar(Reading::of(value as f64)))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Reading, E> {
        Ok(self.scalar(Reading::of(value)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Reading, E> {
        Ok(self.scalar(Reading::Invalid))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Reading, E> {
        Ok(self.scalar(Reading::Invalid))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Reading, E> {
        // `null` is how an event says it carries no value yet (`"usage": null`).
        Ok(self.scalar(Reading::Absent))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Reading, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.scalar(Reading::Invalid))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Reading, A::Error> {
        let Some((segment, rest)) = self.0.split_first() else {
            // The path ends at an object: not a number.
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Reading::Invalid);
        };
        let mut found = None;
        while let Some(matches) = map.next_key_seed(KeyIs(segment))? {
            if !matches {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let reading = map.next_value_seed(AtPath(rest))?;
            // Named twice, the field says two things: a reader that keeps the first and one
            // that keeps the last would settle differently.
            found = Some(match found {
                None => reading,
                Some(_) => Reading::Invalid,
            });
        }
        Ok(found.unwrap_or(Reading::Absent))
    }
}

impl AtPath<'_> {
    /// A scalar is the reading only where the path ends; above it, the path is absent.
    fn scalar(&self, reading: Reading) -> Reading {
        if self.0.is_empty() {
            reading
        } else {
            Reading::Absent
        }
    }
}

/// Whether an object's key is the path's segment, compared where the parser holds it.
struct KeyIs<'s>(&'s str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}
