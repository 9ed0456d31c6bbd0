//! A TLS client's first flight, read before rustls sees it: its server name picks the
//! certificate (or the `unrecognized_name` alert when none answers it), and its JA4 fingerprint
//! keys limits. rustls then reads the same bytes again from memory.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::ja4::{self, Hello, MAX_HELLO_BYTES};
use crate::metrics::TlsMetrics;
use crate::tls::HandshakeFailure;

/// The most bytes read for a hello: the largest hello, cut into small records.
const MAX_READ: usize = 2 * MAX_HELLO_BYTES;

const HANDSHAKE_RECORD: u8 = 0x16;

/// A fatal `unrecognized_name` alert (RFC 6066), as a plaintext TLS record.
pub(super) const UNRECOGNIZED_NAME_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// The first flight read: its bytes, and the ClientHello message when they hold a readable one.
pub(super) struct FirstFlight {
    pub(super) bytes: Vec<u8>,
    pub(super) hello: Option<Vec<u8>>,
}

impl FirstFlight {
    pub(super) fn server_name(&self) -> Option<String> {
        ja4::server_name(self.hello.as_deref()?)
    }

    pub(super) fn asks_acme_challenge(&self) -> bool {
        self.hello.as_deref().is_some_and(ja4::asks_acme_challenge)
    }

    pub(super) fn fingerprint(&self) -> Option<String> {
        ja4::fingerprint(self.hello.as_deref()?)
    }
}

/// Reads until the ClientHello is whole (or cannot be one). A ClientHello too large to read
/// is left for rustls to judge, with no fingerprint.
pub(super) async fn read_first_flight<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<FirstFlight, HandshakeFailure> {
    let mut bytes = Vec::with_capacity(2048);
    loop {
        if bytes.capacity() == bytes.len() {
            bytes.reserve(bytes.len());
        }
        match stream.read_buf(&mut bytes).await {
            Ok(0) => return Err(HandshakeFailure::Closed),
            Ok(_) => {}
            Err(error) => return Err(HandshakeFailure::of(&error)),
        }
        match ja4::reassemble(&bytes) {
            Hello::Complete(message) => {
                return Ok(FirstFlight {
                    bytes,
                    hello: Some(message),
                })
            }
            Hello::Unreadable if bytes.first() != Some(&0x16) => {
                return Err(HandshakeFailure::NotTls)
            }
            Hello::Unreadable => return Ok(FirstFlight { bytes, hello: None }),
            Hello::Partial if bytes.len() >= MAX_READ => {
                return Ok(FirstFlight { bytes, hello: None })
            }
            Hello::Partial => {}
        }
    }
}

/// A stream that yields bytes already read from it before reading more, and follows the
/// client's TLS records to count renegotiation attempts once the handshake is done.
pub(super) struct Rewound<S> {
    read: Vec<u8>,
    position: usize,
    inner: S,
    records: RecordWatch,
    /// Where attempts are counted, from the end of the handshake on.
    after_handshake: Option<(TlsMetrics, IpAddr)>,
}

impl<S> Rewound<S> {
    pub(super) fn new(read: Vec<u8>, inner: S) -> Rewound<S> {
        Rewound {
            read,
            position: 0,
            inner,
            records: RecordWatch::default(),
            after_handshake: None,
        }
    }

    /// The handshake is over: a handshake record from now on is a renegotiation attempt
    /// (rustls refuses it with a warning alert), counted and logged at debug level.
    pub(super) fn handshake_done(&mut self, metrics: TlsMetrics, peer: IpAddr) {
        self.records.handshake_done = true;
        self.after_handshake = Some((metrics, peer));
    }

    fn watch(&mut self, read: &[u8]) {
        let attempts = self.records.read(read);
        if let (Some((metrics, peer)), true) = (&self.after_handshake, attempts > 0) {
            for _ in 0..attempts {
                metrics.handshake_failed(HandshakeFailure::Renegotiation);
            }
            tracing::debug!(%peer, "TLS renegotiation attempt refused");
        }
    }
}

/// Follows a client's TLS records by their headers alone (5 bytes: type, version, length).
#[derive(Debug, Default)]
struct RecordWatch {
    header: [u8; 5],
    have: usize,
    /// Payload bytes of the current record still to come.
    remaining: usize,
    handshake_done: bool,
}

impl RecordWatch {
    /// Reads the next bytes the client sent; how many handshake records began in them after
    /// the handshake.
    fn read(&mut self, mut bytes: &[u8]) -> usize {
        let mut attempts = 0;
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let skipped = self.remaining.min(bytes.len());
                self.remaining -= skipped;
                bytes = &bytes[skipped..];
                continue;
            }
            let taken = (5 - self.have).min(bytes.len());
            self.header[self.have..self.have + taken].copy_from_slice(&bytes[..taken]);
            self.have += taken;
            bytes = &bytes[taken..];
            if self.have == 5 {
                self.have = 0;
                self.remaining = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                if self.header[0] == HANDSHAKE_RECORD && self.handshake_done {
                    attempts += 1;
                }
            }
        }
        attempts
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        if this.position < this.read.len() {
            let rest = &this.read[this.position..];
            let taken = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..taken]);
            this.position += taken;
            if this.position == this.read.len() {
                this.read = Vec::new();
                this.position = 0;
            }
        } else {
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        }
        this.watch(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn bytes_read_ahead_come_first_then_the_stream() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b" world").await.unwrap();
        drop(client);
        let mut rewound = Rewound::new(b"hello".to_vec(), server);
        let mut all = String::new();
        rewound.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }

    /// A record header and payload.
    fn record(kind: u8, payload: usize) -> Vec<u8> {
        let mut record = vec![kind, 3, 3];
        record.extend((payload as u16).to_be_bytes());
        record.extend(vec![0; payload]);
        record
    }

    #[test]
    fn a_handshake_record_after_the_handshake_is_a_renegotiation_however_bytes_arrive() {
        let mut flight = record(0x16, 300);
        flight.extend(record(0x14, 1));
        flight.extend(record(0x16, 40));
        let mut later = record(0x17, 100);
        later.extend(record(0x16, 200));
        later.extend(record(0x17, 3));
        later.extend(record(0x16, 0));
        for chunk in [1, 2, 4, 5, 7, 64, 10_000] {
            let mut watch = RecordWatch::default();
            let during: usize = flight.chunks(chunk).map(|bytes| watch.read(bytes)).sum();
            assert_eq!(
                during, 0,
                "handshake records during the handshake count for nothing"
            );
            watch.handshake_done = true;
            let after: usize = later.chunks(chunk).map(|bytes| watch.read(bytes)).sum();
            assert_eq!(after, 2, "in chunks of {chunk}");
        }
    }

    #[tokio::test]
    async fn what_is_no_tls_is_told_at_once() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let read = read_first_flight(&mut server).await;
        assert_eq!(read.err(), Some(HandshakeFailure::NotTls));
        drop(client);
        let read = read_first_flight(&mut server).await;
        assert_eq!(read.err(), Some(HandshakeFailure::Closed));
    }
}
