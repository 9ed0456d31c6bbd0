//! Why a client's TLS handshake failed, in the few words an operator can count: clients cause
//! nearly all of them, so they are counted and logged at debug level, never as warnings.

use std::io;

/// The `reason` of `tollgate_tls_handshake_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// No ClientHello, or no finished handshake, within `header_read_timeout`.
    Timeout,
    /// The client went away (or reset) before the handshake ended.
    Closed,
    /// What came first was no TLS ClientHello (such as plain HTTP to a TLS port).
    NotTls,
    /// No certificate answers the server name asked for, and there is no default.
    UnrecognizedName,
    /// No protocol version or cipher suite in common.
    Incompatible,
    /// A record or message that does not parse.
    BadRecord,
    /// The client ended the handshake with an alert (it distrusts the certificate, …).
    ClientAlert,
    /// A renegotiation attempt on a TLS 1.2 connection (refused; the connection goes on).
    Renegotiation,
    Other,
}

impl HandshakeFailure {
    pub const ALL: [HandshakeFailure; 9] = [
        HandshakeFailure::Timeout,
        HandshakeFailure::Closed,
        HandshakeFailure::NotTls,
        HandshakeFailure::UnrecognizedName,
        HandshakeFailure::Incompatible,
        HandshakeFailure::BadRecord,
        HandshakeFailure::ClientAlert,
        HandshakeFailure::Renegotiation,
        HandshakeFailure::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Closed => "closed",
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::UnrecognizedName => "unrecognized_name",
            HandshakeFailure::Incompatible => "incompatible",
            HandshakeFailure::BadRecord => "bad_record",
            HandshakeFailure::ClientAlert => "client_alert",
            HandshakeFailure::Renegotiation => "renegotiation",
            HandshakeFailure::Other => "other",
        }
    }

    /// The reason for the error a handshake ended with (rustls's errors come wrapped in
    /// `io::Error`).
    pub fn of(error: &io::Error) -> HandshakeFailure {
        let Some(tls) = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        else {
            return match error.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => HandshakeFailure::Closed,
                io::ErrorKind::TimedOut => HandshakeFailure::Timeout,
                _ => HandshakeFailure::Other,
            };
        };
        match tls {
            rustls::Error::PeerIncompatible(_) => HandshakeFailure::Incompatible,
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. }
            | rustls::Error::DecryptError
            | rustls::Error::PeerMisbehaved(_) => HandshakeFailure::BadRecord,
            rustls::Error::AlertReceived(_) => HandshakeFailure::ClientAlert,
            _ => HandshakeFailure::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_inside_io_errors_are_told_apart() {
        let wrapped = |error: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, error);
        let cases = [
            (
                wrapped(rustls::Error::PeerIncompatible(
                    rustls::PeerIncompatible::NoCipherSuitesInCommon,
                )),
                HandshakeFailure::Incompatible,
            ),
            (
                wrapped(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::InvalidContentType,
                )),
                HandshakeFailure::BadRecord,
            ),
            (
                wrapped(rustls::Error::AlertReceived(
                    rustls::AlertDescription::UnknownCA,
                )),
                HandshakeFailure::ClientAlert,
            ),
            (
                io::Error::from(io::ErrorKind::UnexpectedEof),
                HandshakeFailure::Closed,
            ),
            (
                io::Error::from(io::ErrorKind::ConnectionReset),
                HandshakeFailure::Closed,
            ),
            (io::Error::other("something else"), HandshakeFailure::Other),
        ];
        for (error, expected) in cases {
            assert_eq!(HandshakeFailure::of(&error), expected, "{error}");
        }
    }
}
