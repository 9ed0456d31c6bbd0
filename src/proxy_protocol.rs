//! The PROXY protocol (v1 text, v2 binary) that HAProxy and cloud load balancers send before
//! a connection's first byte: how far its header reaches, and the client it names. The header
//! itself is parsed by `ppp`; this module decides how much of a connection is header, so that
//! not a byte of the request behind it is read, and what the header means here.

use std::net::SocketAddr;

use ppp::{v1, v2};

/// How every v2 header begins.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v2 header's fixed part: the signature, version and command, family, and length.
pub const V2_FIXED: usize = 16;
/// The longest v1 header, its CRLF included.
pub const V1_MAX: usize = 107;

/// Which version a connection's first byte announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A connection's beginning that is not a valid PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HeaderError(pub String);

/// The version the first byte announces: `P` of `PROXY`, or `\r` of v2's signature.
pub fn version(first: u8) -> Result<Version, HeaderError> {
    match first {
        b'P' => Ok(Version::V1),
        b'\r' => Ok(Version::V2),
        other => Err(HeaderError(format!(
            "the connection began with {:?}, not a PROXY header",
            char::from(other)
        ))),
    }
}

/// A v2 header's whole length, from its fixed part.
pub fn v2_length(fixed: &[u8; V2_FIXED]) -> Result<usize, HeaderError> {
    if &fixed[..12] != V2_SIGNATURE {
        return Err(HeaderError(
            "the connection began with \\r but not v2's signature".to_owned(),
        ));
    }
    Ok(V2_FIXED + usize::from(u16::from_be_bytes([fixed[14], fixed[15]])))
}

/// Where a v1 header that begins `bytes` ends (past its CRLF), if it ends there.
pub fn v1_end(bytes: &[u8]) -> Option<usize> {
    let within = &bytes[..bytes.len().min(V1_MAX)];
    within
        .windows(2)
        .position(|pair| pair == b"\r\n")
        .map(|at| at + 2)
}

