//! What a route charges a limit beyond a fixed number: a cost read from the request, and a
//! cost settled from the response once it has ended.

use http::HeaderName;

/// A cost read from the request (`cost = { json = "max_tokens", default = 256, max = 8192 }`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadCost {
    pub field: Field,
    /// Charged when the request lacks the field, or it is not a non-negative number.
    pub default: f64,
    /// The most a request is charged, whatever it says (never more than the bucket holds).
    pub max: f64,
}

/// Where a cost, or a settled value, is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A dotted path into a JSON body (`usage.total_tokens`).
    Json(String),
    /// A header (for a settled value: or a trailer of that name).
    Header(HeaderName),
}

/// How the reservation is settled once the response has ended (`settle`, `scale`).
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    pub measure: Measure,
    /// Tokens per unit of the measure.
    pub scale: f64,
}

/// What a settlement measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// A field of the response: its JSON body's (an event stream's last event that carries
    /// it), or a header's or trailer's.
    Field(Field),
    /// Milliseconds from forwarding the request to the response's end.
    UpstreamMs,
    /// The response body's bytes.
    ResponseBytes,
}

impl Measure {
    /// As the policy file names it.
    pub fn describe(&self) -> String {
        match self {
            Measure::Field(Field::Json(path)) => format!("json {path:?}"),
            Measure::Field(Field::Header(name)) => format!("header {:?}", name.as_str()),
            Measure::UpstreamMs => "upstream_ms".to_owned(),
            Measure::ResponseBytes => "response_bytes".to_owned(),
        }
    }
}
