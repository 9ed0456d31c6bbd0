//! The in-process store: sharded maps of bucket states, bounded by `max_keys`.
//!
//! A bucket that has refilled to full carries no information (a missing bucket is full), so
//! sweeps drop it and memory follows the active keys, not history. When a shard reaches its
//! bound, full buckets go first; if that is not enough, the fullest ones (those that would be
//! full soonest) are dropped, which hands their clients a fresh bucket: that is counted and
//! logged, and means `max_keys` is too small.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::adaptive::{AdaptiveParams, AdaptiveState};
use super::ban::{Ban, BanState};
use super::bucket::{self, BucketState, Charge};
use super::clock::{Clock, Timestamp};
use super::{BucketKey, BucketRequest, OutcomeRequest, StoreVerdict, Verdict, Verdicts};

/// Buckets per shard before one is considered for its own lock.
const KEYS_PER_SHARD_TARGET: usize = 4096;
const MAX_SHARDS: usize = 64;

#[derive(Debug, Clone)]
struct Entry {
    state: BucketState,
    /// When the bucket will be full again and its adaptive state no longer matters: from
    /// then on it can be dropped.
    full_at: Timestamp,
    /// Only for keys of adaptive limits that have seen errors.
    adaptive: Option<Box<AdaptiveState>>,
    /// Only for keys of limits with a ban that have been refused: the rule and the state.
    ban: Option<Box<(Ban, BanState)>>,
}

impl Entry {
    /// The key's capacity and rate now, after any adaptive penalty.
    fn effective(
        &self,
        charge: &Charge,
        params: Option<&AdaptiveParams>,
        now: Timestamp,
    ) -> Charge {
        match (params, self.adaptive.as_deref()) {
            (Some(params), Some(adaptive)) => {
                charge.scaled(adaptive.multiplier(params, charge.capacity, now))
            }
            _ => *charge,
        }
    }

    fn keep_until(
        &self,
        full_in: f64,
        params: Option<&AdaptiveParams>,
        now: Timestamp,
    ) -> Timestamp {
        let full_at = now.after(full_in);
        let full_at = match self.ban.as_deref() {
            Some((rule, ban)) => full_at.max(ban.relevant_until(rule)),
            None => full_at,
        };
        match (params, self.adaptive.as_deref()) {
            (Some(params), Some(adaptive)) => full_at.max(adaptive.relevant_until(params)),
            _ => full_at,
        }
    }
}

/// Bucket ids are already uniformly distributed hashes; hashing them again is waste.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

type Shard = HashMap<u64, Entry, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    keys_per_shard: usize,
    clock: Clock,
    /// Seeded per process: bucket ids cannot be predicted, so collisions cannot be aimed.
    hasher: foldhash::quality::RandomState,
    evicted_before_full: AtomicU64,
}

impl MemoryStore {
    pub fn new(max_keys: usize, clock: Clock) -> MemoryStore {
        let max_keys = max_keys.max(1);
        let shard_count = (max_keys / KEYS_PER_SHARD_TARGET)
            .clamp(1, MAX_SHARDS)
            .next_power_of_two()
            .min(MAX_SHARDS);
        let keys_per_shard = max_keys.div_ceil(shard_count);
        MemoryStore {
            shards: (0..shard_count)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            keys_per_shard,
            clock,
            hasher: foldhash::quality::RandomState::default(),
            evicted_before_full: AtomicU64::new(0),
        }
    }

    /// The clock its buckets are counted by.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Buckets currently held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets dropped before they were full because the store was at `max_keys`.
    pub fn evicted_before_full(&self) -> u64 {
        self.evicted_before_full.load(Ordering::Relaxed)
    }

    fn id(&self, key: &BucketKey<'_>) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        key.fingerprint.hash(&mut hasher);
        key.limit.hash(&mut hasher);
        key.parts.hash(&mut hasher);
        hasher.finish()
    }

    fn shard_of(&self, id: u64) -> usize {
        // The top bits pick the shard; the map uses all of them.
        ((id >> 40) as usize) & (self.shards.len() - 1)
    }

