//! The ClientHello a QUIC client sends in its Initial packets, read back for its JA4 (pure: no
//! I/O). Initial packets are protected with keys anyone can derive from the packet's
//! destination connection ID (RFC 9001 §5.2; rustls derives them), so the hello is readable
//! as a TLS one on TCP is. It may span several packets, and clients put its CRYPTO frames in
//! any order (Chrome shuffles them on purpose): the pieces are put back by their offsets.

use std::collections::BTreeMap;

use rustls::quic::{Keys, Version};
use rustls::Side;

use super::MAX_HELLO_BYTES;

const QUIC_V1: u32 = 1;
const CLIENT_HELLO: u8 = 1;
/// The longest connection ID QUIC v1 allows.
const MAX_CID: usize = 20;
/// Header protection samples 16 bytes from 4 bytes past the packet number's start.
const SAMPLE: usize = 16;

/// The ClientHello message (without its handshake header) that the client Initial packets in
/// `datagrams` carry, the first of them opening the connection attempt; `None` until all of
/// it is there, or when none of them is a QUIC v1 client Initial that decrypts.
///
/// The keys come from the first packet's destination connection ID and hold for the whole
/// attempt, although the client addresses its later packets to the ID the server chose.
pub fn client_hello<'d>(datagrams: impl IntoIterator<Item = &'d [u8]>) -> Option<Vec<u8>> {
    let mut datagrams = datagrams.into_iter().peekable();
    let keys = initial_keys(destination_id(datagrams.peek()?)?)?;
    let mut crypto = CryptoStream::default();
    for datagram in datagrams {
        let mut rest = datagram;
        // Coalesced packets: Initials come first; anything else ends the datagram's share. A
        // packet that does not open, or carries a frame an Initial cannot, adds nothing.
        while let Some((plain, after)) = open_initial(rest, &keys) {
            let mut found = Vec::new();
            if crypto_frames(&plain, |offset, data| found.push((offset, data))).is_some() {
                for (offset, data) in found {
                    crypto.add(offset, data);
                }
            }
            rest = after;
        }
    }
    crypto.client_hello()
}

/// Whether an Initial packet carries a token: the client's first packet after a Retry, which
/// begins a new attempt with keys of its own.
pub fn carries_token(datagram: &[u8]) -> bool {
    let mut reader = Reader(datagram);
    let token = reader
        .take(5)
        .and_then(|_| reader.take_short())
        .and_then(|_| reader.take_short())
        .and_then(|_| reader.varint());
    token.is_some_and(|length| length > 0)
}

/// Whether a datagram begins with a QUIC v1 long-header Initial packet (the only kind worth
/// keeping for a fingerprint); cheap enough for every datagram a listener receives.
pub fn is_initial(datagram: &[u8]) -> bool {
    datagram.len() >= 7
        && datagram[0] & 0xb0 == 0x80
        && u32::from_be_bytes([datagram[1], datagram[2], datagram[3], datagram[4]]) == QUIC_V1
}

/// The destination connection ID of an Initial packet (its keys are derived from it).
pub fn destination_id(datagram: &[u8]) -> Option<&[u8]> {
    let length = usize::from(*datagram.get(5)?);
    (length <= MAX_CID).then(|| datagram.get(6..6 + length))?
}

/// Decrypts the client Initial packet at the start of `bytes` with the attempt's `keys`: its
/// payload, and what follows it in the datagram.
fn open_initial<'b>(bytes: &'b [u8], keys: &Keys) -> Option<(Vec<u8>, &'b [u8])> {
    if !is_initial(bytes) {
        return None;
    }
    let mut reader = Reader(bytes);
    reader.take(5)?;
    if reader.take_short()?.len() > MAX_CID {
        return None;
    }
    let source = reader.take_short()?;
    if source.len() > MAX_CID {
        return None;
    }
    let token_length = reader.varint()?;
    reader.take(usize::try_from(token_length).ok()?)?;
    let length = usize::try_from(reader.varint()?).ok()?;
    let number_at = bytes.len() - reader.0.len();
    let end = number_at.checked_add(length)?;
    let packet = bytes.get(..end)?;
    let sample = packet.get(number_at + 4..number_at + 4 + SAMPLE)?;
    let mut first = packet[0];
    let mut number = [0u8; 4];
    number.copy_from_slice(packet.get(number_at..number_at + 4)?);
    keys.remote
        .header
        .decrypt_in_place(sample, &mut first, &mut number)
        .ok()?;
    let number_length = usize::from(first & 0x03) + 1;
    let mut header = packet[..number_at + number_length].to_vec();
    header[0] = first;
    header[number_at..].copy_from_slice(&number[..number_length]);
    let packet_number = number[..number_length]
        .iter()
        .fold(0u64, |value, byte| value << 8 | u64::from(*byte));
    let mut payload = packet[number_at + number_length..].to_vec();
    let plain = keys
        .remote
        .packet
        .decrypt_in_place(packet_number, &header, &mut payload)
        .ok()?
        .to_vec();
    Some((plain, &bytes[end..]))
}

