//! Tokens verified before, by the hash of the whole token: a client that sends the same token
//! on every request pays one lookup, not one signature check. Bounded, and only verified tokens
//! enter it (a flood of forged tokens cannot fill it); a reload starts an empty one with the
//! new keys.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::Claims;

/// Entries per shard; 16 shards hold 65,536 tokens (a few hundred bytes each).
const SHARD_CAPACITY: usize = 4096;
const SHARDS: usize = 16;
/// How long a token without `exp` is trusted without a new signature check.
const NO_EXPIRY_SECONDS: u64 = 300;

struct Entry {
    claims: Claims,
    /// The token's `exp`, which the caller checks.
    expires: Option<u64>,
    /// When the entry stops being used (seconds), for tokens without `exp`.
    evict_at: u64,
}

pub(super) struct TokenCache {
    shards: Vec<Mutex<HashMap<[u8; 32], Entry>>>,
}

impl TokenCache {
    pub(super) fn new() -> TokenCache {
        TokenCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, digest: &[u8; 32]) -> &Mutex<HashMap<[u8; 32], Entry>> {
        &self.shards[usize::from(digest[0]) % SHARDS]
    }

    /// The claims and `exp` of a token verified before (`now`: Unix seconds). A token without
    /// `exp` is checked again after a while.
    pub(super) fn get(&self, digest: &[u8; 32], now: u64) -> Option<(Claims, Option<u64>)> {
        let mut shard = self.shard(digest).lock();
        let entry = shard.get(digest)?;
        if entry.expires.is_none() && entry.evict_at <= now {
            shard.remove(digest);
            return None;
        }
        Some((entry.claims.clone(), entry.expires))
    }

    pub(super) fn insert(&self, digest: [u8; 32], claims: Claims, expires: Option<u64>, now: u64) {
        let evict_at = expires.unwrap_or(now.saturating_add(NO_EXPIRY_SECONDS));
        let mut shard = self.shard(&digest).lock();
        if shard.len() >= SHARD_CAPACITY {
            shard.retain(|_, entry| entry.evict_at > now);
            if shard.len() >= SHARD_CAPACITY {
                // Full of live tokens: start the shard over rather than scan for the oldest.
                shard.clear();
            }
        }
        shard.insert(
            digest,
            Entry {
                claims,
                expires,
                evict_at,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }
}
