//! W3C Trace Context (pure): a `traceparent` read and written, new ids, and the sampling
//! decision for a new trace — the same test of the trace id's low bits as OpenTelemetry's
//! `TraceIdRatioBased`, so that every tracer of a system agrees on a trace.

use std::cell::Cell;

/// A trace's context as it travels: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceParent {
    pub(crate) trace_id: [u8; 16],
    /// The id of the span that made the request.
    pub(crate) parent_id: [u8; 8],
    pub(crate) sampled: bool,
}

/// `traceparent`'s length in version 00.
pub(crate) const LENGTH: usize = 55;

impl TraceParent {
    /// Reads a `traceparent` value; `None` when it is malformed (a new trace starts then).
    pub(crate) fn parse(value: &[u8]) -> Option<TraceParent> {
        if value.len() < LENGTH {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        // Version 00 is exactly this long; a later version may add fields after a dash.
        let exact = version == 0 && value.len() == LENGTH;
        let later = version != 0 && version != 0xff && value.get(LENGTH) == Some(&b'-');
        if !(exact || later) || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        hex_into(&value[3..35], &mut trace_id)?;
        let mut parent_id = [0; 8];
        hex_into(&value[36..52], &mut parent_id)?;
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value (version 00).
    pub(crate) fn render(&self) -> [u8; LENGTH] {
        let mut out = [b'-'; LENGTH];
        out[0..2].copy_from_slice(b"00");
        hex_from(&self.trace_id, &mut out[3..35]);
        hex_from(&self.parent_id, &mut out[36..52]);
        out[53..55].copy_from_slice(if self.sampled { b"01" } else { b"00" });
        out
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    hex_from(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Each byte's two digits, looked up once: every forwarded request writes 24 bytes of ids.
const PAIRS: [[u8; 2]; 256] = {
    let mut pairs = [[0; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0x0f]];
        byte += 1;
    }
    pairs
};

fn hex_from(bytes: &[u8], out: &mut [u8]) {
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair.copy_from_slice(&PAIRS[usize::from(*byte)]);
    }
}

/// Lower-case hex digits only, as W3C requires.
fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    Some(nibble(pair[0])? << 4 | nibble(pair[1])?)
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (pair, byte) in text.chunks_exact(2).zip(out.iter_mut()) {
        *byte = hex_byte(pair)?;
    }
    Some(())
}

/// Whether a new trace with this id is sampled at `ratio`: OpenTelemetry's
/// `TraceIdRatioBased` (the id's last eight bytes, shifted right once, under `ratio · 2⁶³`).
pub(crate) fn sampled_at(ratio: f64, trace_id: &[u8; 16]) -> bool {
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < bound
}

thread_local! {
    /// A per-thread generator for ids: wyrand, seeded from the system once.
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut bytes = [0; 8];
    let _ = getrandom::getrandom(&mut bytes);
    u64::from_ne_bytes(bytes) | 1
}

fn next_random() -> u64 {
    STATE.with(|state| {
        let next = state.get().wrapping_add(0xa076_1d64_78bd_642f);
        state.set(next);
        let product = u128::from(next) * u128::from(next ^ 0xe703_7ed1_a0b4_28db);
        (product >> 64) as u64 ^ product as u64
    })
}

/// A new, non-zero span id.
pub(crate) fn new_span_id() -> [u8; 8] {
    loop {
        let id = next_random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// A new, non-zero trace id.
pub(crate) fn new_trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&next_random().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_renders_the_same() {
        let parent = TraceParent::parse(VALID.as_bytes()).unwrap();
        assert!(parent.sampled);
        assert_eq!(hex(&parent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&parent.parent_id), "00f067aa0ba902b7");
        assert_eq!(&parent.render()[..], VALID.as_bytes());
        let unsampled = VALID.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled);
        // A later version may carry more after a dash; its first fields are read.
        let later = VALID.replacen("00-", "01-", 1) + "-extra";
        assert!(TraceParent::parse(later.as_bytes()).is_some());
    }

    #[test]
    fn a_malformed_traceparent_is_none() {
        let cases = [
            "",
            "00-xyz-1-01",
            &VALID.to_uppercase(),
            &VALID.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            &VALID.replace("00f067aa0ba902b7", &"0".repeat(16)),
            &VALID.replacen("00-", "ff-", 1),
            &format!("{VALID}-extra"),
            &VALID.replace('-', "_"),
            &VALID[..54],
            &VALID.replace("-01", "-0g"),
        ];
        for case in cases {
            assert_eq!(TraceParent::parse(case.as_bytes()), None, "{case:?}");
        }
    }

    #[test]
    fn sampling_agrees_with_opentelemetry_s_ratio_test() {
        let low_id = |low: u64| {
            let mut id = [0xab; 16];
            id[8..].copy_from_slice(&low.to_be_bytes());
            id
        };
        assert!(!sampled_at(0.0, &low_id(0)));
        assert!(sampled_at(1.0, &low_id(u64::MAX)));
        assert!(sampled_at(0.5, &low_id((1 << 62) - 1)), "just under half");
        assert!(!sampled_at(0.5, &low_id(1 << 63)), "just over half");
        let sampled = (0..10_000)
            .filter(|_| sampled_at(0.01, &new_trace_id()))
            .count();
        assert!((50..200).contains(&sampled), "{sampled} of 10,000 at 1 %");
    }

    #[test]
    fn new_ids_differ() {
        let ids: std::collections::HashSet<[u8; 16]> = (0..1000).map(|_| new_trace_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert_ne!(new_span_id(), [0; 8]);
    }
}
