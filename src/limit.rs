//! Limits: the bucket math, the keys buckets are stored under, and the stores that hold them.
//!
//! The gateway asks its [`Store`] for one decision covering all of a request's buckets, so
//! that a store shared by replicas can make it in one indivisible step.

pub mod adaptive;
pub mod ban;
pub mod breaker;
pub mod bucket;
pub mod calendar;
pub mod clock;
pub mod concurrency;
pub mod deny_cache;
pub mod lease;
pub mod memory;
pub mod redis;

use std::fmt;
use std::sync::Arc;

use ipnet::IpNet;

pub use adaptive::{AdaptiveParams, AdaptiveState};
pub use bucket::{BucketState, Charge, QuotaPeriod, Verdict};
pub use clock::{Clock, Reading, Timestamp};
pub use memory::MemoryStore;
pub use redis::{RedisStore, Refund, SlotLeases};

/// A key's parts: one for most limits, two for a composite key, kept inline up to that.
pub type KeyParts = smallvec::SmallVec<[KeyPart; 2]>;

/// One component of a bucket key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The client's network (`client_network`), kept in clear: it is what operators look for.
    Network(IpNet),
    /// A keyed hash of a value taken from the request (header, query, cookie, body field,
    /// TLS fingerprint).
    Digest([u8; 16]),
    /// The client's autonomous system (`client_asn`), in clear like its network.
    Asn(u32),
    /// The client's country (`client_country`).
    Country(crate::geoip::Country),
}

impl KeyPart {
    /// Appends the part as store keys spell it: `v4:203.0.113.0/24`, `v6:2001:db8::/64`,
    /// `as:64500`, `cc:DE`, `h:` and 32 hex digits. Written without the formatting machinery: the Redis store
    /// spells every bucket key of every request.
    pub fn push_to(&self, out: &mut String) {
        use fmt::Write as _;
        match self {
            // The common case, spelled without the formatting machinery.
            KeyPart::Network(IpNet::V4(net)) => {
                out.push_str("v4:");
                let mut number = itoa::Buffer::new();
                for (index, octet) in net.addr().octets().into_iter().enumerate() {
                    if index > 0 {
                        out.push('.');
                    }
                    out.push_str(number.format(octet));
                }
                out.push('/');
                out.push_str(number.format(net.prefix_len()));
            }
            KeyPart::Network(IpNet::V6(net)) => {
                out.push_str("v6:");
                let _ = write!(out, "{net}");
            }
            KeyPart::Digest(digest) => {
                out.push_str("h:");
                let mut hex = [0u8; 32];
                crate::hex::write_hex(digest, &mut hex);
                out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
            }
            KeyPart::Asn(asn) => {
                out.push_str("as:");
                out.push_str(itoa::Buffer::new().format(*asn));
            }
            KeyPart::Country(country) => {
                out.push_str("cc:");
                out.push_str(country.as_str());
            }
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.push_to(&mut text);
        f.write_str(&text)
    }
}

/// The identity of one bucket: which limit (and which definition of it), and whose.
///
/// It borrows the limit's name from the policy: a request's keys live no longer than its
/// decision, and a shared name would cost two locked instructions per bucket (its count).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey<'a> {
    pub limit: &'a str,
    /// Changes whenever the limit's definition changes, so a redefined limit starts fresh.
    pub fingerprint: u64,
    /// Empty for a `global` limit.
    pub parts: KeyParts,
}

impl BucketKey<'_> {
    /// Appends `<limit>:<key>`, the store key without its prefix.
    pub fn push_to(&self, out: &mut String) {
        out.push_str(self.limit);
        out.push(':');
        self.push_key_to(out);
    }

    /// Appends the key alone (`global`, `v4:203.0.113.0/24`, `h:…`, parts joined by `|`).
    pub fn push_key_to(&self, out: &mut String) {
        push_parts(&self.parts, out);
    }
}

/// Appends a key's parts as store keys and the access log spell them: `global` for none,
/// else each part, joined by `|`.
pub fn push_parts(parts: &[KeyPart], out: &mut String) {
    if parts.is_empty() {
        out.push_str("global");
    }
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            out.push('|');
        }
        part.push_to(out);
    }
}

/// A key's parts read back from their spelling ([`push_parts`]); `None` for anything else.
pub fn parse_parts(text: &str) -> Option<KeyParts> {
    if text == "global" {
        return Some(KeyParts::new());
    }
    text.split('|').map(parse_part).collect()
}

