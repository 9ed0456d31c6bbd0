//! The JA4 fingerprint of a TLS ClientHello, as FoxIO defines it: protocol, version, SNI,
//! counts and ALPN, then a hash of the sorted cipher suites and one of the sorted extensions
//! with the signature algorithms, GREASE values left out. Read from the bytes a client sends
//! before the handshake (pure: no I/O), reassembled across records however they were split, or
//! from QUIC's Initial packets (`quic.rs`); and the server name it asks for, which picks the
//! certificate.

use std::fmt::Write as _;

/// The largest ClientHello read: far above any real one (a post-quantum key share makes
/// Chrome's about 2 KiB); a larger one is not fingerprinted.
pub const MAX_HELLO_BYTES: usize = 64 * 1024;

const HANDSHAKE_RECORD: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;
/// A record's payload is at most 2^14 bytes, plus what compression could add (RFC 5246).
const MAX_RECORD_PAYLOAD: usize = (1 << 14) + 2048;

const SERVER_NAME: u16 = 0x0000;
const SIGNATURE_ALGORITHMS: u16 = 0x000d;
const ALPN: u16 = 0x0010;
const SUPPORTED_VERSIONS: u16 = 0x002b;

/// What the bytes read so far hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// The whole ClientHello message (without record or handshake headers).
    Complete(Vec<u8>),
    /// The start of one: more bytes are needed.
    Partial,
    /// Not a TLS ClientHello, or one too large or malformed to read.
    Unreadable,
}

/// Reassembles the first handshake message from the TLS records at the start of `bytes`.
pub fn reassemble(bytes: &[u8]) -> Hello {
    let mut message = Vec::new();
    let mut rest = bytes;
    loop {
        let Some(header) = rest.get(..5) else {
            return Hello::Partial;
        };
        // A record of another type, or an SSLv2-style hello (its first byte has the high bit),
        // or a version TLS never wrote.
        if header[0] != HANDSHAKE_RECORD || header[1] != 0x03 {
            return Hello::Unreadable;
        }
        let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if length == 0 || length > MAX_RECORD_PAYLOAD {
            return Hello::Unreadable;
        }
        let Some(payload) = rest.get(5..5 + length) else {
            // The record is still arriving; its first bytes may already say what it is.
            let arrived = &rest[5..];
            message.extend_from_slice(arrived);
            return match message.first() {
                Some(&kind) if kind != CLIENT_HELLO => Hello::Unreadable,
                _ => Hello::Partial,
            };
        };
        message.extend_from_slice(payload);
        rest = &rest[5 + length..];
        if message[0] != CLIENT_HELLO {
            return Hello::Unreadable;
        }
        if message.len() >= 4 {
            let declared = usize::from(message[1]) << 16
                | usize::from(message[2]) << 8
                | usize::from(message[3]);
            if declared > MAX_HELLO_BYTES {
                return Hello::Unreadable;
            }
            if message.len() >= 4 + declared {
                message.truncate(4 + declared);
                message.drain(..4);
                return Hello::Complete(message);
            }
        }
    }
}

/// The fields of a ClientHello that JA4 reads.
#[derive(Debug, Default, PartialEq, Eq)]
struct ClientHello {
    legacy_version: u16,
    ciphers: Vec<u16>,
    /// In the order sent, GREASE included.
    extensions: Vec<u16>,
    supported_versions: Vec<u16>,
    signature_algorithms: Vec<u16>,
    first_alpn: Option<Vec<u8>>,
    /// Whether ALPN offers `acme-tls/1` alone: an ACME server's tls-alpn-01 validation.
    acme_alpn_only: bool,
    /// The first `host_name` of the server name extension.
    server_name: Option<Vec<u8>>,
}

/// A cursor over a message, every read bounded by what is there.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let taken = self.0.get(..count)?;
        self.0 = &self.0[count..];
        Some(taken)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|byte| byte[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2)
            .map(|bytes| u16::from_be_bytes([bytes[0], bytes[1]]))
    }
    /// A vector with a one- or two-byte length in front.
    fn vector8(&mut self) -> Option<&'a [u8]> {
        let length = self.u8()?;
        self.take(usize::from(length))
    }
    fn vector16(&mut self) -> Option<&'a [u8]> {
        let length = self.u16()?;
        self.take(usize::from(length))
    }
}

fn u16_list(bytes: &[u8]) -> Option<Vec<u16>> {
    if bytes.len() % 2 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(2)
            .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
            .collect(),
    )
}

/// Reads a ClientHello message; `None` when it does not parse whole, or names an extension
/// twice (which TLS forbids: the handshake fails anyway).
fn parse(message: &[u8]) -> Option<ClientHello> {
    let mut reader = Reader(message);
    let mut hello = ClientHello {
        legacy_version: reader.u16()?,
        ..ClientHello::default()
    };
    reader.take(32)?;
    reader.vector8()?;
    hello.ciphers = u16_list(reader.vector16()?)?;
    reader.vector8()?;
    if reader.0.is_empty() {
        return Some(hello);
    }
    let mut extensions = Reader(reader.vector16()?);
    if !reader.0.is_empty() {
        return None;
    }
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector16()?;
        if hello.extensions.contains(&kind) {
            return None;
        }
        hello.extensions.push(kind);
        match kind {
            SUPPORTED_VERSIONS => {
                hello.supported_versions = u16_list(Reader(data).vector8()?)?;
            }
            SIGNATURE_ALGORITHMS => {
                hello.signature_algorithms = u16_list(Reader(data).vector16()?)?;
            }
            // Read apart: a name that does not parse leaves the fingerprint as it was.
            SERVER_NAME => hello.server_name = first_host_name(data),
            ALPN => {
                let mut list = Reader(Reader(data).vector16()?);
                hello.first_alpn = list.vector8().map(<[u8]>::to_vec);
                hello.acme_alpn_only =
                    hello.first_alpn.as_deref() == Some(b"acme-tls/1") && list.0.is_empty();
            }
            _ => {}
        }
    }
    Some(hello)
}

