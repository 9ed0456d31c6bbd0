//! A number at a dotted path of a JSON document, read in one pass over the frames where they
//! are: nothing of the rest is built, strings are skipped a vector at a time, and the
//! document must be JSON (RFC 8259) to the end for its number to count.

use bytes::Bytes;

use super::Reading;

/// How deep arrays and objects may nest: deeper is not read (and the stack stays small).
const MAX_DEPTH: usize = 128;

/// A dotted path into a JSON document (`usage.total_tokens`), split once.
#[derive(Debug, Clone)]
pub struct JsonPath {
    segments: std::sync::Arc<[String]>,
}

impl JsonPath {
    pub fn new(path: &str) -> JsonPath {
        JsonPath {
            segments: path.split('.').map(str::to_owned).collect(),
        }
    }

    /// The key a document must name to carry the path.
    pub fn first(&self) -> &str {
        self.segments.first().map_or("", String::as_str)
    }
}

/// The number at `path` of the JSON document in `frames`, read across them (never copied
/// together).
pub(super) fn number_at(frames: &[Bytes], path: &JsonPath) -> Reading {
    match frames.split_first() {
        None => Reading::Invalid,
        Some((first, rest)) => Document::new(first, rest).number_at(&path.segments),
    }
}

/// The number at `path` of the JSON document `bytes`.
pub(super) fn number_in(bytes: &[u8], path: &JsonPath) -> Reading {
    Document::new(bytes, &[]).number_at(&path.segments)
}

/// The document is not JSON.
struct Malformed;

type Parsed<T> = Result<T, Malformed>;

/// A document being read: the frame at hand and those after it.
struct Document<'a> {
    frame: &'a [u8],
    rest: &'a [Bytes],
    /// A key or number being compared or parsed (they may span frames).
    scratch: Vec<u8>,
    depth: usize,
}