    /// Runs `work` under the locks of every shard holding one of `ids`, taken in index order
    /// so that two requests can never wait on each other. `work` gets the locked shards and,
    /// per id, the position of its shard among them.
    fn locked<R>(
        &self,
        ids: &[u64],
        work: impl FnOnce(&mut [(usize, MutexGuard<'_, Shard>)], &[usize]) -> R,
    ) -> R {
        let mut shard_indexes: SmallVec<[usize; 4]> =
            ids.iter().map(|id| self.shard_of(*id)).collect();
        shard_indexes.sort_unstable();
        shard_indexes.dedup();
        let positions: SmallVec<[usize; 4]> = ids
            .iter()
            .map(|id| {
                shard_indexes
                    .binary_search(&self.shard_of(*id))
                    .unwrap_or_default()
            })
            .collect();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> = shard_indexes
            .iter()
            .map(|index| (*index, self.shards[*index].lock()))
            .collect();
        work(&mut guards, &positions)
    }

    /// Decides a request against all of its buckets (see [`bucket::decide`]), each with its
    /// key's adaptive penalty applied.
    pub fn decide(&self, requests: &[BucketRequest<'_>]) -> StoreVerdict {
        self.decide_at(requests, self.clock.now())
    }

    /// [`MemoryStore::decide`] at `now` (a request's reading of the clock).
    pub fn decide_at(&self, requests: &[BucketRequest<'_>], now: Timestamp) -> StoreVerdict {
        let ids: SmallVec<[u64; 4]> = requests
            .iter()
            .map(|request| self.id(&request.key))
            .collect();
        self.locked(&ids, |guards, positions| {
            let mut states: SmallVec<[_; 4]> = SmallVec::with_capacity(requests.len());
            let mut charges: SmallVec<[_; 4]> = SmallVec::with_capacity(requests.len());
            for ((request, id), position) in requests.iter().zip(&ids).zip(positions) {
                let entry = guards[*position].1.get(id);
                states.push(entry.map(|entry| entry.state));
                charges.push(entry.map_or(request.charge, |entry| {
                    entry.effective(&request.charge, request.adaptive.as_ref(), now)
                }));
            }
            let mut verdicts = Verdicts::with_capacity(requests.len());
            // A key banned by an enforcing limit is refused, and nothing is charged (looked
            // up only for limits with a ban rule).
            if requests.iter().any(|request| request.ban.is_some()) {
                let bans: SmallVec<[Option<f64>; 4]> = requests
                    .iter()
                    .zip(&ids)
                    .zip(positions)
                    .map(|((request, id), position)| {
                        request.ban?;
                        let (_, ban) = guards[*position].1.get(id)?.ban.as_deref()?;
                        request.charge.enforce.then(|| ban.left(now)).flatten()
                    })
                    .collect();
                if bans.iter().any(Option::is_some) {
                    for ((charge, state), left) in charges.iter().zip(&states).zip(&bans) {
                        let tokens = bucket::tokens_at(*state, charge, now);
                        verdicts.push(match left {
                            Some(left) => Verdict::banned(charge, tokens, *left),
                            None => Verdict::observed(charge, tokens, tokens >= charge.cost),
                        });
                    }
                    return StoreVerdict::Refuse(verdicts);
                }
            }
            let admitted = bucket::decide(&charges, &mut states, now, &mut verdicts);
            for (((request, id), position), (state, verdict)) in requests
                .iter()
                .zip(&ids)
                .zip(positions)
                .zip(states.iter().zip(verdicts.iter_mut()))
            {
                let Some(state) = state else { continue };
                let shard = &mut guards[*position].1;
                self.store_state(
                    shard,
                    *id,
                    *state,
                    verdict.full_in,
                    request.adaptive.as_ref(),
                    now,
                );
                // A refusal by this limit (or, in shadow mode, one it would have made).
                let refused = !verdict.sufficient
                    && !verdict.booked
                    && (!admitted || !request.charge.enforce);
                if let (Some(ban), true) = (request.ban, refused) {
                    verdict.ban_began = self.count_refusal(shard, *id, ban, *state, now);
                }
            }
            StoreVerdict::new(admitted, verdicts)
        })
    }

    /// A key's state now, as its next decision would find it.
    pub fn inspect(
        &self,
        key: &BucketKey<'_>,
        charge: &Charge,
        params: Option<&AdaptiveParams>,
    ) -> super::KeyState {
        let now = self.clock.now();
        let id = self.id(key);
        let shard = self.shards[self.shard_of(id)].lock();
        let entry = shard.get(&id);
        let effective = entry.map_or(*charge, |entry| entry.effective(charge, params, now));
        let penalty = entry
            .and_then(|entry| Some((params?, entry.adaptive.as_deref()?)))
            .filter(|(_, adaptive)| adaptive.level_at(now) > 0)
            .map(|(params, adaptive)| {
                let left = adaptive
                    .hold_until
                    .saturating_elapsed_since(now)
                    .as_secs_f64();
                (
                    adaptive.multiplier(params, charge.capacity, now),
                    self.clock.unix() + left,
                )
            });
        let banned_until = entry
            .and_then(|entry| entry.ban.as_deref()?.1.left(now))
            .map(|left| self.clock.unix() + left);
        super::KeyState {
            tokens: bucket::tokens_at(entry.map(|entry| entry.state), &effective, now),
            capacity: effective.capacity,
            penalty,
            banned_until,
        }
    }

    /// Forgets a key's bucket and adaptive state.
    pub fn forget(&self, key: &BucketKey<'_>) {
        let id = self.id(key);
        self.shards[self.shard_of(id)].lock().remove(&id);
    }

    /// Applies outcome charges and counts adaptive errors; returns whether each key tripped.
    pub fn record_outcomes(&self, requests: &[OutcomeRequest<'_>]) -> Vec<bool> {
        let now = self.clock.now();
        let ids: Vec<u64> = requests
            .iter()
            .map(|request| self.id(&request.key))
            .collect();
        self.locked(&ids, |guards, positions| {
            let mut tripped = Vec::with_capacity(requests.len());
            for ((request, id), position) in requests.iter().zip(&ids).zip(positions) {
                let shard = &mut guards[*position].1;
                let params = request.adaptive.as_ref();
                let mut entry = shard.remove(id).unwrap_or(Entry {
                    state: BucketState {
                        tokens: request.charge.capacity,
                        updated: now,
                    },
                    full_at: now,
                    adaptive: None,
                    ban: None,
                });
                let mut charge = entry.effective(&request.charge, params, now);
                let mut state =
                    bucket::charge_after(Some(entry.state), &charge, request.charge.cost, now);
                let mut trip = false;
                if let (true, Some(params)) = (request.error, params) {
                    let adaptive = entry.adaptive.get_or_insert_with(Box::default);
                    trip = adaptive.record_error(params, now);
                    charge = entry.effective(&request.charge, Some(params), now);
                    state.tokens = state.tokens.min(charge.capacity);
                }
                tripped.push(trip);
                let full_in = charge.full_in(state.tokens);
                entry.state = state;
                let keep_until = entry.keep_until(full_in, params, now);
                if keep_until > now {
                    entry.full_at = keep_until;
                    if shard.len() >= self.keys_per_shard {
                        self.make_room(shard, now);
                    }
                    shard.insert(*id, entry);
                }
            }
            tripped
        })
    }

    /// Counts a refusal toward the key's ban; true when it begins one.
    fn count_refusal(
        &self,
        shard: &mut Shard,
        id: u64,
        rule: Ban,
        state: BucketState,
        now: Timestamp,
    ) -> bool {
        if !shard.contains_key(&id) && shard.len() >= self.keys_per_shard {
            self.make_room(shard, now);
        }
        let entry = shard.entry(id).or_insert(Entry {
            state,
            full_at: now,
            adaptive: None,
            ban: None,
        });
        let (kept_rule, ban) = &mut **entry
            .ban
            .get_or_insert_with(|| Box::new((rule, BanState::default())));
        *kept_rule = rule;
        let began = ban.refused(&rule, now);
        entry.full_at = entry.full_at.max(ban.relevant_until(&rule));
        began
    }

    /// Writes a bucket's state after a decision, or drops it when it carries nothing.
    fn store_state(
        &self,
        shard: &mut Shard,
        id: u64,
        state: BucketState,
        full_in: f64,
        params: Option<&AdaptiveParams>,
        now: Timestamp,
    ) {
        if let Some(entry) = shard.get_mut(&id) {
            entry.state = state;
            entry.full_at = entry.keep_until(full_in, params, now);
            if entry.full_at <= now {
                shard.remove(&id);
            }
            return;
        }
        if full_in <= 0.0 {
            return;
        }
        if shard.len() >= self.keys_per_shard {
            self.make_room(shard, now);
        }
        shard.insert(
            id,
            Entry {
                state,
                full_at: now.after(full_in),
                adaptive: None,
                ban: None,
            },
        );
    }

    /// Frees at least an eighth of a full shard: full buckets first, then the fullest.
    fn make_room(&self, shard: &mut Shard, now: Timestamp) {
        shard.retain(|_, entry| entry.full_at > now);
        let target = self.keys_per_shard - (self.keys_per_shard / 8).max(1);
        if shard.len() <= target {
            return;
        }
        let excess = shard.len() - target;
        let mut full_at: Vec<Timestamp> = shard.values().map(|entry| entry.full_at).collect();
        let (_, threshold, _) = full_at.select_nth_unstable(excess - 1);
        let threshold = *threshold;
        let before = shard.len();
        let mut to_drop = excess;
        shard.retain(|_, entry| {
            if to_drop > 0 && entry.full_at <= threshold {
                to_drop -= 1;
                false
            } else {
                true
            }
        });
        let dropped = (before - shard.len()) as u64;
        self.evicted_before_full
            .fetch_add(dropped, Ordering::Relaxed);
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "memory store reached max_keys: dropping buckets that are not yet full, whose clients get a fresh bucket; raise [store] max_keys"
            );
        });
    }

    /// Drops every bucket that is full again; gives memory back when a shard has shrunk.
    pub fn sweep(&self) {
        let now = self.clock.now();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|_, entry| entry.full_at > now);
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                shard.shrink_to_fit();
            }
        }
    }
}

#[cfg(test)]
mod tests;
