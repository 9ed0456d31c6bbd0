//! Tokens verified before, found by the whole token (hashed with a per-process seed, then
//! compared): a client that sends the same token on every request pays one lookup, not one
//! signature check. Bounded, and only verified tokens enter it (a flood of forged tokens cannot
//! fill it); a reload starts an empty one with the new keys.

use std::collections::HashMap;
use std::hash::BuildHasher;

use foldhash::quality::RandomState;
use parking_lot::Mutex;

use super::Claims;

/// Entries per shard; 16 shards hold 16,384 tokens (a token and its claims, about 1 KB each).
const SHARD_CAPACITY: usize = 1024;
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

type Shard = HashMap<Box<str>, Entry, RandomState>;

pub(super) struct TokenCache {
    shards: Vec<Mutex<Shard>>,
    /// Picks the shard; seeded apart from the shards' own maps.
    sharding: RandomState,
}

impl TokenCache {
    pub(super) fn new() -> TokenCache {
        TokenCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sharding: RandomState::default(),
        }
    }

    fn shard(&self, token: &str) -> &Mutex<Shard> {
        &self.shards[(self.sharding.hash_one(token) as usize) % SHARDS]
    }

    /// The claims and `exp` of a token verified before (`now`: Unix seconds). A token without
    /// `exp` is checked again after a while.
    pub(super) fn get(&self, token: &str, now: u64) -> Option<(Claims, Option<u64>)> {
        let mut shard = self.shard(token).lock();
        let entry = shard.get(token)?;
        if entry.expires.is_none() && entry.evict_at <= now {
            shard.remove(token);
            return None;
        }
        Some((entry.claims.clone(), entry.expires))
    }

    pub(super) fn insert(&self, token: &str, claims: Claims, expires: Option<u64>, now: u64) {
        let evict_at = expires.unwrap_or(now.saturating_add(NO_EXPIRY_SECONDS));
        let mut shard = self.shard(token).lock();
        if shard.len() >= SHARD_CAPACITY {
            shard.retain(|_, entry| entry.evict_at > now);
            if shard.len() >= SHARD_CAPACITY {
                // Full of live tokens: start the shard over rather than scan for the oldest.
                shard.clear();
            }
        }
        shard.insert(
            token.into(),
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
