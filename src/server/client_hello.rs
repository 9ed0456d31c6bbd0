//! The bytes of a TLS client's first flight, kept as rustls reads them (no second read, no
//! second handshake), for the connection's JA4 fingerprint.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::ja4::{self, Hello, MAX_HELLO_BYTES};

/// The most bytes kept: a hello of the largest size read, cut into small records.
const MAX_RECORDED: usize = 2 * MAX_HELLO_BYTES;

/// A stream that keeps what is read from it until asked for the fingerprint; after that it
/// only passes bytes on.
pub(super) struct HelloRecorder<S> {
    inner: S,
    recorded: Option<Vec<u8>>,
}

impl<S> HelloRecorder<S> {
    pub(super) fn new(inner: S) -> HelloRecorder<S> {
        HelloRecorder {
            inner,
            recorded: Some(Vec::new()),
        }
    }

    /// The JA4 fingerprint of the ClientHello read, once: `None` when what was read is no
    /// readable hello. Recording stops here.
    pub(super) fn fingerprint(&mut self) -> Option<String> {
        match ja4::reassemble(&self.recorded.take()?) {
            Hello::Complete(message) => ja4::fingerprint(&message),
            Hello::Partial | Hello::Unreadable => None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HelloRecorder<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(recorded) = &mut this.recorded {
            let read = &buf.filled()[before..];
            if recorded.len() + read.len() > MAX_RECORDED {
                // Past any hello worth reading: keep nothing, and read no fingerprint.
                this.recorded = None;
            } else {
                recorded.extend_from_slice(read);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HelloRecorder<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
