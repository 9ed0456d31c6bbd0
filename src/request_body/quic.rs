//! A request body arriving on an HTTP/3 request stream, read as the gateway consumes it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use http_body::{Frame, SizeHint};

use crate::body::BoxError;

/// The receiving half of a request stream.
pub(crate) type RecvHalf = RequestStream<h3_quinn::RecvStream, Bytes>;

/// A request body arriving in HTTP/3 DATA frames, then its trailers.
pub(crate) struct QuicBody {
    stream: RecvHalf,
    /// What `Content-Length` declared: the upstream is sent the same framing.
    declared: Option<u64>,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Data,
    Trailers,
    Done,
}

impl std::fmt::Debug for QuicBody {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("QuicBody")
            .field("declared", &self.declared)
            .field("state", &self.state)
            .finish()
    }
}

impl QuicBody {
    pub(crate) fn new(stream: RecvHalf, declared: Option<u64>) -> QuicBody {
        QuicBody {
            stream,
            declared,
            state: State::Data,
        }
    }
}

impl http_body::Body for QuicBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let body = self.get_mut();
        if body.state == State::Data {
            match std::task::ready!(body.stream.poll_recv_data(cx)) {
                Ok(Some(mut data)) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Ok(None) => body.state = State::Trailers,
                Err(error) => {
                    body.state = State::Done;
                    return Poll::Ready(Some(Err(error.into())));
                }
            }
        }
        if body.state == State::Trailers {
            let trailers = std::task::ready!(body.stream.poll_recv_trailers(cx));
            body.state = State::Done;
            return Poll::Ready(match trailers {
                Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
                Ok(None) => None,
                Err(error) => Some(Err(error.into())),
            });
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.declared {
            Some(length) => SizeHint::with_exact(length),
            None => SizeHint::default(),
        }
    }
}
