//! The body of every response tollgate sends and every request it forwards.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;

use crate::BoxError;

/// Bytes in memory — the gateway's own answers, and upstream bodies that arrived with their
/// head — or any other body, boxed. Bytes in memory are not boxed: that would cost an
/// allocation per response.
#[derive(Debug)]
pub enum Body {
    /// `None` once taken, or when empty from the start.
    Full(Option<Bytes>),
    Boxed(BoxBody<Bytes, BoxError>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        let bytes = bytes.into();
        Body::Full((!bytes.is_empty()).then_some(bytes))
    }

    pub fn empty() -> Body {
        Body::Full(None)
    }

    pub fn boxed<B>(body: B) -> Body
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Body::Boxed(body.map_err(Into::into).boxed())
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Body::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(bytes) => bytes.is_none(),
            Body::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Boxed(body) => body.size_hint(),
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