/// A server's Initial keys for a connection the client addressed to `destination`.
fn initial_keys(destination: &[u8]) -> Option<Keys> {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13()?;
    let quic = suite.quic?;
    Some(Keys::initial(
        Version::V1,
        suite,
        quic,
        destination,
        Side::Server,
    ))
}

/// Calls `found` with each CRYPTO frame's offset and data. `None`: a frame an Initial packet
/// cannot carry, or one cut short.
fn crypto_frames<'p>(plain: &'p [u8], mut found: impl FnMut(u64, &'p [u8])) -> Option<()> {
    let mut reader = Reader(plain);
    while !reader.0.is_empty() {
        match reader.varint()? {
            // PADDING, PING.
            0x00 | 0x01 => {}
            // ACK (with ECN counts for 0x03).
            kind @ (0x02 | 0x03) => {
                let (_largest, _delay) = (reader.varint()?, reader.varint()?);
                let ranges = reader.varint()?;
                reader.varint()?;
                for _ in 0..ranges {
                    reader.varint()?;
                    reader.varint()?;
                }
                if kind == 0x03 {
                    for _ in 0..3 {
                        reader.varint()?;
                    }
                }
            }
            0x06 => {
                let offset = reader.varint()?;
                let length = usize::try_from(reader.varint()?).ok()?;
                found(offset, reader.take(length)?);
            }
            // CONNECTION_CLOSE: nothing after it matters.
            0x1c => return Some(()),
            _ => return None,
        }
    }
    Some(())
}

/// The CRYPTO stream's pieces, by offset.
#[derive(Default)]
struct CryptoStream {
    pieces: BTreeMap<u64, Vec<u8>>,
}

impl CryptoStream {
    fn add(&mut self, offset: u64, data: &[u8]) {
        let fits = offset
            .checked_add(data.len() as u64)
            .is_some_and(|end| end <= MAX_HELLO_BYTES as u64);
        if fits && !data.is_empty() {
            let kept = self.pieces.entry(offset).or_default();
            if kept.len() < data.len() {
                *kept = data.to_vec();
            }
        }
    }

    /// The ClientHello, once the stream holds all of it from offset 0.
    fn client_hello(&self) -> Option<Vec<u8>> {
        let mut stream = Vec::new();
        for (offset, data) in &self.pieces {
            let offset = usize::try_from(*offset).ok()?;
            if offset > stream.len() {
                break;
            }
            let new = &data[(stream.len() - offset).min(data.len())..];
            stream.extend_from_slice(new);
        }
        if *stream.first()? != CLIENT_HELLO {
            return None;
        }
        let length = usize::from(*stream.get(1)?) << 16
            | usize::from(*stream.get(2)?) << 8
            | usize::from(*stream.get(3)?);
        stream.get(4..4 + length).map(<[u8]>::to_vec)
    }
}

