//! A replica-local memory of buckets the shared store reported empty, so that a client
//! hammering one account or network costs the store almost nothing.
//!
//! It only ever refuses. Its estimate of a bucket's tokens counts refill from the moment the
//! store call was *sent* (before the store read its clock), so it never believes a bucket
//! emptier than the store does: other replicas can only take tokens away. When it is not
//! sure, the request goes to the store.

use std::collections::HashMap;
use std::hash::BuildHasher;

use foldhash::quality::RandomState;

use parking_lot::Mutex;

use super::clock::Timestamp;

/// Entries kept at most per shard; beyond that the shard is emptied (it is only an
/// accelerator).
const MAX_ENTRIES_PER_SHARD: usize = 8192;
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Entry {
    tokens: f64,
    since: Timestamp,
    rate: f64,
    capacity: f64,
}

/// Keys are store keys: limit names and keyed digests or networks, which a client cannot aim
/// at one hash bucket; a fast randomly seeded hash serves.
type Shard = HashMap<String, Entry, RandomState>;

#[derive(Debug)]
pub struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    /// Picks the shard; seeded apart from the shards' own maps.
    sharding: RandomState,
}

impl Default for DenyCache {
    fn default() -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sharding: RandomState::default(),
        }
    }
}

impl DenyCache {
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.sharding.hash_one(key) as usize) % SHARDS]
    }

    /// Remembers that `key` held `tokens` (too few) when a call sent at `sent` was answered.
    pub fn remember(&self, key: &str, tokens: f64, sent: Timestamp, rate: f64, capacity: f64) {
        let mut entries = self.shard(key).lock();
        if entries.len() >= MAX_ENTRIES_PER_SHARD {
            entries.retain(|_, entry| estimate(entry, sent) < entry.capacity);
            if entries.len() >= MAX_ENTRIES_PER_SHARD {
                entries.clear();
            }
        }
        entries.insert(
            key.to_owned(),
            Entry {
                tokens,
                since: sent,
                rate,
                capacity,
            },
        );
    }

    /// If `key` certainly holds fewer than `cost` tokens at `now`: the tokens it holds at most.
    pub fn insufficient(&self, key: &str, cost: f64, now: Timestamp) -> Option<f64> {
        let mut entries = self.shard(key).lock();
        let entry = entries.get(key)?;
        let tokens = estimate(entry, now);
        if tokens >= entry.capacity {
            entries.remove(key);
            return None;
        }
        (tokens < cost).then_some(tokens)
    }

    /// Forgets what it knew of `key` (an operator reset it).
    pub fn forget(&self, key: &str) {
        self.shard(key).lock().remove(key);
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn estimate(entry: &Entry, now: Timestamp) -> f64 {
    let elapsed = now.saturating_elapsed_since(entry.since).as_secs_f64();
    (entry.tokens + elapsed * entry.rate).min(entry.capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: f64) -> Timestamp {
        Timestamp((seconds * 1e9) as u64)
    }

    #[test]
    fn refuses_only_while_the_refill_cannot_have_covered_the_cost() {
        let cache = DenyCache::default();
        cache.remember("k", 0.25, at(10.0), 0.5, 5.0);
        assert_eq!(cache.insufficient("k", 1.0, at(10.0)), Some(0.25));
        assert!(cache.insufficient("k", 1.0, at(11.4)).is_some());
        assert_eq!(
            cache.insufficient("k", 1.0, at(11.5)),
            None,
            "0.25 + 1.5 × 0.5 = 1"
        );
        assert_eq!(cache.insufficient("other", 1.0, at(10.0)), None);
        cache.remember("k", 0.0, at(20.0), 0.5, 5.0);
        assert_eq!(
            cache.insufficient("k", 0.1, at(20.5)),
            None,
            "a smaller cost may pass"
        );
    }

    #[test]
    fn entries_go_once_the_bucket_would_be_full() {
        let cache = DenyCache::default();
        cache.remember("k", 0.0, at(0.0), 1.0, 2.0);
        assert_eq!(cache.insufficient("k", 3.0, at(1.0)), Some(1.0));
        assert_eq!(cache.insufficient("k", 3.0, at(2.0)), None);
        assert!(cache.is_empty());
    }
}
