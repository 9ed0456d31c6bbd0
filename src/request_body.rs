//! A client request's body as a server hands it to the gateway: none, hyper's (HTTP/1.1 and
//! HTTP/2), or an HTTP/3 request stream's (`quic.rs`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

use crate::body::BoxError;
pub(crate) use quic::QuicBody;

mod quic;

/// A client request's body as the server hands it over.
#[derive(Debug)]
pub(crate) enum RequestBody {
    /// The request has no body (the server's own HTTP/1.1 path takes only such requests).
    Empty,
    /// A body read by hyper as the gateway consumes it.
    Incoming(Incoming),
    /// A body read from an HTTP/3 request stream as the gateway consumes it. Boxed: the
    /// stream's state is some 200 bytes, and every request (bodyless ones above all) is moved
    /// from step to step with its body.
    Quic(Box<QuicBody>),
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Incoming(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            RequestBody::Quic(body) => Pin::new(&mut **body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Incoming(body) => body.is_end_stream(),
            RequestBody::Quic(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Incoming(body) => body.size_hint(),
            RequestBody::Quic(body) => body.size_hint(),
        }
    }
}