/// The first `host_name` entry of a server name list (RFC 6066).
fn first_host_name(data: &[u8]) -> Option<Vec<u8>> {
    let mut list = Reader(Reader(data).vector16()?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let name = list.vector16()?;
        if kind == 0 {
            return Some(name.to_vec());
        }
    }
    None
}

/// GREASE (RFC 8701): 0x0a0a, 0x1a1a, … 0xfafa.
fn is_grease(value: u16) -> bool {
    value & 0x0f0f == 0x0a0a && value >> 8 == value & 0xff
}

/// The host name a ClientHello message asks for, lower-cased; `None` when it asks for none,
/// names something other than ASCII text, or does not parse.
pub fn server_name(message: &[u8]) -> Option<String> {
    let name = parse(message)?.server_name?;
    let name = String::from_utf8(name).ok()?;
    name.is_ascii().then(|| name.to_ascii_lowercase())
}

/// Whether a ClientHello message offers ALPN `acme-tls/1` alone (RFC 8737's validation).
pub fn asks_acme_challenge(message: &[u8]) -> bool {
    parse(message).is_some_and(|hello| hello.acme_alpn_only)
}

/// The JA4 fingerprint of a ClientHello message sent over TCP; `None` when it does not parse.
pub fn fingerprint(message: &[u8]) -> Option<String> {
    fingerprint_over(message, Transport::Tcp)
}

/// The JA4 fingerprint of a ClientHello message sent in QUIC Initial packets (`q`).
pub fn quic_fingerprint(message: &[u8]) -> Option<String> {
    fingerprint_over(message, Transport::Quic)
}

/// What carried the hello: JA4's first letter.
#[derive(Clone, Copy)]
enum Transport {
    Tcp,
    Quic,
}

fn fingerprint_over(message: &[u8], transport: Transport) -> Option<String> {
    let hello = parse(message)?;
    let version = hello
        .supported_versions
        .iter()
        .copied()
        .filter(|version| !is_grease(*version))
        .max()
        .unwrap_or(hello.legacy_version);
    let version = match version {
        0x0304 => "13",
        0x0303 => "12",
        0x0302 => "11",
        0x0301 => "10",
        0x0300 => "s3",
        0x0002 => "s2",
        0xfeff => "d1",
        0xfefd => "d2",
        0xfefc => "d3",
        _ => "00",
    };
    let ciphers: Vec<u16> = hello
        .ciphers
        .into_iter()
        .filter(|c| !is_grease(*c))
        .collect();
    let extensions: Vec<u16> = hello
        .extensions
        .into_iter()
        .filter(|e| !is_grease(*e))
        .collect();
    let sni = if extensions.contains(&SERVER_NAME) {
        'd'
    } else {
        'i'
    };
    let mut text = String::with_capacity(36);
    let _ = write!(
        text,
        "{}{version}{sni}{:02}{:02}{}_",
        match transport {
            Transport::Tcp => 't',
            Transport::Quic => 'q',
        },
        ciphers.len().min(99),
        extensions.len().min(99),
        alpn_ends(hello.first_alpn.as_deref())
    );
    let mut sorted_ciphers = ciphers;
    sorted_ciphers.sort_unstable();
    text.push_str(&truncated_hash(&hex_list(&sorted_ciphers)));
    text.push('_');
    let mut hashed: Vec<u16> = extensions
        .into_iter()
        .filter(|e| *e != SERVER_NAME && *e != ALPN)
        .collect();
    hashed.sort_unstable();
    if hashed.is_empty() {
        text.push_str("000000000000");
        return Some(text);
    }
    let mut listed = hex_list(&hashed);
    let signatures: Vec<u16> = hello
        .signature_algorithms
        .into_iter()
        .filter(|s| !is_grease(*s))
        .collect();
    if !signatures.is_empty() {
        listed.push('_');
        listed.push_str(&hex_list(&signatures));
    }
    text.push_str(&truncated_hash(&listed));
    Some(text)
}

/// The first and last character of the first ALPN value: printable ASCII as it is, a byte
/// from 0x80 as `9`; `99` when either end is a control character, `00` without one.
fn alpn_ends(first: Option<&[u8]>) -> String {
    let end = |byte: u8| match byte {
        0x20..=0x7e => Some(char::from(byte)),
        0x80.. => Some('9'),
        _ => None,
    };
    match first {
        Some([first_byte, .., last_byte]) | Some([first_byte @ last_byte]) => {
            match (end(*first_byte), end(*last_byte)) {
                (Some(first), Some(last)) => [first, last].iter().collect(),
                _ => "99".to_owned(),
            }
        }
        _ => "00".to_owned(),
    }
}

fn hex_list(values: &[u16]) -> String {
    let mut text = String::with_capacity(values.len() * 5);
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            text.push(',');
        }
        let _ = write!(text, "{value:04x}");
    }
    text
}

/// The first 12 hex digits of the SHA-256 of `text`; twelve zeros for an empty list.
fn truncated_hash(text: &str) -> String {
    if text.is_empty() {
        return "000000000000".to_owned();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut hex = String::with_capacity(12);
    for byte in &digest.as_ref()[..6] {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[cfg(test)]
mod tests;

pub mod quic;
