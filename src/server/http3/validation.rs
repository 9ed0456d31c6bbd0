//! Whether a new QUIC connection must prove its address before the gateway spends a handshake
//! on it: a Retry costs one stateless packet, a handshake costs keys and a certificate's
//! signature, so a flood of spoofed Initials must only ever earn Retries.

/// Handshakes in progress beyond which every new connection is asked for a Retry first.
pub(crate) const MAX_HANDSHAKES: usize = 1000;

/// What a new connection's first packet gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstPacket {
    /// A Retry: the client must echo its token from the address it claims.
    Retry,
    /// The handshake.
    Handshake,
}

/// `validated`: the packet carries a token the endpoint issued to this address;
/// `handshakes`: handshakes in progress now; `network_exhausted`: the client's network has
/// no new connection left in `[server.connections] per_network`.
pub(crate) fn first_packet(
    validated: bool,
    handshakes: usize,
    network_exhausted: bool,
) -> FirstPacket {
    if !validated && (handshakes >= MAX_HANDSHAKES || network_exhausted) {
        FirstPacket::Retry
    } else {
        FirstPacket::Handshake
    }
}

#[cfg(test)]
mod tests {
    use super::{first_packet, FirstPacket, MAX_HANDSHAKES};

    #[test]
    fn unproven_addresses_get_retries_only_under_pressure() {
        assert_eq!(first_packet(false, 0, false), FirstPacket::Handshake);
        assert_eq!(
            first_packet(false, MAX_HANDSHAKES - 1, false),
            FirstPacket::Handshake
        );
        assert_eq!(
            first_packet(false, MAX_HANDSHAKES, false),
            FirstPacket::Retry
        );
        assert_eq!(first_packet(false, 0, true), FirstPacket::Retry);
    }

    #[test]
    fn a_proven_address_is_never_asked_twice() {
        assert_eq!(
            first_packet(true, MAX_HANDSHAKES * 10, true),
            FirstPacket::Handshake
        );
    }
}
