//! What a response says it cost (pure): the value a settled limit reads from a response as
//! it passes — a JSON body's field, an event stream's last event that carries it, a header
//! or trailer, the bytes sent — and the tokens a reservation settles to.
//!
//! A response is never held for this: its frames are looked at as they are forwarded, and
//! only what the field needs is kept (a JSON body up to `[server] max_buffered_body`, by
//! reference to the frames; of an event stream, the event being read and the last value).

mod body;
mod json;
mod sse;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};

use crate::config::costs::{Field, Measure};

use body::{BodyScan, Coded};
pub use json::JsonPath;
use sse::EventScanner;

/// One item per settled limit of a response (rarely more than two).
pub type PerMeasure<T> = smallvec::SmallVec<[T; 2]>;

/// A settlement value above 2^53 is not a count of anything: no integer above it is exact,
/// and a bucket would read it as an endless debt.
const LARGEST: f64 = 9_007_199_254_740_992.0;

/// What a response said of one field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// Not there (yet).
    Absent,
    /// A non-negative number.
    Number(f64),
    /// There, but not a non-negative number: a string, an object, a negative or huge number,
    /// a field given twice, a body that is not JSON or did not fit.
    Invalid,
}

impl Reading {
    /// A JSON or header number as a settlement reads it.
    pub fn of(value: f64) -> Reading {
        if value.is_finite() && (0.0..=LARGEST).contains(&value) {
            Reading::Number(value)
        } else {
            Reading::Invalid
        }
    }

    /// The number, when the reading is one.
    pub fn number(self) -> Option<f64> {
        match self {
            Reading::Number(value) => Some(value),
            _ => None,
        }
    }
}

/// A header's or trailer's text as a number: decimal, optionally with a fraction or
/// exponent, and nothing else (no sign, no `inf`, no `NaN`).
pub fn parse_number(text: &[u8]) -> Reading {
    let text = text.trim_ascii();
    let plain = !text.is_empty()
        && text[0].is_ascii_digit()
        && text
            .iter()
            .all(|byte| byte.is_ascii_digit() || matches!(byte, b'.' | b'e' | b'E' | b'+' | b'-'));
    let parsed = std::str::from_utf8(text)
        .ok()
        .filter(|_| plain)
        .and_then(|text| text.parse::<f64>().ok());
    parsed.map_or(Reading::Invalid, Reading::of)
}

/// One response as its settled limits measure it, frame by frame.
#[derive(Debug)]
pub struct Meter {
    /// Each settled limit's measure, in the order their values are asked for.
    measures: PerMeasure<Measuring>,
    /// The body as its JSON fields are read: decompressed first when the upstream compressed
    /// it (what the client receives is untouched).
    body: Coded,
    /// Data bytes seen.
    bytes: u64,
    /// Per measure: what its header said at the head, or its trailer.
    headers: PerMeasure<Reading>,
    ended: bool,
}

/// A settle measure as meters read it, compiled once per route limit (cheap to clone).
#[derive(Debug, Clone)]
pub enum Measuring {
    Json(JsonPath),
    Header(HeaderName),
    UpstreamMs,
    ResponseBytes,
}

impl Measuring {
    pub fn of(measure: &Measure) -> Measuring {
        match measure {
            Measure::Field(Field::Json(path)) => Measuring::Json(JsonPath::new(path)),
            Measure::Field(Field::Header(name)) => Measuring::Header(name.clone()),
            Measure::UpstreamMs => Measuring::UpstreamMs,
            Measure::ResponseBytes => Measuring::ResponseBytes,
        }
    }
}

impl Meter {
    /// A meter for `measures` over a response with this head; a JSON body (or event) is kept
    /// up to `limit` bytes.
    pub fn new<'m>(
        measures: impl IntoIterator<Item = &'m Measuring>,
        head: &HeaderMap,
        limit: usize,
    ) -> Meter {
        let measures: PerMeasure<Measuring> = measures.into_iter().cloned().collect();
        let reads_json = |measure: &Measuring| matches!(measure, Measuring::Json(_));
        let scan = if !measures.iter().any(reads_json) {
            BodyScan::None
        } else if is_event_stream(head) {
            // Per measure, the JSON path it reads (the event scanner keeps their positions).
            let json_paths = measures
                .iter()
                .map(|measure| match measure {
                    Measuring::Json(path) => Some(path.clone()),
                    _ => None,
                })
                .collect();
            BodyScan::Events(Box::new(EventScanner::new(json_paths, limit)))
        } else {
            BodyScan::json(limit)
        };
        let body = Coded::new(scan, head);
        let headers = measures
            .iter()
            .map(|measure| match measure {
                Measuring::Header(name) => header_reading(Reading::Absent, head, name),
                _ => Reading::Absent,
            })
            .collect();
        Meter {
            measures,
            body,
            bytes: 0,
            headers,
            ended: false,
        }
    }

    /// A data frame on its way to the client.
    pub fn data(&mut self, data: &Bytes) {
        self.bytes += data.len() as u64;
        self.body.data(data);
    }

    /// The response's trailers.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        for (measure, reading) in self.measures.iter().zip(&mut self.headers) {
            if let Measuring::Header(name) = measure {
                *reading = header_reading(*reading, trailers, name);
            }
        }
    }

    /// The body ended whole: what is kept of it is read.
    pub fn end(&mut self) {
        self.ended = true;
        self.body.end();
    }

    /// The data bytes seen so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a measure is the upstream's time, which only the caller's clock knows.
    pub fn times_the_upstream(&self) -> bool {
        self.measures
            .iter()
            .any(|measure| matches!(measure, Measuring::UpstreamMs))
    }

    /// What the measure at `index` read from the response: a body field only from a body
    /// that ended whole (a response cut short keeps its reservation), the bytes seen so far,
    /// or the `elapsed_ms` given (from forwarding until now).
    pub fn reading(&self, index: usize, elapsed_ms: f64) -> Reading {
        match &self.measures[index] {
            Measuring::UpstreamMs => Reading::of(elapsed_ms),
            Measuring::ResponseBytes => Reading::of(self.bytes as f64),
            Measuring::Header(_) => self.headers[index],
            Measuring::Json(path) => self.body.reading(index, path, self.ended),
        }
    }
}

/// `text/event-stream`, with any parameters.
fn is_event_stream(head: &HeaderMap) -> bool {
    head.get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// What `fields` add to a header's reading: a value given more than once, in the head and
/// the trailers together, is ambiguous.
fn header_reading(before: Reading, fields: &HeaderMap, name: &HeaderName) -> Reading {
    let mut values = fields.get_all(name).iter();
    match (before, values.next(), values.next()) {
        (before, None, _) => before,
        (Reading::Absent, Some(value), None) => parse_number(value.as_bytes()),
        _ => Reading::Invalid,
    }
}

#[cfg(test)]
mod tests;