impl<'a> Document<'a> {
    fn new(frame: &'a [u8], rest: &'a [Bytes]) -> Document<'a> {
        Document {
            frame,
            rest,
            scratch: Vec::new(),
            depth: 0,
        }
    }

    /// Not JSON, a number out of range, or the field named twice: unparseable.
    fn number_at(mut self, path: &[String]) -> Reading {
        let read = self.value(Some(path)).and_then(|reading| {
            self.skip_whitespace();
            match self.peek() {
                None => Ok(reading),
                Some(_) => Err(Malformed),
            }
        });
        read.unwrap_or(Reading::Invalid)
    }

    /// The next byte, moving on to the next frame when this one is spent.
    fn peek(&mut self) -> Option<u8> {
        loop {
            if let Some(&byte) = self.frame.first() {
                return Some(byte);
            }
            let (next, rest) = self.rest.split_first()?;
            self.frame = next;
            self.rest = rest;
        }
    }

    fn next(&mut self) -> Parsed<u8> {
        let byte = self.peek().ok_or(Malformed)?;
        self.frame = &self.frame[1..];
        Ok(byte)
    }

    fn expect(&mut self, byte: u8) -> Parsed<()> {
        if self.next()? == byte {
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.frame = &self.frame[1..];
        }
    }

    /// Reads a value: `path` is what is left of the path to follow into it (`None`: the value
    /// is skipped).
    fn value(&mut self, path: Option<&[String]>) -> Parsed<Reading> {
        self.skip_whitespace();
        let reading = match self.peek().ok_or(Malformed)? {
            b'{' => return self.nested(|document| document.object(path)),
            b'[' => self.nested(Document::array)?,
            b'"' => {
                self.frame = &self.frame[1..];
                self.string(false)?;
                Reading::Invalid
            }
            b't' => self.literal(b"true", Reading::Invalid)?,
            b'f' => self.literal(b"false", Reading::Invalid)?,
            // `null` is how an event says it carries no value yet (`"usage": null`).
            b'n' => self.literal(b"null", Reading::Absent)?,
            b'-' | b'0'..=b'9' => self.number(path.is_some())?,
            _ => return Err(Malformed),
        };
        // A scalar is the reading only where the path ends; above it, the path is absent.
        Ok(match path {
            Some([]) => reading,
            _ => Reading::Absent,
        })
    }

    fn nested(&mut self, read: impl FnOnce(&mut Self) -> Parsed<Reading>) -> Parsed<Reading> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Malformed);
        }
        let reading = read(self)?;
        self.depth -= 1;
        Ok(reading)
    }

    fn object(&mut self, path: Option<&[String]>) -> Parsed<Reading> {
        self.expect(b'{')?;
        let mut found = None;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.frame = &self.frame[1..];
        } else {
            loop {
                self.skip_whitespace();
                self.expect(b'"')?;
                let follows = match path {
                    Some([segment, rest @ ..]) => self.key_is(segment)?.then_some(rest),
                    _ => {
                        self.string(false)?;
                        None
                    }
                };
                self.skip_whitespace();
                self.expect(b':')?;
                match follows {
                    None => _ = self.value(None)?,
                    Some(rest) => {
                        let reading = self.value(Some(rest))?;
                        // Named twice, the field says two things: a reader that keeps the
                        // first and one that keeps the last would settle differently.
                        found = Some(match found {
                            None => reading,
                            Some(_) => Reading::Invalid,
                        });
                    }
                }
                self.skip_whitespace();
                match self.next()? {
                    b',' => continue,
                    b'}' => break,
                    _ => return Err(Malformed),
                }
            }
        }
        Ok(match path {
            // The path ends at an object: not a number.
            Some([]) => Reading::Invalid,
            _ => found.unwrap_or(Reading::Absent),
        })
    }

    fn array(&mut self) -> Parsed<Reading> {
        self.expect(b'[')?;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.frame = &self.frame[1..];
            return Ok(Reading::Invalid);
        }
        loop {
            self.value(None)?;
            self.skip_whitespace();
            match self.next()? {
                b',' => continue,
                b']' => return Ok(Reading::Invalid),
                _ => return Err(Malformed),
            }
        }
    }

    fn literal(&mut self, word: &[u8], reading: Reading) -> Parsed<Reading> {
        for &byte in word {
            self.expect(byte)?;
        }
        Ok(reading)
    }

    /// Skips a string whose opening quote was read; into `scratch` (escapes decoded) when
    /// `keep`.
    fn string(&mut self, keep: bool) -> Parsed<()> {
        loop {
            self.peek().ok_or(Malformed)?;
            let at = plain_run(self.frame);
            if keep {
                self.scratch.extend_from_slice(&self.frame[..at]);
            }
            let Some(&stop) = self.frame.get(at) else {
                self.frame = &[];
                continue;
            };
            self.frame = &self.frame[at + 1..];
            match stop {
                b'"' => return Ok(()),
                b'\\' => self.escape(keep)?,
                // A control character, which a string must escape.
                _ => return Err(Malformed),
            }
        }
    }

    /// An escape after its backslash.
    fn escape(&mut self, keep: bool) -> Parsed<()> {
        let decoded = match self.next()? {
            byte @ (b'"' | b'\\' | b'/') => byte,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let unit = self.hex4()?;
                if keep {
                    let character = self.unicode(unit)?;
                    let mut buffer = [0; 4];
                    self.scratch
                        .extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
                }
                return Ok(());
            }
            _ => return Err(Malformed),
        };
        if keep {
            self.scratch.push(decoded);
        }
        Ok(())
    }

    /// The character a `\u` escape names, reading the low half of a surrogate pair.
    fn unicode(&mut self, unit: u16) -> Parsed<char> {
        let code = match unit {
            0xD800..=0xDBFF => {
                self.expect(b'\\')?;
                self.expect(b'u')?;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(Malformed);
                }
                0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00)
            }
            unit => u32::from(unit),
        };
        char::from_u32(code).ok_or(Malformed)
    }

    fn hex4(&mut self) -> Parsed<u16> {
        let mut unit = 0u16;
        for _ in 0..4 {
            let digit = (self.next()? as char).to_digit(16).ok_or(Malformed)?;
            unit = unit << 4 | digit as u16;
        }
        Ok(unit)
    }

    /// Whether an object's key (its opening quote read) is `segment`, escapes decoded.
    fn key_is(&mut self, segment: &str) -> Parsed<bool> {
        // Nearly every key is plain and lies within the frame: compared where it is.
        let at = plain_run(self.frame);
        if self.frame.get(at) == Some(&b'"') {
            let key = &self.frame[..at];
            self.frame = &self.frame[at + 1..];
            if key == segment.as_bytes() {
                return Ok(true);
            }
            // As an escaped key is: one that is not UTF-8 is no JSON.
            if !key.is_ascii() && std::str::from_utf8(key).is_err() {
                return Err(Malformed);
            }
            return Ok(false);
        }
        self.scratch.clear();
        self.string(true)?;
        std::str::from_utf8(&self.scratch).map_err(|_| Malformed)?;
        Ok(self.scratch == segment.as_bytes())
    }

    /// A number, checked against JSON's grammar; parsed only when `wanted`.
    fn number(&mut self, wanted: bool) -> Parsed<Reading> {
        self.scratch.clear();
        if self.peek() == Some(b'-') {
            self.take(wanted);
        }
        match self.peek() {
            Some(b'0') => self.take(wanted),
            Some(b'1'..=b'9') => _ = self.digits(wanted),
            _ => return Err(Malformed),
        }
        if self.peek() == Some(b'.') {
            self.take(wanted);
            if self.digits(wanted) == 0 {
                return Err(Malformed);
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.take(wanted);
            if let Some(b'+' | b'-') = self.peek() {
                self.take(wanted);
            }
            if self.digits(wanted) == 0 {
                return Err(Malformed);
            }
        }
        if !wanted {
            return Ok(Reading::Invalid);
        }
        let text = std::str::from_utf8(&self.scratch).map_err(|_| Malformed)?;
        let value: f64 = text.parse().map_err(|_| Malformed)?;
        // Beyond a double's range is no number a reader could hold.
        if value.is_infinite() {
            return Err(Malformed);
        }
        Ok(Reading::of(value))
    }

    /// Moves past the byte at hand (peeked), keeping it when `kept`.
    fn take(&mut self, kept: bool) {
        if kept {
            self.scratch.push(self.frame[0]);
        }
        self.frame = &self.frame[1..];
    }

    /// Moves past decimal digits; how many.
    fn digits(&mut self, kept: bool) -> usize {
        let mut count = 0;
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.take(kept);
            count += 1;
        }
        count
    }
}

/// How many bytes at the start of `bytes` a string holds as they are: up to its closing quote,
/// an escape or a control character (which a string must escape).
fn plain_run(bytes: &[u8]) -> usize {
    let end = memchr::memchr2(b'"', b'\\', bytes).unwrap_or(bytes.len());
    let run = &bytes[..end];
    // The least byte is found a vector at a time (no early exit), and compared once.
    if run.iter().fold(u8::MAX, |least, &byte| least.min(byte)) < 0x20 {
        return run.iter().position(|&byte| byte < 0x20).unwrap_or(end);
    }
    end
}

#[cfg(test)]
mod tests;
