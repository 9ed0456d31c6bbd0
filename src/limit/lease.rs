//! Token leases (`lease` on a limit): a replica takes a hot bucket's tokens from the store up
//! to `rate × lease` at a time and spends them here, so that a `global` limit costs the store
//! a call per lease per replica rather than one per request. Tokens are taken before they are
//! spent, so replicas together never admit more than the bucket allows; what a lease did not
//! spend goes back with the replica's next call for that bucket (a replica that dies loses
//! at most its lease).
//!
//! This is the replica's side: what each leased bucket holds here, when it may call the store
//! again, and who is calling (one call at a time per bucket; the requests that find the lease
//! empty meanwhile wait for it). The clock is passed in.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use foldhash::quality::RandomState;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::clock::Timestamp;
use super::Charge;

/// Buckets kept at most per shard; beyond that, leases that ended are dropped.
const MAX_PER_SHARD: usize = 4096;
const SHARDS: usize = 16;

/// One leased bucket as this replica holds it.
#[derive(Debug)]
struct Held {
    /// Taken from the store and not yet spent.
    tokens: f64,
    /// When the lease ends: after it, `tokens` go back with the next call.
    until: Timestamp,
    /// No call before this: after a grant short of what was asked (the bucket is drained),
    /// the next call waits a lease.
    next_call: Timestamp,
    /// What the store's bucket held after the last call.
    store_tokens: f64,
    /// A call is out: requests that find the lease empty wait for it.
    refilling: Option<watch::Receiver<()>>,
}

/// What a request finds in its leased bucket.
#[derive(Debug)]
pub enum Take<'a> {
    /// Its cost was spent from the lease; the bucket holds about this many tokens after it
    /// (the lease's and the store's at the last call).
    Spent(f64),
    /// The lease is empty: call the store (`Refill` says what to give back and ask for).
    Refill(Refill<'a>),
    /// Another request is calling the store: wait for it, then take again.
    Wait(watch::Receiver<()>),
    /// Refused without a call: the tokens known, and the seconds until the next call.
    Refused { tokens: f64, wait: f64 },
}

/// A store call about to refill a lease. Dropped without [`Refill::granted`] (the call
/// failed), it lets the next request call.
#[derive(Debug)]
pub struct Refill<'a> {
    leases: &'a Leases,
    key: String,
    /// Tokens the lease held, to go back to the bucket with the call.
    pub give_back: f64,
    /// Tokens to ask for: `rate × lease`, or the cost if more.
    pub want: f64,
    done: Option<watch::Sender<()>>,
}

/// What the store handed over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub granted: f64,
    /// What the bucket held after the grant.
    pub store_tokens: f64,
}

#[derive(Debug)]
pub struct Leases {
    shards: Box<[Mutex<HashMap<String, Held, RandomState>>]>,
    sharding: RandomState,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sharding: RandomState::default(),
        }
    }
}

impl Leases {
    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Held, RandomState>> {
        &self.shards[(self.sharding.hash_one(key) as usize) % SHARDS]
    }

    /// Spends `charge.cost` of the bucket `key` (its store key) from its lease at `now`, or
    /// says what to do instead.
    pub fn take(&self, key: &str, charge: &Charge, lease: Duration, now: Timestamp) -> Take<'_> {
        let mut shard = self.shard(key).lock();
        if !shard.contains_key(key) && shard.len() >= MAX_PER_SHARD {
            shard.retain(|_, held| held.refilling.is_some() || now < held.until);
        }
        let held = shard.entry(key.to_owned()).or_insert(Held {
            tokens: 0.0,
            until: now,
            next_call: now,
            store_tokens: charge.capacity,
            refilling: None,
        });
        if now < held.until && held.tokens >= charge.cost {
            held.tokens -= charge.cost;
            return Take::Spent((held.tokens + held.store_tokens).min(charge.capacity));
        }
        if let Some(refilling) = &held.refilling {
            return Take::Wait(refilling.clone());
        }
        if now < held.next_call {
            return Take::Refused {
                tokens: (held.tokens + held.store_tokens).min(charge.capacity),
                wait: held.next_call.saturating_elapsed_since(now).as_secs_f64(),
            };
        }
        let (done, refilling) = watch::channel(());
        held.refilling = Some(refilling);
        let give_back = std::mem::take(&mut held.tokens);
        Take::Refill(Refill {
            leases: self,
            key: key.to_owned(),
            give_back,
            want: (charge.rate * lease.as_secs_f64()).max(charge.cost),
            done: Some(done),
        })
    }

    /// Gives a spent cost back to the lease (another limit refused the request).
    pub fn give_back(&self, key: &str, cost: f64) {
        if let Some(held) = self.shard(key).lock().get_mut(key) {
            held.tokens += cost;
        }
    }

    /// Forgets a bucket (an operator reset it): its next request calls the store.
    pub fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock();
        if shard.get(key).is_some_and(|held| held.refilling.is_none()) {
            shard.remove(key);
        }
    }
}

