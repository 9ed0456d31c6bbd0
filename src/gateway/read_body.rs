//! The read_body phase: a request's body as it goes upstream, read whole when the route's
//! keys read it (413 beyond `max_buffered_body`, 400 if it breaks off), otherwise streamed.

use bytes::Bytes;
use http::header;
use http::HeaderMap;
use http_body_util::{BodyExt, Limited};

use super::RequestBody;
use crate::reject::Reject;
use crate::runtime::ServedRoute;
use crate::upstream::OutgoingBody;

/// The request's body as it goes upstream: read whole (up to `max` bytes) when the route's
/// keys read it, otherwise streamed.
pub(super) async fn read_body(
    route: &ServedRoute,
    max: usize,
    headers: &HeaderMap,
    body: RequestBody,
) -> Result<OutgoingBody, Reject> {
    Ok(match body {
        RequestBody::Empty => OutgoingBody::Buffered(Bytes::new()),
        body if route.route.reads_body => {
            OutgoingBody::Buffered(Box::pin(buffer_body(headers, body, max)).await?)
        }
        body if http_body::Body::is_end_stream(&body) => OutgoingBody::Buffered(Bytes::new()),
        body => OutgoingBody::Streamed(body),
    })
}

/// Reads the whole body, up to `max` bytes (413 beyond; 400 if the client breaks off).
async fn buffer_body(headers: &HeaderMap, body: RequestBody, max: usize) -> Result<Bytes, Reject> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        return Err(Reject::PayloadTooLarge(max));
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(Reject::PayloadTooLarge(max))
        }
        Err(_) => Err(Reject::BadRequest(
            "the request body could not be read".to_owned(),
        )),
    }
}
