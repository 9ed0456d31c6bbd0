//! The fast way through a JSON log line: tollgate writes each access line as one flat object
//! of strings and numbers, so its fields can be found by scanning for quotes, with no escape
//! to decode. A line of any other shape (an escape, a nested value) is left to serde_json: this
//! reader only ever answers for lines it reads in full, and the tests hold it to serde_json's
//! answer on every line.

/// A member's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Value<'a> {
    /// A string's contents.
    Text(&'a str),
    /// A number, `true`, `false` or `null`, as written.
    Scalar(&'a str),
}

/// Calls `field` with each member of a flat object, in order. `None` when the line is not a
/// flat object without escapes (the caller then asks serde_json).
pub(super) fn fields<'a>(line: &'a str, mut field: impl FnMut(&'a str, Value<'a>)) -> Option<()> {
    let bytes = line.as_bytes();
    // No escape and no control character anywhere (in a string it would need an escape;
    // outside one, the line is not tollgate's). Then every quote delimits a string.
    if has_escape_or_control(bytes) {
        return None;
    }
    let mut quotes = Quotes::new(bytes);
    let mut at = skip_space(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_space(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return end(bytes, at + 1);
    }
    loop {
        let (name, after) = quotes.string(line, at)?;
        at = skip_space(bytes, after);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(bytes, at + 1);
        let (value, after) = match bytes.get(at)? {
            b'"' => {
                let (text, after) = quotes.string(line, at)?;
                (Value::Text(text), after)
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                let length = bytes[at..]
                    .iter()
                    .position(|byte| matches!(byte, b',' | b'}' | b' '))?;
                let text = &line[at..at + length];
                if !is_scalar(text) {
                    return None;
                }
                (Value::Scalar(text), at + length)
            }
            _ => return None,
        };
        field(name, value);
        at = skip_space(bytes, after);
        match bytes.get(at)? {
            b',' => at = skip_space(bytes, at + 1),
            b'}' => return end(bytes, at + 1),
            _ => return None,
        }
    }
}

/// The positions of a line's quotes, in order, found 64 bytes at a time: each block's quotes
/// become the bits of one word (`quote_bits`), then each quote is a trailing-zero count.
/// Eight bytes at a time, finding strings was a third of a replayed line's cost.
struct Quotes<'a> {
    bytes: &'a [u8],
    /// Where the block of `mask` starts.
    block: usize,
    /// The quotes of the block not yet given, one bit per byte.
    mask: u64,
}

impl<'a> Quotes<'a> {
    fn new(bytes: &'a [u8]) -> Quotes<'a> {
        Quotes {
            bytes,
            block: 0,
            mask: quote_bits(bytes),
        }
    }

    /// The string that opens at `at` (the next quote must be there) and where it ends.
    #[inline(always)]
    fn string<'l>(&mut self, line: &'l str, at: usize) -> Option<(&'l str, usize)> {
        let open = self.next()?;
        let close = self.next()?;
        (open == at).then(|| (&line[open + 1..close], close + 1))
    }

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        while self.mask == 0 {
            self.block += 64;
            if self.block >= self.bytes.len() {
                return None;
            }
            self.mask = quote_bits(&self.bytes[self.block..]);
        }
        let bit = self.mask.trailing_zeros() as usize;
        self.mask &= self.mask - 1;
        Some(self.block + bit)
    }
}

