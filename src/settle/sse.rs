//! An event stream (`text/event-stream`) read event by event as it passes: of each event only
//! its `data` is kept until the event ends, and of the fields the settled limits name only the
//! last value an event carried.

use memchr::memmem::Finder;

use super::json::{number_in, JsonPath};
use super::Reading;

/// A buffer that grew past this is given back when its event ends: one large event must not
/// keep its memory for the rest of a long stream.
const KEPT_CAPACITY: usize = 4096;

/// The state of one event stream.
#[derive(Debug)]
pub(super) struct EventScanner {
    /// Per settled measure: the JSON path it reads (`None`: it reads no event).
    paths: Vec<Option<EventField>>,
    /// Per measure: the last value an event carried.
    readings: Vec<Reading>,
    /// The line being read, when a frame ended inside it.
    line: Vec<u8>,
    /// The event's data lines, joined by newlines.
    data: Vec<u8>,
    /// The line being read grew past `limit`: the rest of it is dropped.
    skipping_line: bool,
    /// The event grew past `limit`: what it carried is unknown.
    overflowed: bool,
    limit: usize,
}

impl EventScanner {
    /// A scanner for the JSON `paths` (by measure), keeping at most `limit` bytes of an
    /// event.
    pub(super) fn new(paths: Vec<Option<JsonPath>>, limit: usize) -> EventScanner {
        let readings = vec![Reading::Absent; paths.len()];
        let paths = paths
            .into_iter()
            .map(|path| {
                path.map(|path| {
                    let key = Finder::new(&format!("\"{}\"", path.first())).into_owned();
                    EventField { path, key }
                })
            })
            .collect();
        EventScanner {
            paths,
            readings,
            line: Vec::new(),
            data: Vec::new(),
            skipping_line: false,
            overflowed: false,
            limit,
        }
    }

    /// The bytes of the stream that came next.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) {
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            let piece = &bytes[..end];
            bytes = &bytes[end + 1..];
            if self.line.is_empty() && !self.skipping_line {
                self.line_done(piece);
            } else {
                self.extend_line(piece);
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
                if line.capacity() <= KEPT_CAPACITY {
                    self.line = line;
                    self.line.clear();
                }
            }
        }
        self.extend_line(bytes);
    }

    /// What the measure at `index` last read.
    pub(super) fn reading(&self, index: usize) -> Reading {
        self.readings[index]
    }

    /// The bytes a scanner holds beyond its own size.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.line.capacity() + self.data.capacity()
    }

    fn extend_line(&mut self, bytes: &[u8]) {
        if self.skipping_line || bytes.is_empty() {
            return;
        }
        if self.line.len() + bytes.len() > self.limit {
            self.skipping_line = true;
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        if std::mem::take(&mut self.skipping_line) {
            self.overflowed = true;
            return;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
            return;
        }
        let Some(value) = line.strip_prefix(b"data") else {
            return;
        };
        let value = match value {
            [] => value,
            [b':', b' ', rest @ ..] | [b':', rest @ ..] => rest,
            // Another field whose name begins with "data".
            _ => return,
        };
        if self.overflowed {
            return;
        }
        if self.data.len() + value.len() + 1 > self.limit {
            self.overflowed = true;
            self.data = Vec::new();
            return;
        }
        if !self.data.is_empty() {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
    }

    /// An event ended: the fields it carries are read.
    fn dispatch(&mut self) {
        let overflowed = std::mem::take(&mut self.overflowed);
        for ((path, reading), data) in self
            .paths
            .iter()
            .zip(&mut self.readings)
            .zip(std::iter::repeat(&self.data))
        {
            let Some(field) = path else {
                continue;
            };
            if overflowed {
                *reading = Reading::Invalid;
                continue;
            }
            if !field.may_carry(data) {
                continue;
            }
            match number_in(data, &field.path) {
                Reading::Absent => {}
                carried => *reading = carried,
            }
        }
        self.data.clear();
        if self.data.capacity() > KEPT_CAPACITY {
            self.data = Vec::new();
        }
    }
}

/// A JSON path an event stream is read for.
#[derive(Debug)]
struct EventField {
    path: JsonPath,
    /// The path's first key, quoted: an event that never names it is not parsed.
    key: Finder<'static>,
}

impl EventField {
    /// Whether an event's data may carry the field: it names the key, and not only as
    /// `"key": null` (how OpenAI-style streams say "not yet" on every event but the last).
    fn may_carry(&self, data: &[u8]) -> bool {
        self.key.find_iter(data).any(|at| {
            let after = data[at + self.key.needle().len()..].trim_ascii_start();
            let value = after.strip_prefix(b":").map(<[u8]>::trim_ascii_start);
            !value.is_some_and(|value| value.starts_with(b"null"))
        })
    }
}
