//! The client Initial datagrams of connections being set up, kept by the listener's socket for
//! the JA4 fingerprint of their ClientHello (quinn reads the hello but does not show it). Only
//! Initial packets are copied, at most a few per client address and a bounded number of
//! addresses: a flood of spoofed Initials pushes out the oldest, and costs a fingerprint at
//! worst, never memory.

use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use crate::ja4;

/// Client addresses whose Initials are kept at once.
const MAX_PEERS: usize = 4096;
/// Initial datagrams kept per client address: a ClientHello with a post-quantum key share
/// takes two, and a client may repeat them.
const MAX_DATAGRAMS: usize = 6;

/// The listener's socket, which keeps what [`KeptInitials`] asks for as datagrams arrive.
#[derive(Debug)]
pub(super) struct InitialsSocket {
    pub(super) inner: Arc<dyn AsyncUdpSocket>,
    pub(super) kept: Arc<KeptInitials>,
}

impl AsyncUdpSocket for InitialsSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let polled = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(count)) = &polled {
            for (buffer, meta) in bufs.iter().zip(meta.iter()).take(*count) {
                // Several datagrams of `stride` bytes when the kernel coalesced them (GRO).
                for datagram in buffer[..meta.len].chunks(meta.stride.max(1)) {
                    if ja4::quic::is_initial(datagram) {
                        self.kept.keep(meta.addr, datagram);
                    }
                }
            }
        }
        polled
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Each client address's latest connection attempt: its Initial datagrams.
#[derive(Default)]
pub(super) struct KeptInitials {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_peer: HashMap<SocketAddr, Attempt, foldhash::fast::RandomState>,
    /// Counts attempts as they come: the oldest go first when the table is full.
    next: u64,
}

struct Attempt {
    destination: Vec<u8>,
    datagrams: Vec<Vec<u8>>,
    since: u64,
}

impl std::fmt::Debug for KeptInitials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers = self.table.lock().by_peer.len();
        formatter
            .debug_struct("KeptInitials")
            .field("peers", &peers)
            .finish()
    }
}

impl KeptInitials {
    fn keep(&self, peer: SocketAddr, datagram: &[u8]) {
        let Some(destination) = ja4::quic::destination_id(datagram) else {
            return;
        };
        let mut table = self.table.lock();
        if let Some(attempt) = table.by_peer.get_mut(&peer) {
            // The attempt goes on, its later packets addressed to the ID the server chose; only
            // the first packet after a Retry (a token, and another ID) begins a new one.
            let restarts = attempt.destination != destination && ja4::quic::carries_token(datagram);
            if !restarts {
                if attempt.datagrams.len() < MAX_DATAGRAMS {
                    attempt.datagrams.push(datagram.to_vec());
                }
                return;
            }
        } else if table.by_peer.len() >= MAX_PEERS {
            // Full: the older half goes.
            let newest_gone = table.next - (MAX_PEERS / 2) as u64;
            table
                .by_peer
                .retain(|_, attempt| attempt.since >= newest_gone);
        }
        let since = table.next;
        table.next += 1;
        table.by_peer.insert(
            peer,
            Attempt {
                destination: destination.to_vec(),
                datagrams: vec![datagram.to_vec()],
                since,
            },
        );
    }

    /// The JA4 fingerprint of the ClientHello `peer` sent, forgetting its datagrams.
    pub(super) fn fingerprint(&self, peer: SocketAddr) -> Option<Arc<str>> {
        let attempt = self.table.lock().by_peer.remove(&peer)?;
        let hello = ja4::quic::client_hello(attempt.datagrams.iter().map(Vec::as_slice))?;
        ja4::quic_fingerprint(&hello).map(Arc::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initial(destination: u8) -> Vec<u8> {
        let mut datagram = vec![0xc0, 0, 0, 0, 1, 1, destination];
        datagram.resize(1200, 0);
        datagram
    }

    #[test]
    fn one_attempt_per_address_and_a_bounded_table() {
        let kept = KeptInitials::default();
        let peer: SocketAddr = "192.0.2.1:4433".parse().unwrap();
        for _ in 0..10 {
            kept.keep(peer, &initial(1));
        }
        let count = |kept: &KeptInitials| kept.table.lock().by_peer[&peer].datagrams.len();
        assert_eq!(count(&kept), MAX_DATAGRAMS);
        kept.keep(peer, &initial(2));
        assert_eq!(
            count(&kept),
            MAX_DATAGRAMS,
            "the same attempt, to the server's ID"
        );
        let mut after_retry = initial(2);
        after_retry[8] = 1; // a token of one byte
        kept.keep(peer, &after_retry);
        assert_eq!(count(&kept), 1, "a new attempt starts afresh");
        assert_eq!(kept.fingerprint(peer), None, "no real hello in it");
        assert!(kept.table.lock().by_peer.is_empty(), "taken");
        for port in 0..(MAX_PEERS as u16 + 10) {
            kept.keep(SocketAddr::from(([10, 0, 0, 1], port)), &initial(1));
        }
        let table = kept.table.lock();
        assert!(table.by_peer.len() <= MAX_PEERS);
        let newest = SocketAddr::from(([10, 0, 0, 1], MAX_PEERS as u16 + 9));
        assert!(table.by_peer.contains_key(&newest));
    }
}
