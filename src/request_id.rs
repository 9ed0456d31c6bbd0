//! `X-Request-Id`: the client's when it is reasonable, else a UUIDv7 made here (RFC 9562):
//! the time in milliseconds and its fraction, then random bits, so ids sort by time and say
//! nothing of how many requests came between two of them.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// A UUIDv7 in its 36-character form, lower case.
    Made([u8; 36]),
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

/// Makes request ids. The random bits come from a keyed hash (SipHash, keyed at random per
/// process) of a counter: unpredictable without the key, unique within the process, and
/// cheaper than asking the operating system for randomness per request.
#[derive(Debug)]
pub(crate) struct RequestIds {
    key: RandomState,
    counter: AtomicU64,
}

impl RequestIds {
    pub(crate) fn new() -> RequestIds {
        RequestIds {
            key: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    /// The client's `X-Request-Id` if it is reasonable, else a new one made at `since` (the
    /// wall clock's time since the Unix epoch).
    pub(crate) fn for_request(&self, client: Option<&HeaderValue>, since: Duration) -> RequestId {
        if let Some(id) = client {
            if !id.is_empty() && id.len() <= 128 && id.to_str().is_ok() {
                return RequestId::Client(id.clone());
            }
        }
        // RFC 9562's method 3: the 12 bits after the milliseconds hold the millisecond's
        // fraction, so one keyed hash gives all the random bits left.
        let fraction = u64::from(since.subsec_nanos() % 1_000_000) * 4096 / 1_000_000;
        let sequence = self.counter.fetch_add(1, Ordering::Relaxed);
        let random = self.key.hash_one(sequence);
        RequestId::Made(uuid_v7(since.as_millis() as u64, fraction, random))
    }
}

/// A UUIDv7: 48 bits of Unix milliseconds, the version, 12 bits of `rand_a` (here the
/// millisecond's fraction), the variant, 62 random bits, written
/// `xxxxxxxx-xxxx-7xxx-yxxx-xxxxxxxxxxxx`.
fn uuid_v7(millis: u64, rand_a: u64, random: u64) -> [u8; 36] {
    let time = u128::from(millis & 0xffff_ffff_ffff) << 80;
    let version = 0x7u128 << 76;
    let rand_a = u128::from(rand_a & 0xfff) << 64;
    let variant = 0b10u128 << 62;
    let rand_b = u128::from(random & 0x3fff_ffff_ffff_ffff);
    let bytes = (time | version | rand_a | variant | rand_b).to_be_bytes();
    let mut text = [b'-'; 36];
    for (from, to) in [
        (0..4, 0..8),
        (4..6, 9..13),
        (6..8, 14..18),
        (8..10, 19..23),
        (10..16, 24..36),
    ] {
        write_hex(&bytes[from], &mut text[to]);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_uuid_v7_with_the_time_first_and_random_bits_after() {
        let ids = RequestIds::new();
        // 2022-02-22 19:22:22 UTC and 0.5 ms: RFC 9562's example time, and half a millisecond.
        let since = Duration::from_millis(0x017F_22E2_79B0) + Duration::from_micros(500);
        let made: Vec<String> = (0..1000)
            .map(|_| ids.for_request(None, since).as_str().to_owned())
            .collect();
        for id in &made {
            assert!(id.starts_with("017f22e2-79b0-7800-"), "{id}");
            assert_eq!(id.len(), 36);
            let groups: Vec<&str> = id.split('-').collect();
            let lengths: Vec<usize> = groups.iter().map(|group| group.len()).collect();
            assert_eq!(lengths, [8, 4, 4, 4, 12], "{id}");
            assert!(groups
                .concat()
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(groups[2].starts_with('7'), "version 7: {id}");
            assert!("89ab".contains(&groups[3][..1]), "RFC 9562 variant: {id}");
        }
        let unique: std::collections::HashSet<&String> = made.iter().collect();
        assert_eq!(unique.len(), made.len());
        // Consecutive ids share no run of zeros that would show a counter.
        assert!(made.iter().all(|id| !id[19..].contains("00000000")));
    }

    #[test]
    fn the_time_and_the_random_bits_land_where_rfc_9562_puts_them() {
        // RFC 9562 appendix A.6's example: 2022-02-22 19:22:22 UTC, 0x017F22E279B0 ms.
        let id = uuid_v7(0x017F_22E2_79B0, 0x0CC3, 0x18C4_DC0C_0C07_398F);
        assert_eq!(
            std::str::from_utf8(&id).unwrap(),
            "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"
        );
    }

    #[test]
    fn a_reasonable_client_id_is_kept_and_others_are_replaced() {
        let ids = RequestIds::new();
        let kept = HeaderValue::from_static("abc-123");
        assert_eq!(
            ids.for_request(Some(&kept), Duration::ZERO),
            RequestId::Client(kept.clone())
        );
        let long = HeaderValue::from_str(&"x".repeat(129)).unwrap();
        let empty = HeaderValue::from_static("");
        let binary = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        for rejected in [long, empty, binary] {
            assert!(matches!(
                ids.for_request(Some(&rejected), Duration::ZERO),
                RequestId::Made(_)
            ));
        }
    }
}