fn parse_part(text: &str) -> Option<KeyPart> {
    let (kind, value) = text.split_once(':')?;
    Some(match kind {
        "v4" => KeyPart::Network(IpNet::V4(value.parse().ok()?)),
        "v6" => KeyPart::Network(IpNet::V6(value.parse().ok()?)),
        "as" if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) => {
            KeyPart::Asn(value.parse().ok()?)
        }
        "cc" => KeyPart::Country(crate::geoip::Country::parse(value)?),
        "h" if value.len() == 32 => {
            let mut digest = [0u8; 16];
            for (byte, pair) in digest.iter_mut().zip(value.as_bytes().chunks(2)) {
                *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
            }
            KeyPart::Digest(digest)
        }
        _ => return None,
    })
}

impl fmt::Display for BucketKey<'_> {
    /// `<limit>:<key>` — the store key without its prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.push_to(&mut text);
        f.write_str(&text)
    }
}

/// One bucket of a request, with what it is charged.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRequest<'a> {
    pub key: BucketKey<'a>,
    /// The configured capacity and rate (the store applies the key's adaptive penalty).
    pub charge: Charge,
    pub adaptive: Option<AdaptiveParams>,
    /// The limit's token lease (`lease`): Redis hands this replica tokens in batches.
    pub lease: Option<std::time::Duration>,
    /// The limit's ban rule (`[limits.NAME.ban]`).
    pub ban: Option<ban::Ban>,
}

/// What happens to one bucket after the upstream answered.
#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeRequest<'a> {
    pub key: BucketKey<'a>,
    /// The configured capacity and rate; `cost` is the extra charge (0 for none).
    pub charge: Charge,
    pub adaptive: Option<AdaptiveParams>,
    /// The status counts as an error for the key's adaptive penalty.
    pub error: bool,
}

/// One verdict per bucket of a request, inline for the usual handful.
pub type Verdicts = smallvec::SmallVec<[Verdict; 4]>;

/// A store's answer for all of a request's buckets, with one verdict per bucket in the order
/// they were asked.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreVerdict {
    /// Every enforcing bucket could pay; each bucket that could pay was charged.
    Admit(Verdicts),
    /// An enforcing bucket could not pay; nothing was charged.
    Refuse(Verdicts),
}

impl StoreVerdict {
    pub fn new(admitted: bool, verdicts: Verdicts) -> StoreVerdict {
        if admitted {
            StoreVerdict::Admit(verdicts)
        } else {
            StoreVerdict::Refuse(verdicts)
        }
    }

    pub fn is_admitted(&self) -> bool {
        matches!(self, StoreVerdict::Admit(_))
    }

    pub fn verdicts(&self) -> &[Verdict] {
        match self {
            StoreVerdict::Admit(verdicts) | StoreVerdict::Refuse(verdicts) => verdicts,
        }
    }
}

/// A key's state as an operator looks it up: what its next decision would find.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyState {
    pub tokens: f64,
    /// The capacity in force (after an adaptive penalty).
    pub capacity: f64,
    /// An adaptive penalty in force: its multiplier and when it ends (Unix seconds).
    pub penalty: Option<(f64, f64)>,
    /// A ban in force: when it ends (Unix seconds).
    pub banned_until: Option<f64>,
}

/// Why a store call decided nothing. The gateway branches on the circuit (no call was made,
/// nothing new to report) against the rest; all of them are the store's doing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No answer within `[store] timeout`.
    #[error("store call timed out")]
    Timeout,
    /// The connection failed, or Redis answered with an error.
    #[error("redis: {0}")]
    Redis(String),
    /// Redis answered what the scripts never send.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    /// The store cannot be set up (its URL or CA file).
    #[error("{0}")]
    Setup(String),
    /// The circuit breaker is open: no call was made.
    #[error("store unavailable (circuit open)")]
    Unavailable,
}

/// Where buckets live.
#[derive(Debug)]
pub enum Store {
    Memory(MemoryStore),
    Redis(Arc<RedisStore>),
}