/// A bit for each quote among the first 64 bytes: eight words of eight bytes, each word's
/// quotes marked without a branch, then gathered into a byte by one multiplication.
fn quote_bits(bytes: &[u8]) -> u64 {
    const LOW_SEVEN: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // Moves bit 8i of a word to bit 56 + i: the top byte holds one bit per byte.
    const GATHER: u64 = 0x0102_0408_1020_4080;
    let block = match bytes.first_chunk::<64>() {
        Some(block) => *block,
        None => {
            let mut block = [0u8; 64];
            block[..bytes.len()].copy_from_slice(bytes);
            block
        }
    };
    let mut mask = 0u64;
    for (index, word) in block.chunks_exact(8).enumerate() {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Quotes become zero bytes; a zero byte is one whose low seven bits do not carry into
        // the eighth and whose eighth is clear (exact: no carry between bytes).
        let zeroed = word ^ 0x2222_2222_2222_2222;
        let high_bits = !(((zeroed & LOW_SEVEN) + LOW_SEVEN) | zeroed | LOW_SEVEN);
        mask |= ((high_bits >> 7).wrapping_mul(GATHER) >> 56) << (8 * index);
    }
    mask
}

/// Whether any byte is a backslash or below 0x20: a loop without a branch per byte, which the
/// compiler turns into vector instructions.
fn has_escape_or_control(bytes: &[u8]) -> bool {
    let mut found = 0u8;
    for chunk in bytes.chunks(64) {
        for byte in chunk {
            found |= u8::from(*byte < 0x20) | u8::from(*byte == b'\\');
        }
        if found != 0 {
            return true;
        }
    }
    false
}

/// Whether `text` is a JSON number (`-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`),
/// `true`, `false` or `null`.
fn is_scalar(text: &str) -> bool {
    if matches!(text, "true" | "false" | "null") {
        return true;
    }
    let mut rest = text.strip_prefix('-').unwrap_or(text).as_bytes();
    let digits = |rest: &mut &[u8]| {
        let count = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
        *rest = &rest[count..];
        count
    };
    let integer = rest;
    match digits(&mut rest) {
        0 => return false,
        1 => {}
        _ if integer[0] == b'0' => return false,
        _ => {}
    }
    if let Some(fraction) = rest.strip_prefix(b".") {
        rest = fraction;
        if digits(&mut rest) == 0 {
            return false;
        }
    }
    if let Some(exponent) = rest.strip_prefix(b"e").or_else(|| rest.strip_prefix(b"E")) {
        rest = exponent;
        rest = rest
            .strip_prefix(b"+")
            .or_else(|| rest.strip_prefix(b"-"))
            .unwrap_or(rest);
        if digits(&mut rest) == 0 {
            return false;
        }
    }
    rest.is_empty()
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at) == Some(&b' ') {
        at += 1;
    }
    at
}