/// The client a whole header names; `None` keeps the peer's address: v2's `LOCAL` (a load
/// balancer's health check), v1's `UNKNOWN`, and addresses that are not IP (a UNIX socket,
/// none given).
pub fn client(header: &[u8]) -> Result<Option<SocketAddr>, HeaderError> {
    let malformed =
        |error: &dyn std::fmt::Display| HeaderError(format!("a malformed PROXY header: {error}"));
    match version(*header.first().unwrap_or(&0))? {
        Version::V1 => {
            let parsed = v1::Header::try_from(header).map_err(|error| malformed(&error))?;
            if parsed.header.len() != header.len() {
                return Err(HeaderError(
                    "bytes after the PROXY header's CRLF".to_owned(),
                ));
            }
            Ok(match parsed.addresses {
                v1::Addresses::Tcp4(addresses) => Some(SocketAddr::from((
                    addresses.source_address,
                    addresses.source_port,
                ))),
                v1::Addresses::Tcp6(addresses) => Some(SocketAddr::from((
                    addresses.source_address,
                    addresses.source_port,
                ))),
                v1::Addresses::Unknown => None,
            })
        }
        Version::V2 => {
            let parsed = v2::Header::try_from(header).map_err(|error| malformed(&error))?;
            if parsed.command == v2::Command::Local {
                return Ok(None);
            }
            Ok(match parsed.addresses {
                v2::Addresses::IPv4(addresses) => Some(SocketAddr::from((
                    addresses.source_address,
                    addresses.source_port,
                ))),
                v2::Addresses::IPv6(addresses) => Some(SocketAddr::from((
                    addresses.source_address,
                    addresses.source_port,
                ))),
                v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{client, v1_end, v2_length, version, Version, V2_FIXED};

    /// A v2 header: `command` 0x20 LOCAL or 0x21 PROXY, `family` 0x11 TCP4 or 0x21 TCP6, then
    /// the address block and any TLVs.
    fn v2(command: u8, family: u8, rest: &[u8]) -> Vec<u8> {
        let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        header.push(command);
        header.push(family);
        header.extend_from_slice(&u16::try_from(rest.len()).unwrap().to_be_bytes());
        header.extend_from_slice(rest);
        header
    }

    fn tcp4(source: [u8; 4], port: u16) -> Vec<u8> {
        let mut block = source.to_vec();
        block.extend_from_slice(&[192, 0, 2, 1]);
        block.extend_from_slice(&port.to_be_bytes());
        block.extend_from_slice(&443u16.to_be_bytes());
        block
    }

    #[test]
    fn v1_names_the_client_of_tcp4_and_tcp6_and_unknown_keeps_the_peer() {
        let header = b"PROXY TCP4 203.0.113.7 192.0.2.1 56324 443\r\n";
        assert_eq!(
            v1_end(b"PROXY TCP4 203.0.113.7 192.0.2.1 56324 443\r\nGET / HTTP/1.1"),
            Some(header.len())
        );
        assert_eq!(
            client(header).unwrap(),
            Some("203.0.113.7:56324".parse().unwrap())
        );
        let header = b"PROXY TCP6 2001:db8::7 2001:db8::1 56324 443\r\n";
        assert_eq!(
            client(header).unwrap(),
            Some("[2001:db8::7]:56324".parse().unwrap())
        );
        assert_eq!(client(b"PROXY UNKNOWN\r\n").unwrap(), None);
    }

    #[test]
    fn v2_names_the_client_past_its_tlvs_and_local_keeps_the_peer() {
        // An ALPN TLV (type 1) after the addresses.
        let mut rest = tcp4([203, 0, 113, 7], 56324);
        rest.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']);
        let header = v2(0x21, 0x11, &rest);
        let fixed: [u8; V2_FIXED] = header[..V2_FIXED].try_into().unwrap();
        assert_eq!(v2_length(&fixed).unwrap(), header.len());
        assert_eq!(
            client(&header).unwrap(),
            Some("203.0.113.7:56324".parse().unwrap())
        );
        let mut block = [0u8; 36];
        block[..16].copy_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        block[32..34].copy_from_slice(&1234u16.to_be_bytes());
        assert_eq!(
            client(&v2(0x21, 0x21, &block)).unwrap(),
            Some("[2001:db8::7]:1234".parse().unwrap())
        );
        assert_eq!(client(&v2(0x20, 0x00, &[])).unwrap(), None);
    }

    #[test]
    fn what_is_not_a_header_is_refused() {
        assert!(version(b'G').is_err(), "a request without a header");
        assert_eq!(version(b'P'), Ok(Version::V1));
        let mut fixed = [0u8; V2_FIXED];
        fixed[..2].copy_from_slice(b"\r\n");
        assert!(v2_length(&fixed).is_err(), "a request after an empty line");
        for bad in [
            &b"PROXY TCP4 203.0.113.7 192.0.2.1 56324\r\n"[..],
            b"PROXY TCP4 203.0.113.300 192.0.2.1 56324 443\r\n",
            b"PROXY TCP9 a b 1 2\r\n",
            b"PROXY TCP4 203.0.113.7 192.0.2.1 56324 443\n",
        ] {
            assert!(client(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        // A v2 length that lies: four bytes of addresses for TCP4's twelve.
        assert!(client(&v2(0x21, 0x11, &[203, 0, 113, 7])).is_err());
        // A v2 header of version 1, and an unknown command.
        assert!(client(&v2(0x11, 0x11, &tcp4([203, 0, 113, 7], 1))).is_err());
        assert!(client(&v2(0x2f, 0x11, &tcp4([203, 0, 113, 7], 1))).is_err());
        // Too long for v1: no CRLF within 107 bytes.
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(120));
        assert_eq!(v1_end(long.as_bytes()), None);
    }
}