impl Refill<'_> {
    /// Stores what the call handed over at `now` for a lease of `lease`, and spends the
    /// requester's cost from it: `Spent`, or `Refused` when the bucket had too little.
    pub fn granted(
        mut self,
        grant: Grant,
        charge: &Charge,
        lease: Duration,
        now: Timestamp,
    ) -> Take<'static> {
        let mut shard = self.leases.shard(&self.key).lock();
        let Some(held) = shard.get_mut(&self.key) else {
            return Take::Refused {
                tokens: grant.store_tokens,
                wait: lease.as_secs_f64(),
            };
        };
        held.refilling = None;
        held.until = now.after(lease.as_secs_f64());
        held.store_tokens = grant.store_tokens;
        // The bucket holds another lease's worth (its burst): the next call may go as soon as
        // this lease is spent. Else it is being drained: one call per lease.
        held.next_call = if grant.store_tokens >= self.want {
            now
        } else {
            held.until
        };
        held.tokens += grant.granted;
        drop(self.done.take());
        if held.tokens >= charge.cost {
            held.tokens -= charge.cost;
            Take::Spent((held.tokens + held.store_tokens).min(charge.capacity))
        } else {
            Take::Refused {
                tokens: (held.tokens + held.store_tokens).min(charge.capacity),
                wait: lease.as_secs_f64(),
            }
        }
    }
}

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        if self.done.is_some() {
            if let Some(held) = self.leases.shard(&self.key).lock().get_mut(&self.key) {
                held.refilling = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(100);

    fn charge() -> Charge {
        // 100 tokens a second: 10 a lease.
        Charge {
            capacity: 1000.0,
            rate: 100.0,
            cost: 1.0,
            enforce: true,
            period: None,
            debt: 0.0,
        }
    }

    fn at(millis: u64) -> Timestamp {
        Timestamp(1_000_000_000 + millis * 1_000_000)
    }

    fn refill(take: Take<'_>) -> Refill<'_> {
        match take {
            Take::Refill(refill) => refill,
            other => panic!("expected a call, got {other:?}"),
        }
    }

    #[test]
    fn a_lease_is_spent_locally_and_refilled_by_one_call_at_a_time() {
        let leases = Leases::default();
        let first = refill(leases.take("k", &charge(), LEASE, at(0)));
        assert_eq!((first.give_back, first.want), (0.0, 10.0));
        // While the call is out, the next request waits for it.
        let Take::Wait(waiting) = leases.take("k", &charge(), LEASE, at(1)) else {
            panic!("a second caller");
        };
        let grant = Grant {
            granted: 10.0,
            store_tokens: 990.0,
        };
        assert!(matches!(
            first.granted(grant, &charge(), LEASE, at(2)),
            Take::Spent(tokens) if tokens == 999.0
        ));
        assert!(waiting.has_changed().is_err(), "the waiter is woken");
        for spent in 1..10 {
            assert!(
                matches!(leases.take("k", &charge(), LEASE, at(3)), Take::Spent(_)),
                "token {spent} of the lease"
            );
        }
        // The bucket holds more than another lease: the spent lease calls again at once.
        let second = refill(leases.take("k", &charge(), LEASE, at(4)));
        assert_eq!(second.give_back, 0.0);
    }

    #[test]
    fn a_short_grant_waits_a_lease_and_what_is_left_goes_back_with_the_next_call() {
        let leases = Leases::default();
        let call = refill(leases.take("k", &charge(), LEASE, at(0)));
        let short = Grant {
            granted: 3.0,
            store_tokens: 0.0,
        };
        assert!(matches!(
            call.granted(short, &charge(), LEASE, at(0)),
            Take::Spent(_)
        ));
        assert!(matches!(
            leases.take("k", &charge(), LEASE, at(10)),
            Take::Spent(_)
        ));
        // One token left but the lease ended: it goes back with the next call, which waits
        // until a lease after the short grant.
        assert!(matches!(
            leases.take("k", &charge(), LEASE, at(100)),
            Take::Refill(Refill { give_back, .. }) if give_back == 1.0
        ));
        let leases = Leases::default();
        let call = refill(leases.take("k", &charge(), LEASE, at(0)));
        let _ = call.granted(short, &charge(), LEASE, at(0));
        let _ = leases.take("k", &charge(), LEASE, at(1));
        let _ = leases.take("k", &charge(), LEASE, at(1));
        match leases.take("k", &charge(), LEASE, at(40)) {
            Take::Refused { wait, .. } => assert!((wait - 0.06).abs() < 1e-9, "{wait}"),
            other => panic!("refused until a lease after the short grant: {other:?}"),
        }
        assert!(matches!(
            leases.take("k", &charge(), LEASE, at(100)),
            Take::Refill(_)
        ));
    }

    #[test]
    fn a_failed_call_lets_the_next_request_call_and_a_refused_request_gives_back() {
        let leases = Leases::default();
        drop(refill(leases.take("k", &charge(), LEASE, at(0))));
        let call = refill(leases.take("k", &charge(), LEASE, at(1)));
        let nothing = Grant {
            granted: 0.0,
            store_tokens: 0.4,
        };
        assert!(matches!(
            call.granted(nothing, &charge(), LEASE, at(1)),
            Take::Refused { .. }
        ));
        let call = refill(leases.take("k", &charge(), LEASE, at(101)));
        let one = Grant {
            granted: 1.0,
            store_tokens: 0.0,
        };
        assert!(matches!(
            call.granted(one, &charge(), LEASE, at(101)),
            Take::Spent(_)
        ));
        leases.give_back("k", 1.0);
        assert!(
            matches!(leases.take("k", &charge(), LEASE, at(102)), Take::Spent(_)),
            "the token given back is spent again"
        );
    }
}
