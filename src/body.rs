//! The body of every response tollgate sends and every request it forwards.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;

use crate::in_flight::InFlight;

/// The error of a body that failed on its way.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes in memory — the gateway's own answers, and upstream bodies that arrived with their
/// head — or any other body, boxed. Bytes in memory are not boxed: that would cost an
/// allocation per response.
///
/// A response's body also holds its request's place in the in-flight counts: a body is
/// dropped once it has been sent whole or its client went away, and the request stops
/// counting then, not when its head was ready.
#[derive(Debug)]
pub struct Body {
    content: Content,
    in_flight: InFlight,
}

#[derive(Debug)]
enum Content {
    /// `None` once taken, or when empty from the start.
    Full(Option<Bytes>),
    Boxed(BoxBody<Bytes, BoxError>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        let bytes = bytes.into();
        Body::of(Content::Full((!bytes.is_empty()).then_some(bytes)))
    }

    pub fn empty() -> Body {
        Body::of(Content::Full(None))
    }

    pub fn boxed<B>(body: B) -> Body
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Body::of(Content::Boxed(body.map_err(Into::into).boxed()))
    }

    fn of(content: Content) -> Body {
        Body {
            content,
            in_flight: InFlight::default(),
        }
    }

    /// What the body counts in flight until it is dropped.
    pub(crate) fn in_flight(&mut self) -> &mut InFlight {
        &mut self.in_flight
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().content {
            Content::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Content::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Full(bytes) => bytes.is_none(),
            Content::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Content::Boxed(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    #[tokio::test]
    async fn bytes_in_memory_are_one_frame_of_exact_size_and_empty_ones_none() {
        let body = Body::full("hello");
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");

        let empty = Body::full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(Body::empty().collect().await.unwrap().to_bytes().is_empty());
    }

    #[tokio::test]
    async fn other_bodies_are_boxed_and_keep_their_frames() {
        let frames = futures_util::stream::iter([
            Ok::<_, std::io::Error>(Frame::data(Bytes::from("a"))),
            Ok(Frame::data(Bytes::from("b"))),
        ]);
        let body = Body::boxed(http_body_util::StreamBody::new(frames));
        assert_eq!(body.size_hint().exact(), None);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ab");
    }
}