/// Only white space may follow the object.
fn end(bytes: &[u8], at: usize) -> Option<()> {
    (skip_space(bytes, at) == bytes.len()).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What serde_json reads of a flat object of strings and scalars, spelled for comparison.
    fn by_serde(line: &str) -> Option<Vec<(String, String)>> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let mut found = value
            .as_object()?
            .iter()
            .map(|(name, value)| {
                let spelled = match value {
                    serde_json::Value::String(text) => format!("text {text}"),
                    serde_json::Value::Number(number) => format!("{:?}", number.as_f64()?),
                    serde_json::Value::Bool(flag) => flag.to_string(),
                    serde_json::Value::Null => "null".to_owned(),
                    _ => return None,
                };
                Some((name.clone(), spelled))
            })
            .collect::<Option<Vec<_>>>()?;
        found.sort();
        Some(found)
    }

    fn by_scan(line: &str) -> Option<Vec<(String, String)>> {
        let mut found = Vec::new();
        fields(line, |name, value| {
            let spelled = match value {
                Value::Text(text) => format!("text {text}"),
                Value::Scalar(number @ ("true" | "false" | "null")) => number.to_owned(),
                Value::Scalar(number) => format!("{:?}", number.parse::<f64>().unwrap()),
            };
            found.push((name.to_owned(), spelled));
        })?;
        found.sort();
        Some(found)
    }

    #[test]
    fn an_access_line_is_read_field_by_field() {
        let line = r#"{"timestamp":"2026-12-02T12:00:00Z","status":429,"keys":"a=b,c=d","ok":true,"none":null, "neg" : -1.5e3 }"#;
        let mut found = Vec::new();
        fields(line, |name, value| found.push((name, value))).unwrap();
        assert_eq!(
            found,
            [
                ("timestamp", Value::Text("2026-12-02T12:00:00Z")),
                ("status", Value::Scalar("429")),
                ("keys", Value::Text("a=b,c=d")),
                ("ok", Value::Scalar("true")),
                ("none", Value::Scalar("null")),
                ("neg", Value::Scalar("-1.5e3"))
            ]
        );
    }

    #[test]
    fn numbers_are_checked_as_json_spells_them() {
        for number in ["0", "-0", "12", "1.5", "-1.5e3", "2E+2", "3e-1", "0.0"] {
            assert!(is_scalar(number), "{number}");
            assert!(serde_json::from_str::<serde_json::Number>(number).is_ok());
        }
        for not_number in [
            "", "-", "01", "1.", ".5", "1e", "1e+", "+1", "0x1", "1.5.2", "nul",
        ] {
            assert!(!is_scalar(not_number), "{not_number}");
            assert!(serde_json::from_str::<serde_json::Value>(not_number).is_err());
        }
    }

    #[test]
    fn lines_of_another_shape_are_left_to_serde() {
        for line in [
            r#"{"path":"/a\"b"}"#,
            r#"{"path":"/a\\b"}"#,
            r#"{"nested":{"a":1}}"#,
            r#"{"list":[1]}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} trailing"#,
            r#"{"a":01}"#,
            r#"{"a":tru}"#,
            r#"{"a":"unterminated}"#,
            "{\"a\":\"tab\there\"}",
            r#"["a"]"#,
            "",
        ] {
            assert_eq!(fields(line, |_, _| {}), None, "{line}");
        }
    }

    proptest! {
        /// Every quote is found, in order, whatever the length and wherever the 64-byte blocks
        /// fall; and no other byte (bytes that differ from a quote in one bit included).
        #[test]
        fn quotes_are_found_where_a_byte_by_byte_search_finds_them(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'"'), Just(b'"' ^ 0x80), Just(b'"' ^ 1), any::<u8>()],
                0..300,
            ),
        ) {
            let mut quotes = Quotes::new(&bytes);
            let found: Vec<usize> = std::iter::from_fn(|| quotes.next()).collect();
            let expected: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, byte)| **byte == b'"')
                .map(|(at, _)| at)
                .collect();
            prop_assert_eq!(found, expected);
        }

        /// Wherever the scan answers, serde_json answers the same (and where serde_json reads
        /// a flat object without escapes, the scan answers).
        #[test]
        fn the_scan_agrees_with_serde_json(
            members in proptest::collection::vec(
                ("[a-z_]{1,8}", prop_oneof![
                    "[ -~]{0,12}".prop_map(|text| serde_json::to_string(&text).unwrap()),
                    "-?[0-9]{1,4}(\\.[0-9]{1,3})?".prop_map(|number| number),
                    Just("true".to_owned()),
                    Just("null".to_owned()),
                    Just("{\"x\":1}".to_owned()),
                ]),
                0..16,
            ),
            spaces in " ?",
        ) {
            let mut line = String::from("{");
            let mut names = std::collections::HashSet::new();
            for (index, (name, value)) in members.iter().enumerate() {
                if !names.insert(name.clone()) {
                    continue;
                }
                if index > 0 && line.len() > 1 {
                    line.push(',');
                }
                line.push_str(&format!("\"{name}\"{spaces}:{spaces}{value}"));
            }
            line.push('}');
            let scanned = by_scan(&line);
            let mut expected = by_serde(&line);
            if let Some(expected) = &mut expected {
                expected.sort();
            }
            match scanned {
                Some(scanned) => prop_assert_eq!(Some(scanned), expected, "{}", line),
                None => prop_assert!(
                    expected.is_none() || line.contains('\\'),
                    "the scan gave up on a plain line: {}", line
                ),
            }
        }
    }
}
