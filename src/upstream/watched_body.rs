//! A client's body streamed upstream, watched for failing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::body::BoxError;
use crate::request_body::RequestBody;

/// A client's body on its way upstream, which says whether it failed: a malformed or broken
/// body ends the exchange with an error that hyper's client reports as its own.
pub(super) struct WatchedBody {
    inner: RequestBody,
    broken: Arc<AtomicBool>,
}

impl WatchedBody {
    pub(super) fn new(inner: RequestBody) -> (WatchedBody, Arc<AtomicBool>) {
        let broken = Arc::new(AtomicBool::new(false));
        (
            WatchedBody {
                inner,
                broken: broken.clone(),
            },
            broken,
        )
    }
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Err(_))) = &polled {
            self.broken.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
