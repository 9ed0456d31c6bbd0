//! An HTTP/3 response written on its request stream frame by frame as it comes.

use bytes::Bytes;
use h3::server::RequestStream;
use http::Response;
use http_body_util::BodyExt;

use crate::body::Body;

pub(super) type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Writes `response` on the stream: its head, its body's frames as they come (none for a
/// HEAD request's), and the end. A body that fails upstream resets the stream: the client
/// must not take a cut-off body for a whole one.
pub(super) async fn send_response(
    stream: &mut SendHalf,
    response: Response<Body>,
    head_only: bool,
) -> Result<(), h3::error::StreamError> {
    let (parts, mut body) = response.into_parts();
    stream
        .send_response(Response::from_parts(parts, ()))
        .await?;
    if !head_only {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                stream.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Ok(());
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => stream.send_data(data).await?,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        stream.send_trailers(trailers).await?;
                        return Ok(());
                    }
                }
            }
        }
    }
    stream.finish().await
}
