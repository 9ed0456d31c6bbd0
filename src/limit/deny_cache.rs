//! A replica-local memory of buckets the shared store reported empty, so that a client
//! hammering one account or network costs the store almost nothing.
//!
//! It only ever refuses. Its estimate of a bucket's tokens counts refill from the moment the
//! store call was *sent* (before the store read its clock), so it never believes a bucket
//! emptier than the store does: other replicas can only take tokens away. When it is not
//! sure, the request goes to the store. It also remembers keys the store reported banned,
//! until (by this replica's clock, counted from the call's sending) their ban ends.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::quality::RandomState;

use parking_lot::Mutex;

use super::clock::Timestamp;

/// Entries kept at most per shard; beyond that the shard is emptied (it is only an
/// accelerator).
const MAX_ENTRIES_PER_SHARD: usize = 8192;
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
enum Entry {
    Bucket {
        tokens: f64,
        since: Timestamp,
        rate: f64,
        capacity: f64,
    },
    Banned {
        until: Timestamp,
    },
}

impl Entry {
    /// Whether the entry still tells something at `now`.
    fn matters(&self, now: Timestamp) -> bool {
        match *self {
            Entry::Bucket { capacity, .. } => estimate(self, now) < capacity,
            Entry::Banned { until } => until > now,
        }
    }
}

/// Keys are store keys: limit names and keyed digests or networks, which a client cannot aim
/// at one hash bucket; a fast randomly seeded hash serves.
type Shard = HashMap<String, Entry, RandomState>;

#[derive(Debug)]
pub struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    /// Picks the shard; seeded apart from the shards' own maps.
    sharding: RandomState,
    /// Entries in all shards, changed under their locks: while it is 0, as it is for a
    /// replica no client has been refused on, a request's keys are not looked up.
    entries: AtomicUsize,
}

impl Default for DenyCache {
    fn default() -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sharding: RandomState::default(),
            entries: AtomicUsize::new(0),
        }
    }
}

impl DenyCache {
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.sharding.hash_one(key) as usize) % SHARDS]
    }

    /// Remembers that `key` held `tokens` (too few) when a call sent at `sent` was answered.
    pub fn remember(&self, key: &str, tokens: f64, sent: Timestamp, rate: f64, capacity: f64) {
        let entry = Entry::Bucket {
            tokens,
            since: sent,
            rate,
            capacity,
        };
        self.insert(key, entry, sent);
    }

    /// Remembers that `key` is banned until `until`.
    pub fn remember_ban(&self, key: &str, until: Timestamp, sent: Timestamp) {
        self.insert(key, Entry::Banned { until }, sent);
    }

    fn insert(&self, key: &str, entry: Entry, now: Timestamp) {
        let mut entries = self.shard(key).lock();
        let before = entries.len();
        if entries.len() >= MAX_ENTRIES_PER_SHARD {
            entries.retain(|_, entry| entry.matters(now));
            if entries.len() >= MAX_ENTRIES_PER_SHARD {
                entries.clear();
            }
        }
        entries.insert(key.to_owned(), entry);
        self.counted(before, entries.len());
    }

    /// Keeps the count of entries as a shard went from `before` entries to `after`.
    fn counted(&self, before: usize, after: usize) {
        if after > before {
            self.entries.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.entries.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Removes `key` from its shard, `entries`, keeping the count.
    fn remove(&self, entries: &mut Shard, key: &str) {
        if entries.remove(key).is_some() {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether any key is remembered: when not, no lookup can refuse. A key remembered
    /// at this very moment by another thread may be missed, as if it came a moment later:
    /// the request then goes to the store, which is never wrong.
    pub fn holds_any(&self) -> bool {
        self.entries.load(Ordering::Relaxed) > 0
    }

    /// If `key` certainly holds fewer than `cost` tokens at `now`: the tokens it holds at most.
    pub fn insufficient(&self, key: &str, cost: f64, now: Timestamp) -> Option<f64> {
        let mut entries = self.shard(key).lock();
        let entry = entries.get(key)?;
        if !entry.matters(now) {
            self.remove(&mut entries, key);
            return None;
        }
        let Entry::Bucket { .. } = entry else {
            return None;
        };
        let tokens = estimate(entry, now);
        (tokens < cost).then_some(tokens)
    }

    /// If `key` is certainly banned at `now`: the seconds of its ban left at least.
    pub fn banned(&self, key: &str, now: Timestamp) -> Option<f64> {
        let mut entries = self.shard(key).lock();
        let Entry::Banned { until } = *entries.get(key)? else {
            return None;
        };
        if until <= now {
            self.remove(&mut entries, key);
            return None;
        }
        Some(until.saturating_elapsed_since(now).as_secs_f64())
    }

    /// Forgets what it knew of `key` (an operator reset it).
    pub fn forget(&self, key: &str) {
        self.remove(&mut self.shard(key).lock(), key);
    }

    /// Forgets everything: resets may have been missed.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut entries = shard.lock();
            self.counted(entries.len(), 0);
            entries.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A bucket's tokens at `now` at most (a ban's entry: none).
fn estimate(entry: &Entry, now: Timestamp) -> f64 {
    match *entry {
        Entry::Bucket {
            tokens,
            since,
            rate,
            capacity,
        } => {
            let elapsed = now.saturating_elapsed_since(since).as_secs_f64();
            (tokens + elapsed * rate).min(capacity)
        }
        Entry::Banned { .. } => 0.0,
    }
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
        assert!(!cache.holds_any());
    }

    #[test]
    fn it_holds_any_while_a_key_is_remembered_however_it_goes() {
        let cache = DenyCache::default();
        assert!(!cache.holds_any());
        cache.remember("a", 0.0, at(0.0), 1.0, 10.0);
        cache.remember("a", 0.0, at(1.0), 1.0, 10.0);
        cache.remember_ban("b", at(5.0), at(0.0));
        assert!(cache.holds_any());
        cache.forget("a");
        assert!(cache.holds_any(), "b is still banned");
        assert_eq!(cache.banned("b", at(6.0)), None);
        assert!(!cache.holds_any(), "b's ban ended");
        cache.remember("c", 0.0, at(0.0), 1.0, 10.0);
        cache.clear();
        assert!(!cache.holds_any());
        cache.forget("c");
        assert!(!cache.holds_any(), "forgetting what is gone counts nothing");

        // A shard that fills is emptied of what no longer matters, then wholly.
        for index in 0..SHARDS * MAX_ENTRIES_PER_SHARD + 100 {
            cache.remember(&index.to_string(), 0.0, at(0.0), 1.0, 10.0);
        }
        assert_eq!(cache.entries.load(Ordering::Relaxed), cache.len());
        cache.clear();
        assert!(!cache.holds_any());
    }

    #[test]
    fn a_ban_is_remembered_until_it_ends_and_forgotten_on_reset() {
        let cache = DenyCache::default();
        cache.remember_ban("k", at(900.0), at(0.0));
        assert_eq!(cache.banned("k", at(100.0)), Some(800.0));
        assert_eq!(
            cache.insufficient("k", 1.0, at(100.0)),
            None,
            "not a bucket"
        );
        assert_eq!(cache.banned("k", at(900.0)), None);
        assert!(cache.is_empty(), "an ended ban is dropped");
        cache.remember_ban("k", at(900.0), at(0.0));
        cache.forget("k");
        assert_eq!(cache.banned("k", at(1.0)), None);
        cache.remember("b", 0.0, at(0.0), 1.0, 2.0);
        assert_eq!(cache.banned("b", at(0.5)), None, "a bucket is not a ban");
    }
}
