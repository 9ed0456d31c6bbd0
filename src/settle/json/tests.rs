use std::fmt;

use proptest::prelude::*;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::*;

fn read(document: &str, path: &str) -> Reading {
    number_in(document.as_bytes(), &JsonPath::new(path))
}

#[test]
fn a_number_is_read_where_the_path_ends_and_nowhere_else() {
    let document = r#"{"id":"x","choices":[{"usage":{"total_tokens":1}}],"usage":{"prompt_tokens":9,"total_tokens":153.5}}"#;
    assert_eq!(read(document, "usage.total_tokens"), Reading::Number(153.5));
    assert_eq!(read(document, "usage"), Reading::Invalid, "an object");
    assert_eq!(read(document, "usage.missing"), Reading::Absent);
    assert_eq!(read(document, "id.total_tokens"), Reading::Absent);
    assert_eq!(
        read(r#"{"usage":null}"#, "usage.total_tokens"),
        Reading::Absent
    );
    assert_eq!(read(r#"{"n":null}"#, "n"), Reading::Absent);
    assert_eq!(read(r#" {"n" : 7 } "#, "n"), Reading::Number(7.0));
    assert_eq!(
        read(r#"{"\u006e":7}"#, "n"),
        Reading::Number(7.0),
        "escaped key"
    );
    assert_eq!(read(r#"{"\ud83d\ude00":7}"#, "😀"), Reading::Number(7.0));
}

#[test]
fn what_is_not_json_or_not_one_number_is_invalid() {
    let cases = [
        r#"{"n":"7"}"#,
        r#"{"n":-1}"#,
        r#"{"n":1e400}"#,
        r#"{"n":[7]}"#,
        r#"{"n":7,"n":7}"#,
        r#"{"n":07}"#,
        r#"{"n":7.}"#,
        r#"{"n":.5}"#,
        r#"{"n":7e}"#,
        r#"{"n":7} x"#,
        r#"{"n":7"#,
        r#"{"n":7,}"#,
        r#"{"a":"tab	inside","n":7}"#,
        r#"{"a":"\x","n":7}"#,
        r#"{"a":"\u12","n":7}"#,
        r#"{"\ud800":1,"n":7}"#,
        r#"{"a":tru,"n":7}"#,
        "",
    ];
    for document in cases {
        assert_eq!(read(document, "n"), Reading::Invalid, "{document:?}");
    }
}

#[test]
fn deep_nesting_is_refused_without_exhausting_the_stack() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(read(&deep, "n"), Reading::Invalid);
    let fits = format!(r#"{{"a":{}0{},"n":3}}"#, "[".repeat(100), "]".repeat(100));
    assert_eq!(read(&fits, "n"), Reading::Number(3.0));
}

#[test]
fn frames_split_anywhere_read_as_the_whole() {
    let document = br#"{"a":"x\"y\u00e9","b":[1,-2.5e3,true,null],"usage":{"total_tokens":42}}"#;
    let path = JsonPath::new("usage.total_tokens");
    for at in 0..=document.len() {
        let frames = [
            Bytes::copy_from_slice(&document[..at]),
            Bytes::new(),
            Bytes::copy_from_slice(&document[at..]),
        ];
        assert_eq!(
            number_at(&frames, &path),
            Reading::Number(42.0),
            "split at {at}"
        );
    }
}

#[test]
fn keys_on_the_path_are_read_as_serde_json_reads_them_in_place_or_not() {
    let documents: [&[u8]; 7] = [
        b"{\"us\xffge\":1,\"n\":7}",
        b"{\"caf\xc3\xa9\":1,\"n\":7}",
        b"{\"a\tb\":1,\"n\":7}",
        b"{\"usage\":{\"n\":7}}",
        b"{\"usag\":1,\"usagee\":2,\"usage\":{\"n\":7}}",
        b"{\"\":{},\"usage\":{\"n\":7}}",
        b"{\"usage\":{\"n\":7},\"us\\u0061ge\":{}}",
    ];
    for document in documents {
        for path in ["n", "usage.n"] {
            let path_read = JsonPath::new(path);
            assert_eq!(
                number_in(document, &path_read),
                oracle(document, path),
                "{} at {path}",
                String::from_utf8_lossy(document)
            );
        }
    }
    // A control character in a key, a key not UTF-8: no JSON, whatever the path.
    assert_eq!(read("{\"a\tb\":1,\"n\":7}", "n"), Reading::Invalid);
    assert_eq!(
        number_in(b"{\"\xff\":1,\"n\":7}", &JsonPath::new("n")),
        Reading::Invalid
    );
}

/// A JSON-ish document: valid JSON from the generator, sometimes broken by a mutation.
fn documents() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec!["usage", "total_tokens", "n", "us\\u0061ge", "a", ""]);
    let scalar = prop::sample::select(vec![
        "0",
        "-0",
        "7",
        "-1",
        "12.5",
        "1e3",
        "2E-2",
        "1e400",
        "9007199254740993",
        "123456789012345678901234567890",
        "true",
        "false",
        "null",
        "\"\"",
        "\"usage\"",
        "\"a\\\"b\\\\\"",
        "\"\\u00e9\\n\"",
        "\"é😀\"",
    ])
    .prop_map(str::to_owned);
    let value = scalar.prop_recursive(4, 32, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
            prop::collection::vec((key.clone(), inner, " ?"), 0..4).prop_map(|entries| {
                let entries: Vec<String> = entries
                    .into_iter()
                    .map(|(key, value, space)| format!("\"{key}\"{space}:{space}{value}"))
                    .collect();
                format!("{{{}}}", entries.join(","))
            }),
        ]
    });
    let mutation = prop::option::weighted(
        0.3,
        (
            any::<prop::sample::Index>(),
            prop::option::of(prop::sample::select(
                "{}[],:\"\\ 07-.eEtrunl\n".chars().collect::<Vec<_>>(),
            )),
        ),
    );
    (value, mutation).prop_map(|(document, mutation)| {
        let Some((at, insert)) = mutation else {
            return document;
        };
        let mut chars: Vec<char> = document.chars().collect();
        let at = at.index(chars.len() + 1);
        match insert {
            Some(character) => chars.insert(at, character),
            None if at < chars.len() => _ = chars.remove(at),
            None => {}
        }
        chars.into_iter().collect()
    })
}

proptest! {
    #[test]
    fn reads_as_serde_json_reads(
        document in documents(),
        path in prop::sample::select(vec!["usage.total_tokens", "usage", "n", "a.n", "total_tokens"]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let expected = oracle(document.as_bytes(), path);
        let path = JsonPath::new(path);
        prop_assert_eq!(number_in(document.as_bytes(), &path), expected);
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(document.len() + 1)).collect();
        cuts.sort_unstable();
        let mut frames = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([document.len()]) {
            frames.push(Bytes::copy_from_slice(&document.as_bytes()[from..cut]));
            from = cut;
        }
        prop_assert_eq!(number_at(&frames, &path), expected);
    }
}

/// The same reading by serde_json's parser: the reference the walker is held to.
fn oracle(bytes: &[u8], path: &str) -> Reading {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    AtPath(&segments)
        .deserialize(&mut deserializer)
        .and_then(|reading| deserializer.end().map(|_| reading))
        .unwrap_or(Reading::Invalid)
}

struct AtPath<'p>(&'p [String]);

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
        Ok(self.scalar(Reading::Absent))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Reading, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.scalar(Reading::Invalid))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Reading, A::Error> {
        let Some((segment, rest)) = self.0.split_first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Reading::Invalid);
        };
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != *segment {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let reading = map.next_value_seed(AtPath(rest))?;
            found = Some(match found {
                None => reading,
                Some(_) => Reading::Invalid,
            });
        }
        Ok(found.unwrap_or(Reading::Absent))
    }
}

impl AtPath<'_> {
    fn scalar(&self, reading: Reading) -> Reading {
        if self.0.is_empty() {
            reading
        } else {
            Reading::Absent
        }
    }
}
