//! `X-Request-Id`: the client's when it is reasonable, else one made here from a random
//! per-process prefix and a counter.

use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderValue;

use crate::hex::write_hex;

pub(crate) const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
/// As a static, for `SetFields` and `upstream::Forwarding`, which hand out references to it.
pub(crate) static REQUEST_ID_NAME: http::HeaderName = X_REQUEST_ID;

/// A request's `X-Request-Id`: the client's, or one made here, kept inline (a header value
/// would cost an allocation per request, and another at its first clone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestId {
    /// Visible ASCII, at most 128 bytes.
    Client(HeaderValue),
    /// 32 lower-case hexadecimal digits.
    Made([u8; 32]),
}

impl RequestId {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Client(value) => value.as_bytes(),
            RequestId::Made(digits) => digits,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub fn to_header_value(&self) -> HeaderValue {
        match self {
            RequestId::Client(value) => value.clone(),
            RequestId::Made(digits) => {
                HeaderValue::from_bytes(digits).unwrap_or_else(|_| HeaderValue::from_static("-"))
            }
        }
    }
}

/// Makes request ids: the first 16 of their 32 hex digits are random per process, the rest
/// count.
#[derive(Debug)]
pub(crate) struct RequestIds {
    prefix: [u8; 16],
    counter: AtomicU64,
}

impl RequestIds {
    pub(crate) fn new() -> RequestIds {
        let mut random = [0u8; 8];
        let _ = getrandom::getrandom(&mut random);
        let mut prefix = [0u8; 16];
        write_hex(&random, &mut prefix);
        RequestIds {
            prefix,
            counter: AtomicU64::new(0),
        }
    }

    /// The client's `X-Request-Id` if it is reasonable, else a new one.
    pub(crate) fn for_request(&self, client: Option<&HeaderValue>) -> RequestId {
        if let Some(id) = client {
            if !id.is_empty() && id.len() <= 128 && id.to_str().is_ok() {
                return RequestId::Client(id.clone());
            }
        }
        let sequence = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut hex = [0u8; 32];
        hex[..16].copy_from_slice(&self.prefix);
        write_hex(&sequence.to_be_bytes(), &mut hex[16..]);
        RequestId::Made(hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_the_prefix_then_the_sequence_in_hexadecimal() {
        let ids = RequestIds::new();
        let first = ids.for_request(None);
        let second = ids.for_request(None);
        let (first, second) = (first.as_str(), second.as_str());
        assert_eq!(first.len(), 32);
        assert_eq!(first[..16], second[..16], "one prefix per process");
        assert_eq!(&first[16..], "0000000000000000");
        assert_eq!(&second[16..], "0000000000000001");
        assert!(first.bytes().all(|byte| byte.is_ascii_hexdigit()));
    }

    #[test]
    fn a_reasonable_client_id_is_kept_and_others_are_replaced() {
        let ids = RequestIds::new();
        let kept = HeaderValue::from_static("abc-123");
        assert_eq!(
            ids.for_request(Some(&kept)),
            RequestId::Client(kept.clone())
        );
        let long = HeaderValue::from_str(&"x".repeat(129)).unwrap();
        let empty = HeaderValue::from_static("");
        let binary = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        for rejected in [long, empty, binary] {
            assert!(matches!(
                ids.for_request(Some(&rejected)),
                RequestId::Made(_)
            ));
        }
    }
}