/// Reads QUIC's fields off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, length: usize) -> Option<&'a [u8]> {
        if length > self.0.len() {
            return None;
        }
        let (taken, rest) = self.0.split_at(length);
        self.0 = rest;
        Some(taken)
    }

    /// A field after its one-byte length.
    fn take_short(&mut self) -> Option<&'a [u8]> {
        let length = usize::from(self.take(1)?[0]);
        self.take(length)
    }

    /// A variable-length integer (RFC 9000 §16).
    fn varint(&mut self) -> Option<u64> {
        let first = *self.0.first()?;
        let length = 1usize << (first >> 6);
        let bytes = self.take(length)?;
        Some(
            bytes[1..]
                .iter()
                .fold(u64::from(first & 0x3f), |value, byte| {
                    value << 8 | u64::from(*byte)
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protects `frames` as a client Initial packet to `destination` numbered `number`, padded
    /// as clients pad them, the way a QUIC client does (rustls's client keys).
    fn initial(destination: &[u8], number: u8, frames: &[u8]) -> Vec<u8> {
        initial_to(destination, destination, number, frames)
    }

    /// As [`initial`], with the keys of the attempt that `first` opened.
    fn initial_to(first: &[u8], destination: &[u8], number: u8, frames: &[u8]) -> Vec<u8> {
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
            .tls13()
            .unwrap();
        let keys = Keys::initial(Version::V1, suite, suite.quic.unwrap(), first, Side::Client);
        let mut payload = frames.to_vec();
        payload.resize(1100, 0);
        let length = payload.len() + 1 + 16;
        let mut header = vec![0xc0, 0, 0, 0, 1, destination.len() as u8];
        header.extend_from_slice(destination);
        header.extend_from_slice(&[4, 1, 2, 3, 4, 0]);
        header.extend_from_slice(&[0x40 | (length >> 8) as u8, length as u8, number]);
        let tag = keys
            .local
            .packet
            .encrypt_in_place(u64::from(number), &header, &mut payload)
            .unwrap();
        payload.extend_from_slice(tag.as_ref());
        let number_at = header.len() - 1;
        let sample = payload[3..3 + SAMPLE].to_vec();
        let (first, rest) = header.split_at_mut(1);
        keys.local
            .header
            .encrypt_in_place(&sample, &mut first[0], &mut rest[number_at - 1..])
            .unwrap();
        header.extend_from_slice(&payload);
        header
    }

    fn crypto(offset: u64, data: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x06, 0x40 | (offset >> 8) as u8, offset as u8];
        frame.extend_from_slice(&[0x40 | (data.len() >> 8) as u8, data.len() as u8]);
        frame.extend_from_slice(data);
        frame
    }

    fn hello(body: &[u8]) -> Vec<u8> {
        let mut message = vec![CLIENT_HELLO, 0, (body.len() >> 8) as u8, body.len() as u8];
        message.extend_from_slice(body);
        message
    }

    #[test]
    fn a_hello_split_over_packets_in_any_order_is_put_back_together() {
        let body: Vec<u8> = (0..1500u32).map(|i| (i % 251) as u8).collect();
        let message = hello(&body);
        let destination = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];
        // The second half first, then a PING, the first quarter, and the second quarter.
        let mut first = crypto(800, &message[800..]);
        let mut second = vec![0x01];
        second.extend(crypto(0, &message[..400]));
        second.extend(crypto(400, &message[400..800]));
        first.insert(0, 0x00);
        let datagrams = [
            initial(&destination, 0, &first),
            initial(&destination, 1, &second),
        ];
        let read = client_hello(datagrams.iter().map(Vec::as_slice));
        assert_eq!(read.as_deref(), Some(&body[..]));
        assert_eq!(client_hello([datagrams[0].as_slice()]), None, "half of it");
    }

    #[test]
    fn later_packets_to_the_server_s_id_open_with_the_first_packet_s_keys() {
        let message = hello(&[9u8; 300]);
        let (first_id, server_id) = ([1u8; 8], [2u8; 8]);
        let mut first = initial(&first_id, 0, &crypto(0, &message[..100]));
        let second = initial(&server_id, 1, &crypto(100, &message[100..]));
        // Sealed with the first ID's keys, addressed to the server's ID.
        let resealed = initial_to(&first_id, &server_id, 1, &crypto(100, &message[100..]));
        assert_eq!(client_hello([first.as_slice(), second.as_slice()]), None);
        let read = client_hello([first.as_slice(), resealed.as_slice()]);
        assert_eq!(read.as_deref(), Some(&message[4..]));
        assert!(!carries_token(&first));
        first[14 + 5] = 1; // after the source ID: a token length of 1
        assert!(carries_token(&first));
    }

    #[test]
    fn tampered_or_foreign_packets_give_nothing() {
        let message = hello(b"short hello");
        let destination = [7u8; 8];
        let mut packet = initial(&destination, 0, &crypto(0, &message));
        assert_eq!(
            client_hello([packet.as_slice()]).as_deref(),
            Some(&b"short hello"[..])
        );
        let last = packet.len() - 1;
        packet[last] ^= 1;
        assert_eq!(client_hello([packet.as_slice()]), None, "its tag fails");
        assert_eq!(client_hello([&b"\xc0\x00\x00\x00\x01"[..]]), None);
        assert_eq!(client_hello([&[0x40u8; 1200][..]]), None, "a short header");
        let mut v2 = initial(&destination, 0, &crypto(0, &message));
        v2[1..5].copy_from_slice(&0x6b33_43cfu32.to_be_bytes());
        assert_eq!(client_hello([v2.as_slice()]), None, "QUIC v2 is not read");
        assert_eq!(client_hello([&packet[..60]]), None, "truncated");
    }

    #[test]
    fn initials_are_told_from_other_datagrams() {
        let packet = initial(&[1, 2, 3, 4], 0, &[0x01]);
        assert!(is_initial(&packet));
        assert_eq!(destination_id(&packet), Some(&[1u8, 2, 3, 4][..]));
        assert!(!is_initial(&[0x40; 50]));
        let mut handshake = packet.clone();
        handshake[0] = 0xe0;
        assert!(!is_initial(&handshake));
    }

    proptest::proptest! {
        #[test]
        fn any_datagrams_are_read_without_a_panic(
            bytes: Vec<u8>,
            flips in proptest::collection::vec((0usize..1200, 1u8..=255), 0..4),
        ) {
            let mut packet = initial(&[3u8; 8], 0, &crypto(0, &hello(b"hello")));
            let length = packet.len();
            for (at, flip) in flips {
                packet[at % length] ^= flip;
            }
            let mut forged = vec![0xc0, 0, 0, 0, 1];
            forged.extend_from_slice(&bytes);
            let _ = client_hello([packet.as_slice(), bytes.as_slice(), forged.as_slice()]);
            let _ = client_hello([forged.as_slice(), packet.as_slice()]);
            let _ = carries_token(&forged);
        }
    }
}