/// A request's slots of concurrency limits, in the store that gave them: given back when
/// dropped (with the response body that carries them).
#[derive(Debug)]
pub enum Held {
    /// This process's (the memory store, or `on_store_failure = "local"`).
    Local(#[allow(dead_code)] concurrency::HeldSlots),
    /// Leases in Redis, shared by every replica.
    Leases(#[allow(dead_code)] SlotLeases),
}

impl Store {
    /// Decides a request against all of its buckets at once: admitted only if every enforcing
    /// bucket can pay, and then every bucket that can pay is charged. The memory store decides
    /// at `now`, the request's reading; Redis at its servers' time.
    pub async fn decide(
        &self,
        requests: &[BucketRequest<'_>],
        now: &Reading,
    ) -> Result<StoreVerdict, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.decide_at(requests, store.clock().at(now))),
            // Boxed so that the memory store's callers do not carry the Redis call's state.
            Store::Redis(store) => Box::pin(store.decide(requests)).await,
        }
    }

    /// The calendar time (Unix seconds) quotas are placed in: the store's clock, and with
    /// Redis, as the servers' `TIME` reads it (estimated from their replies).
    pub fn calendar_now(&self) -> f64 {
        match self {
            Store::Memory(store) => store.clock().unix(),
            Store::Redis(store) => store.calendar_now(),
        }
    }

    /// The `backend` label of store metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// Whether the store can take decisions now (`/readyz`).
    pub async fn ready(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(store) => store.ping().await,
        }
    }

    /// Applies outcome charges and counts adaptive errors; returns, per request, whether the
    /// key tripped a penalty.
    pub async fn record_outcomes(
        &self,
        requests: &[OutcomeRequest<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.record_outcomes(requests)),
            Store::Redis(store) => Box::pin(store.record_outcomes(requests)).await,
        }
    }

    /// A key's state now (a key never seen reads as full).
    pub async fn inspect(
        &self,
        key: &BucketKey<'_>,
        charge: &Charge,
        params: Option<&AdaptiveParams>,
    ) -> Result<KeyState, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.inspect(key, charge, params)),
            Store::Redis(store) => store.inspect(key, charge, params).await,
        }
    }

    /// Forgets a key's bucket and penalty: it is full again (with Redis, for every replica).
    pub async fn forget(&self, key: &BucketKey<'_>) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => {
                store.forget(key);
                Ok(())
            }
            Store::Redis(store) => store.forget(key).await,
        }
    }

    /// Drops state that carries no information any more (full buckets).
    pub fn sweep(&self) {
        match self {
            Store::Memory(store) => store.sweep(),
            // Redis expires its keys itself (PEXPIRE).
            Store::Redis(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_spell_limit_and_parts() {
        let key = |parts: KeyParts| BucketKey {
            limit: "login",
            fingerprint: 7,
            parts,
        };
        let mut digest = [0u8; 16];
        digest[0] = 0x0f;
        digest[1] = 0xa0;
        digest[15] = 0xff;
        let composite = key(smallvec::smallvec![
            KeyPart::Network("2001:db8:1:2::/64".parse().unwrap()),
            KeyPart::Digest(digest),
        ]);
        assert_eq!(
            composite.to_string(),
            "login:v6:2001:db8:1:2::/64|h:0fa000000000000000000000000000ff"
        );
        let network = key(smallvec::smallvec![KeyPart::Network(
            "203.0.113.0/24".parse().unwrap()
        )]);
        assert_eq!(network.to_string(), "login:v4:203.0.113.0/24");
        assert_eq!(key(KeyParts::new()).to_string(), "login:global");
    }

    #[test]
    fn spelled_keys_read_back_and_nothing_else_does() {
        for text in [
            "global",
            "v4:203.0.113.0/24",
            "v6:2001:db8:1:2::/64|h:0fa000000000000000000000000000ff",
            "as:64500|cc:DE",
        ] {
            let parts = parse_parts(text).unwrap();
            let mut spelled = String::new();
            push_parts(&parts, &mut spelled);
            assert_eq!(spelled, text);
        }
        for text in [
            "",
            "v4:203.0.113.0",
            "v4:2001:db8::/64",
            "h:0fa0",
            "h:0fa000000000000000000000000000fg",
            "as:+1",
            "cc:DEU",
            "v4:203.0.113.0/24|",
            "email:someone",
        ] {
            assert_eq!(parse_parts(text), None, "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn ipv4_networks_are_spelled_as_displayed(address: u32, prefix in 0u8..=32) {
            let net = ipnet::Ipv4Net::new(address.into(), prefix).unwrap();
            let mut spelled = String::new();
            KeyPart::Network(IpNet::V4(net)).push_to(&mut spelled);
            proptest::prop_assert_eq!(spelled, format!("v4:{net}"));
        }
    }
}
