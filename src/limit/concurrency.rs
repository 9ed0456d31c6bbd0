//! Concurrency limits (`concurrency = N`): a key's requests in flight, each holding a slot
//! from admission until its response ends. The slots are counted here, in this process; a
//! request's slots are taken all or none, and given back when the [`HeldSlots`] that a
//! response body carries is dropped (sent whole, client gone, upgraded connection closed).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::KeyParts;

/// One concurrency limit's slots of one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotKey {
    pub limit: Arc<str>,
    /// Changes with the limit's definition: a redefined limit counts afresh.
    pub fingerprint: u64,
    pub parts: KeyParts,
}

/// A slot a request asks for.
#[derive(Debug)]
pub struct SlotRequest {
    pub key: SlotKey,
    /// The limit's `concurrency`.
    pub slots: u32,
    /// `tollgate_concurrency_in_use{limit}`.
    pub in_use: Option<prometheus::IntGauge>,
}

/// A request's slots to be taken as leases in the store's decision itself (Redis): each
/// concurrency limit's sorted set gets a lease in the request's name when the request is
/// admitted, in the same script call that charges its buckets.
#[derive(Debug, Clone, Copy)]
pub struct Leasing<'a> {
    /// The leases' name: unique to the request.
    pub name: &'a str,
    pub slots: &'a [SlotRequest],
}

/// What a decision did with a request's [`Leasing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leased {
    /// Every lease taken; the slots each limit has free after this request.
    Taken(SmallVec<[u32; 2]>),
    /// None taken (or all given back): the slot request that had no slot free, or `None`
    /// when a bucket refused, or no slot was asked for.
    NotTaken(Option<usize>),
}

/// Slots in use, per key.
#[derive(Debug, Default)]
pub struct Slots {
    shards: [Mutex<HashMap<SlotKey, u32>>; 16],
}

/// Why a request got no slot: its limit (by position in the request's list) had none free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSlot {
    pub index: usize,
}

impl Slots {
    fn shard(&self, key: &SlotKey) -> &Mutex<HashMap<SlotKey, u32>> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::default().hash_one(key);
        &self.shards[(hash % 16) as usize]
    }

    /// Takes a slot of each request, or none: a request refused by one limit holds no slot of
    /// another. Returns how many slots each key has free after this request.
    pub fn acquire(
        self: &Arc<Self>,
        requests: &[SlotRequest],
    ) -> Result<(HeldSlots, SmallVec<[u32; 2]>), NoSlot> {
        let mut held = HeldSlots {
            slots: self.clone(),
            held: SmallVec::new(),
        };
        let mut free = SmallVec::new();
        for (index, request) in requests.iter().enumerate() {
            let mut shard = self.shard(&request.key).lock();
            let in_use = shard.entry(request.key.clone()).or_insert(0);
            if *in_use >= request.slots {
                if *in_use == 0 {
                    shard.remove(&request.key);
                }
                // Dropping `held` gives back what this request took so far.
                return Err(NoSlot { index });
            }
            *in_use += 1;
            free.push(request.slots - *in_use);
            drop(shard);
            if let Some(gauge) = &request.in_use {
                gauge.inc();
            }
            held.held
                .push((request.key.clone(), request.in_use.clone()));
        }
        Ok((held, free))
    }

    /// Slots of `key` in use now.
    pub fn in_use(&self, key: &SlotKey) -> u32 {
        self.shard(key).lock().get(key).copied().unwrap_or(0)
    }

    fn release(&self, key: &SlotKey) {
        let mut shard = self.shard(key).lock();
        if let Some(in_use) = shard.get_mut(key) {
            *in_use = in_use.saturating_sub(1);
            if *in_use == 0 {
                shard.remove(key);
            }
        }
    }
}

/// A request's slots, given back when dropped.
#[derive(Debug)]
pub struct HeldSlots {
    slots: Arc<Slots>,
    held: SmallVec<[(SlotKey, Option<prometheus::IntGauge>); 2]>,
}

impl Drop for HeldSlots {
    fn drop(&mut self) {
        for (key, in_use) in self.held.drain(..) {
            self.slots.release(&key);
            if let Some(gauge) = in_use {
                gauge.dec();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::KeyPart;

    fn request(limit: &str, key: u8, slots: u32) -> SlotRequest {
        SlotRequest {
            key: SlotKey {
                limit: Arc::from(limit),
                fingerprint: 1,
                parts: [KeyPart::Digest([key; 16])].into_iter().collect(),
            },
            slots,
            in_use: None,
        }
    }

    #[test]
    fn a_key_holds_at_most_its_slots_until_one_is_given_back() {
        let slots = Arc::new(Slots::default());
        let exports = [request("exports", 1, 2)];
        let (first, free) = slots.acquire(&exports).unwrap();
        assert_eq!(free.as_slice(), [1]);
        let (second, free) = slots.acquire(&exports).unwrap();
        assert_eq!(free.as_slice(), [0]);
        assert_eq!(slots.acquire(&exports).unwrap_err(), NoSlot { index: 0 });
        // Another key has slots of its own.
        assert!(slots.acquire(&[request("exports", 2, 2)]).is_ok());
        drop(first);
        let (third, _) = slots.acquire(&exports).unwrap();
        drop((second, third));
        assert_eq!(slots.in_use(&exports[0].key), 0);
    }

    #[test]
    fn a_request_refused_by_one_limit_holds_no_slot_of_another() {
        let slots = Arc::new(Slots::default());
        let per_user = request("per_user", 1, 5);
        let global = request("global", 0, 1);
        let (held, _) = slots.acquire(&[request("global", 0, 1)]).unwrap();
        assert_eq!(
            slots.acquire(&[per_user, global]).unwrap_err(),
            NoSlot { index: 1 }
        );
        assert_eq!(slots.in_use(&request("per_user", 1, 5).key), 0);
        drop(held);
        assert_eq!(slots.in_use(&request("global", 0, 1).key), 0);
    }
}
