//! Keyed hashes of the values requests carry: what a store keeps instead of an email or a
//! token. Each thread remembers the digest of its last short value (a flood repeats one).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hashes request-derived key values with a secret, so stored keys reveal nothing.
#[derive(Clone)]
pub struct KeyHasher {
    key: [u8; 32],
    /// Tells this hasher's remembered digests from another's (see [`KeyHasher::digest`]).
    identity: u64,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(..)")
    }
}

impl KeyHasher {
    /// Derives the hashing key from a secret of any length.
    pub fn from_secret(secret: &[u8]) -> KeyHasher {
        static MADE: AtomicU64 = AtomicU64::new(0);
        KeyHasher {
            key: blake3::derive_key("tollgate 2026 request key values", secret),
            identity: MADE.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A new random secret, as 64 hexadecimal digits (for a hasher whose secret is kept).
    pub fn random_secret() -> String {
        let mut secret = [0u8; 32];
        if getrandom::getrandom(&mut secret).is_err() {
            // Without an entropy source, fall back to values that still differ per process.
            let fallback = format!(
                "{:?}{}",
                crate::limit::clock::system_time(),
                std::process::id()
            );
            secret = blake3::hash(fallback.as_bytes()).into();
        }
        let mut hex = [0u8; 64];
        crate::hex::write_hex(&secret, &mut hex);
        String::from_utf8_lossy(&hex).into_owned()
    }

    /// A key that lives as long as the process (enough for the memory store).
    pub fn random() -> KeyHasher {
        KeyHasher::from_secret(Self::random_secret().as_bytes())
    }

    /// The value's keyed digest. A flood sends one key again and again, and hashing it is the
    /// largest single cost of refusing it, so each thread keeps its last short value's digest.
    /// A repeated value is answered sooner; that tells a client only whether its own value was
    /// the last one hashed on the thread, which a store's lookups (a known key against a new
    /// one) tell as well.
    pub fn digest(&self, value: &[u8]) -> [u8; 16] {
        thread_local! {
            static LAST: RefCell<Option<LastDigest>> = const { RefCell::new(None) };
        }
        if value.len() > REMEMBERED {
            return self.hash(value);
        }
        LAST.with_borrow_mut(|last| match last {
            Some(last) if last.holds(self.identity, value) => last.digest,
            _ => {
                let digest = self.hash(value);
                *last = Some(LastDigest::new(self.identity, value, digest));
                digest
            }
        })
    }

    pub(super) fn hash(&self, value: &[u8]) -> [u8; 16] {
        let hash = blake3::keyed_hash(&self.key, value);
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&hash.as_bytes()[..16]);
        digest
    }
}

/// Values up to this length are remembered with their digest (header values, account ids).
pub(super) const REMEMBERED: usize = 64;

/// One value a thread hashed last, and by which hasher.
struct LastDigest {
    hasher: u64,
    length: usize,
    value: [u8; REMEMBERED],
    digest: [u8; 16],
}

impl LastDigest {
    fn new(hasher: u64, value: &[u8], digest: [u8; 16]) -> LastDigest {
        let mut kept = [0u8; REMEMBERED];
        kept[..value.len()].copy_from_slice(value);
        LastDigest {
            hasher,
            length: value.len(),
            value: kept,
            digest,
        }
    }

    /// Compared whole, not up to the first difference: how long the comparison takes says
    /// nothing of how much of a value was guessed right.
    fn holds(&self, hasher: u64, value: &[u8]) -> bool {
        self.hasher == hasher
            && self.length == value.len()
            && self.value[..self.length]
                .iter()
                .zip(value)
                .fold(0, |differing, (a, b)| differing | (a ^ b))
                == 0
    }
}
