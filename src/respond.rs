//! Every response the gateway writes itself: refusals (429), errors (400, 404, 405, 413, 431,
//! 502, 503, 504), and the rate-limit headers on admitted responses. Bodies are short JSON,
//! never a stack trace.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use smallvec::SmallVec;

use crate::body::Body;
use crate::config::{HeaderMode, Refusal};
use crate::limit::Reading;
use crate::reject::{LimitReport, Reject};
use crate::request_id::RequestId;
use crate::upstream::ForwardError;

mod forward_auth_answers;
mod grpc_answers;
mod ratelimit_headers;

pub use forward_auth_answers::{
    forward_auth_admitted, forward_auth_rejection, name_route, undescribed,
};
pub use grpc_answers::{grpc_error, grpc_message, grpc_rejection};
pub use ratelimit_headers::add_ratelimit_headers;

/// Header fields the gateway sets on a response, kept beside the response's header map until
/// the head is written: the server's own HTTP/1.1 path writes them straight into the head (no
/// map insertion and no allocation per field, on every response), hyper's path puts them into
/// the map. Each replaces the map's fields of the same name, so that an upstream's
/// `X-Request-Id` or `RateLimit-*` never reaches the client beside the gateway's. The server
/// owns one per connection and lends it to each request, so that it is never moved.
#[derive(Debug, Default)]
pub struct SetFields {
    fields: SmallVec<[(&'static HeaderName, FieldValue); 6]>,
    /// The request's reading of the clock, for the `Date` the server's own path writes when
    /// the answer has none: kept while it is current (the answer came without waiting).
    now: Option<Reading>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    Static(&'static str),
    Number(u64),
    /// Valid header-value text (limit names and numbers).
    Text(String),
    /// A name the policy holds (a route's), shared rather than copied.
    Name(std::sync::Arc<str>),
    RequestId(RequestId),
}

impl SetFields {
    /// Sets `name`, which is not set yet (each field is set by one step of the request path).
    pub fn set(&mut self, name: &'static HeaderName, value: FieldValue) {
        debug_assert!(!self.sets(name), "{name} set twice");
        self.fields.push((name, value));
    }

    /// Sets `name`, in place of what an earlier step set.
    pub fn replace(&mut self, name: &'static HeaderName, value: FieldValue) {
        self.fields.retain(|(set, _)| *set != name);
        self.fields.push((name, value));
    }

    pub fn clear(&mut self) {
        self.fields.clear();
        self.now = None;
    }

    /// Keeps the request's reading of the clock for the response's `Date`.
    pub fn date_at(&mut self, now: Reading) {
        self.now = Some(now);
    }

    /// Forgets the reading: the answer waited, and its `Date` is read when it is written.
    pub fn date_later(&mut self) {
        self.now = None;
    }

    /// The reading a `Date` written now may use.
    pub fn date(&self) -> Option<&Reading> {
        self.now.as_ref()
    }

    /// Whether `name` is set here (and a field of that name in the map gives way).
    pub fn sets(&self, name: &HeaderName) -> bool {
        self.fields.iter().any(|(set, _)| *set == name)
    }

    /// Calls `write` with each field's name and value, in the order they were set.
    pub fn write(&self, mut write: impl FnMut(&[u8], &[u8])) {
        let mut digits = itoa::Buffer::new();
        for (name, value) in &self.fields {
            let value = match value {
                FieldValue::Static(text) => text.as_bytes(),
                FieldValue::Number(number) => digits.format(*number).as_bytes(),
                FieldValue::Text(text) => text.as_bytes(),
                FieldValue::Name(name) => name.as_bytes(),
                FieldValue::RequestId(id) => id.as_bytes(),
            };
            write(name.as_str().as_bytes(), value);
        }
    }

    /// Puts the fields into `headers`, replacing fields of the same names. Values that change
    /// from response to response (numbers, the request id, texts with numbers in them) are
    /// marked never to be indexed: HTTP/2's HPACK would otherwise insert each into its table,
    /// and walk every one of a name's entries to look up the next.
    pub fn apply(self, headers: &mut HeaderMap) {
        // Room made at once: a map grows (and moves every entry) each time it fills, and
        // hyper's `Date` check (`entry`) grows a full map even when the field is there.
        headers.reserve(self.fields.len() + 1);
        for (name, value) in self.fields {
            let (mut value, changing) = match value {
                FieldValue::Static(text) => (HeaderValue::from_static(text), false),
                FieldValue::Number(number) => (number_value(number), true),
                FieldValue::Text(text) => match HeaderValue::try_from(text) {
                    Ok(value) => (value, true),
                    Err(_) => continue,
                },
                FieldValue::Name(name) => match HeaderValue::from_str(&name) {
                    Ok(value) => (value, false),
                    Err(_) => continue,
                },
                FieldValue::RequestId(id) => (id.to_header_value(), true),
            };
            value.set_sensitive(changing);
            headers.insert(name.clone(), value);
        }
    }
}

/// Numbers below this are spelled once, for every response after: a response's numbers
/// (limits, tokens left, seconds to wait) are mostly small, and spelling one allocates.
const SPELLED_NUMBERS: usize = 4096;

/// `number` as a field value: without an allocation when it is small, else in one
/// (`HeaderValue::from` makes two).
fn number_value(number: u64) -> HeaderValue {
    static SPELLED: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let spelled = SPELLED.get_or_init(|| {
        (0..SPELLED_NUMBERS)
            .map(|number| &*Box::leak(number.to_string().into_boxed_str()))
            .collect()
    });
    match usize::try_from(number)
        .ok()
        .and_then(|index| spelled.get(index))
    {
        Some(text) => HeaderValue::from_static(text),
        None => HeaderValue::from_bytes(itoa::Buffer::new().format(number).as_bytes())
            .unwrap_or_else(|_| HeaderValue::from(number)),
    }
}

/// Renders a request's rejection: the one place where the request path's early answers are
/// built.
pub fn rejection(
    reject: Reject,
    mode: HeaderMode,
    shape: Option<&Refusal>,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    match reject {
        Reject::ShuttingDown => shutting_down(),
        Reject::ToHttps(location) => permanent_redirect(location),
        Reject::AcmeChallenge(Some(key_authorization)) => acme_challenge(key_authorization),
        Reject::AcmeChallenge(None) => not_found(),
        Reject::BadRequest(detail) => bad_request(&detail),
        Reject::MethodNotAllowed => method_not_allowed(),
        Reject::PayloadTooLarge(limit) => payload_too_large(limit),
        Reject::HeaderFieldsTooLarge => header_fields_too_large(),
        Reject::NoRoute => not_found(),
        Reject::InvalidToken => {
            unauthorized("Bearer error=\"invalid_token\"", "invalid_token", None)
        }
        Reject::Unauthenticated(detail) => unauthorized("Bearer", "unauthorized", Some(&detail)),
        Reject::Limited | Reject::Banned => match shape {
            Some(shape) => shaped_refusal(shape, mode, reports, fields),
            None => too_many_requests(mode, reports, fields),
        },
        Reject::ScanBanned {
            retry_after,
            until_unix,
        } => scan_banned(retry_after, until_unix, fields),
        Reject::StoreUnavailable => store_unavailable(1),
        Reject::Upstream(ForwardError::Timeout(_)) => gateway_timeout(),
        Reject::Upstream(ForwardError::ClientBody) => {
            bad_request("the request body could not be read")
        }
        Reject::Upstream(ForwardError::Connect(_) | ForwardError::Exchange(_))
        | Reject::UpgradeFailed => bad_gateway(),
    }
}

/// The longest wait among the refusing limits (seconds).
pub(crate) fn refused_wait(reports: &[LimitReport<'_>]) -> f64 {
    reports
        .iter()
        .filter(|report| report.refused)
        .map(|report| report.wait)
        .fold(0.0, f64::max)
}

pub(crate) fn whole(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// Whole seconds, rounded up, at least 1: what `Retry-After` announces.
pub fn retry_after_seconds(wait: f64) -> u64 {
    whole(wait.ceil()).max(1)
}

pub fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = without_fields(status, body.into());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn without_fields(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    response
}

/// `{"error":"<code>"}` or `{"error":"<code>","detail":"..."}`.
pub fn error(status: StatusCode, code: &str, detail: Option<&str>) -> Response<Body> {
    let body = match detail {
        Some(detail) => serde_json::json!({ "error": code, "detail": detail }),
        None => serde_json::json!({ "error": code }),
    };
    full(status, "application/json", body.to_string())
}

pub fn bad_request(detail: &str) -> Response<Body> {
    error(StatusCode::BAD_REQUEST, "bad_request", Some(detail))
}

/// 401 with the `WWW-Authenticate` challenge a bearer-token client reads.
pub fn unauthorized(challenge: &'static str, code: &str, detail: Option<&str>) -> Response<Body> {
    let mut response = error(StatusCode::UNAUTHORIZED, code, detail);
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

/// `308 Permanent Redirect` to `location`: the method and body are kept.
pub fn permanent_redirect(location: HeaderValue) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::PERMANENT_REDIRECT;
    response
        .headers_mut()
        .insert(http::header::LOCATION, location);
    response
}

/// An http-01 validation's answer: the key authorization as the whole body (RFC 8555 §8.3).
fn acme_challenge(key_authorization: String) -> Response<Body> {
    let mut response = Response::new(Body::full(key_authorization));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

pub fn not_found() -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        Some("no route matches this request"),
    )
}

pub fn method_not_allowed() -> Response<Body> {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        Some("CONNECT is not proxied"),
    )
}

pub fn payload_too_large(limit: usize) -> Response<Body> {
    let detail = format!("this route reads the body to key its limits; at most {limit} bytes");
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        Some(&detail),
    )
}

pub fn header_fields_too_large() -> Response<Body> {
    error(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "request_header_fields_too_large",
        None,
    )
}

pub fn bad_gateway() -> Response<Body> {
    error(
        StatusCode::BAD_GATEWAY,
        "bad_gateway",
        Some("the upstream could not be reached"),
    )
}

pub fn gateway_timeout() -> Response<Body> {
    error(
        StatusCode::GATEWAY_TIMEOUT,
        "gateway_timeout",
        Some("the upstream did not answer in time"),
    )
}

pub fn store_unavailable(retry_after: u64) -> Response<Body> {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        Some("rate-limit state is unavailable; try again later"),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, number_value(retry_after));
    response
}

pub fn shutting_down() -> Response<Body> {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", None);
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The 429: JSON body (problem+json in the IETF modes), `Retry-After`, rate-limit headers.
pub fn too_many_requests(
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    let retry_after = refusal_retry_after(reports);
    // A ban in force says so: the client learns that waiting for tokens is not the point.
    let banned = crate::reject::banned(reports);
    let (content_type, body) = match mode {
        HeaderMode::Legacy | HeaderMode::None if banned => (
            "application/json",
            Bytes::from(format!(
                r#"{{"error":"too_many_requests","retry_after":{retry_after},"ban":true}}"#
            )),
        ),
        HeaderMode::Legacy | HeaderMode::None => {
            ("application/json", legacy_refusal_body(retry_after))
        }
        HeaderMode::Ietf | HeaderMode::Both => {
            let violated: Vec<&str> = reports
                .iter()
                .filter(|r| r.refused)
                .map(|r| r.name)
                .collect();
            let mut body = serde_json::json!({
                "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                "title": "Request cannot be satisfied as assigned quota has been exceeded",
                "status": 429,
                "violated-policies": violated,
                "error": "too_many_requests",
                "retry_after": retry_after,
            });
            if banned {
                body["ban"] = serde_json::Value::Bool(true);
            }
            ("application/problem+json", Bytes::from(body.to_string()))
        }
    };
    fields.set(&CONTENT_TYPE_NAME, FieldValue::Static(content_type));
    refusal_fields(retry_after, mode, reports, fields);
    without_fields(StatusCode::TOO_MANY_REQUESTS, body)
}

/// The 429 of a key `[scan]` banned: the ban's rest as `Retry-After`, and why in the body.
pub fn scan_banned(retry_after: u64, until_unix: u64, fields: &mut SetFields) -> Response<Body> {
    let body = serde_json::json!({
        "error": "too_many_requests",
        "retry_after": retry_after,
        "ban": {"reason": "scan", "until_unix": until_unix},
    });
    fields.set(&CONTENT_TYPE_NAME, FieldValue::Static("application/json"));
    fields.set(&RETRY_AFTER_NAME, FieldValue::Number(retry_after));
    without_fields(StatusCode::TOO_MANY_REQUESTS, Bytes::from(body.to_string()))
}

/// A refusal as its limit's `[limits.NAME.refusal]` shapes it: its status, its headers (or
/// none), `Retry-After` or not, its body file or the usual JSON (without `retry_after` when
/// the wait is not told).
pub fn shaped_refusal(
    shape: &Refusal,
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    let retry_after = refusal_retry_after(reports);
    let body = match &shape.body {
        Some((body, content_type)) => {
            fields.set(&CONTENT_TYPE_NAME, FieldValue::Name(content_type.clone()));
            body.clone()
        }
        None => {
            let mut body = serde_json::json!({ "error": "too_many_requests" });
            if shape.retry_after {
                body["retry_after"] = retry_after.into();
            }
            if crate::reject::banned(reports) {
                body["ban"] = true.into();
            }
            fields.set(&CONTENT_TYPE_NAME, FieldValue::Static("application/json"));
            Bytes::from(body.to_string())
        }
    };
    if shape.retry_after {
        fields.set(&RETRY_AFTER_NAME, FieldValue::Number(retry_after));
    }
    add_ratelimit_headers(fields, shape.headers.unwrap_or(mode), reports);
    without_fields(shape.status, body)
}

/// What a refusal tells beside its body, whatever carries it (a 429, a gRPC decision's
/// headers to add): `Retry-After`, and the rate-limit headers of `mode`.
pub fn refusal_fields(
    retry_after: u64,
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) {
    fields.set(&RETRY_AFTER_NAME, FieldValue::Number(retry_after));
    add_ratelimit_headers(fields, mode, reports);
}

/// `Retry-After` of a refusal: when the longest wait of the refusing limits ends.
pub fn refusal_retry_after(reports: &[LimitReport<'_>]) -> u64 {
    retry_after_seconds(refused_wait(reports))
}

/// `{"error":"too_many_requests","retry_after":N}`: the hottest answer under attack, written
/// directly rather than through a JSON value, and kept per thread for the last `N` (a flood on
/// one limit is refused with the same wait again and again), so that it is shared, not built.
fn legacy_refusal_body(retry_after: u64) -> Bytes {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, Bytes)>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((seconds, body)) if *seconds == retry_after => body.clone(),
        _ => {
            let body = Bytes::from(
                [
                    r#"{"error":"too_many_requests","retry_after":"#,
                    itoa::Buffer::new().format(retry_after),
                    "}",
                ]
                .concat(),
            );
            *last = Some((retry_after, body.clone()));
            body
        }
    })
}

// As statics, so that `SetFields` can refer to them.
pub(crate) static CONTENT_TYPE_NAME: HeaderName = CONTENT_TYPE;
pub(crate) static RETRY_AFTER_NAME: HeaderName = RETRY_AFTER;

#[cfg(test)]
mod tests;
