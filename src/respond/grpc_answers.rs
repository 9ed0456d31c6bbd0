//! The gateway's own answers to gRPC calls: a rejection as gRPC reads it, a unary call's
//! message with its trailers, and a call that cannot be answered.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::Response;

use super::{refused_wait, rejection, FieldValue, SetFields, CONTENT_TYPE_NAME};
use crate::body::Body;
use crate::config::HeaderMode;
use crate::grpc;
use crate::reject::{LimitReport, Reject};

/// Renders a rejection of a gRPC request as gRPC reads it: HTTP 200, no body, the status in
/// `grpc-status` and `grpc-message` (a trailers-only response), and for a refusal by a limit
/// its wait as `retry-after` and as a `RetryInfo` in `grpc-status-details-bin`. The HTTP
/// answer's other fields (rate-limit headers, a challenge, `Connection: close`) stay.
pub fn grpc_rejection(
    reject: Reject,
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    let message = reject.to_string();
    let wait = match &reject {
        Reject::Limited | Reject::Banned => Some(refused_wait(reports)),
        Reject::ScanBanned { retry_after, .. } => Some(*retry_after as f64),
        _ => None,
    };
    // gRPC refusals keep their own shape: RESOURCE_EXHAUSTED.
    let answer = rejection(reject, mode, None, reports, fields);
    let code = grpc::Code::for_status(answer.status());
    let mut response = Response::new(Body::empty());
    let mut headers = answer.into_parts().0.headers;
    headers.remove(CONTENT_TYPE);
    headers.remove(http::header::CONTENT_LENGTH);
    *response.headers_mut() = headers;
    fields.replace(&CONTENT_TYPE_NAME, FieldValue::Static("application/grpc"));
    fields.set(&GRPC_STATUS, FieldValue::Static(code.as_str()));
    fields.set(
        &GRPC_MESSAGE,
        FieldValue::Text(grpc::message_field(&message)),
    );
    fields.set(
        &GRPC_STATUS_DETAILS,
        FieldValue::Text(grpc::status_details(code, &message, wait)),
    );
    response
}

/// A gRPC call's answer of the gateway's own: `message` framed, then `grpc-status: 0` in
/// the trailers.
pub fn grpc_message(message: Bytes, fields: &mut SetFields) -> Response<Body> {
    use http_body::Frame;
    fields.set(&CONTENT_TYPE_NAME, FieldValue::Static("application/grpc"));
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS.clone(), HeaderValue::from_static("0"));
    let frames = [
        Ok::<_, std::convert::Infallible>(Frame::data(grpc::framed(&message))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::new(Body::boxed(http_body_util::StreamBody::new(
        futures_util::stream::iter(frames),
    )))
}

/// A gRPC call the gateway cannot answer: HTTP 200, the status in the headers, no body.
pub fn grpc_error(code: grpc::Code, message: &str, fields: &mut SetFields) -> Response<Body> {
    fields.set(&CONTENT_TYPE_NAME, FieldValue::Static("application/grpc"));
    fields.set(&GRPC_STATUS, FieldValue::Static(code.as_str()));
    fields.set(
        &GRPC_MESSAGE,
        FieldValue::Text(grpc::message_field(message)),
    );
    Response::new(Body::empty())
}

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
