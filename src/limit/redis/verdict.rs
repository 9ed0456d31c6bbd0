//! A request's decision: its buckets, and the leases of its concurrency slots, in one
//! `decide.lua` call (on a Cluster, one per slot the keys live in); or a refusal from the deny
//! cache without a call.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::decide_call::{BucketArguments, BucketReply, Shape};
use super::keys::StoreKeys;
use super::{Connection, RedisStore};
use crate::limit::clock::{self, Timestamp};
use crate::limit::concurrency::{Leased, Leasing};
use crate::limit::{BucketRequest, StoreError, StoreVerdict, Verdict, Verdicts};

impl RedisStore {
    pub async fn decide(&self, requests: &[BucketRequest<'_>]) -> Result<StoreVerdict, StoreError> {
        let (decision, _) = self.decide_leasing(requests, None).await?;
        Ok(decision)
    }

    /// Decides `requests` and, in the same call, takes the leases `leasing` asks for if the
    /// request is admitted (all or none, with the buckets). Leased buckets (token leases)
    /// are spent from this replica's lease first.
    pub async fn decide_leasing(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        // Boxed, as a Cluster's decision is below: the usual decision's future then stays
        // under a kilobyte (824 bytes, from 2,296), which the allocator serves from its cache.
        if requests.iter().any(|request| request.lease.is_some()) {
            return Box::pin(self.decide_with_token_leases(requests, leasing)).await;
        }
        self.decide_shared(requests, leasing).await
    }

    /// Decides `requests` (none of them leased) and takes `leasing`'s slots in one call, or
    /// refuses from the deny cache.
    pub(super) async fn decide_shared(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        let mut keys = StoreKeys::new(&self.prefix, requests.iter().map(|request| &request.key));
        for slots in leasing.map_or(&[][..], |leasing| leasing.slots) {
            keys.push(&self.slot_key(&slots.key));
        }
        // One reading serves the deny cache's check and, as the time the call was sent (a
        // moment early, which only makes the cache more cautious), what it remembers.
        let sent = self.clock.now();
        if let Some(refusal) = self.refuse_from_cache(requests, &keys, sent) {
            self.deny_cache_refusals.fetch_add(1, Ordering::Relaxed);
            return Ok((refusal, Leased::NotTaken(None)));
        }
        let call = self.breaker.permit().ok_or(StoreError::Unavailable)?;
        let deadline = clock::deadline_in(self.timeout);
        let (keys, decision, leased) = match self
            .decide_in_redis(requests, leasing, keys, deadline)
            .await
        {
            Ok(decided) => decided,
            Err(error) => {
                call.failure();
                return Err(error);
            }
        };
        call.success();
        self.remember_refusals(requests, &keys, &decision, sent);
        Ok((decision, leased))
    }

    /// What the deny cache learns from a decision sent at `sent`: buckets too empty, and keys
    /// banned. Only while this replica hears resets, which are what lift them.
    fn remember_refusals(
        &self,
        requests: &[BucketRequest<'_>],
        keys: &StoreKeys,
        decision: &StoreVerdict,
        sent: Timestamp,
    ) {
        if !self.hears_resets() {
            return;
        }
        for ((request, key), verdict) in requests.iter().zip(keys.iter()).zip(decision.verdicts()) {
            let ban_left = match (verdict.banned, request.ban) {
                (true, _) => Some(verdict.wait),
                (false, Some(ban)) if verdict.ban_began => Some(ban.duration.as_secs_f64()),
                _ => None,
            };
            if let Some(left) = ban_left {
                if request.charge.enforce {
                    self.deny_cache.remember_ban(key, sent.after(left), sent);
                }
                continue;
            }
            // A quota's count only starts over with its period: not the deny cache's
            // arithmetic. A limit with a ban counts each refusal in Redis.
            let refused = !verdict.sufficient && !verdict.booked;
            if refused && request.charge.period.is_none() && request.ban.is_none() {
                self.deny_cache.remember(
                    key,
                    verdict.tokens,
                    sent,
                    request.charge.rate,
                    request.charge.capacity,
                );
            }
        }
    }

    /// A refusal decided locally, if the deny cache knows an enforcing bucket to be too empty
    /// or its key banned.
    pub(super) fn refuse_from_cache(
        &self,
        requests: &[BucketRequest<'_>],
        keys: &StoreKeys,
        now: Timestamp,
    ) -> Option<StoreVerdict> {
        if !self.deny_cache.holds_any() {
            return None;
        }
        let mut refused = false;
        let verdicts: Verdicts = requests
            .iter()
            .zip(keys.iter())
            .map(|(request, key)| {
                let charge = &request.charge;
                if !charge.enforce {
                    return Verdict::unobserved();
                }
                if request.ban.is_some() {
                    // Refusals toward a ban are counted in Redis: only a ban refuses here.
                    let Some(left) = self.deny_cache.banned(key, now) else {
                        return Verdict::unobserved();
                    };
                    refused = true;
                    return Verdict::banned(charge, 0.0, left);
                }
                // A delaying bucket refuses only once its debt is booked up.
                let needed = charge.cost - charge.debt;
                match self.deny_cache.insufficient(key, needed, now) {
                    Some(tokens) => {
                        refused = true;
                        Verdict::observed(charge, tokens, false)
                    }
                    None => Verdict::unobserved(),
                }
            })
            .collect();
        refused.then_some(StoreVerdict::Refuse(verdicts))
    }

    /// The numbers `decide.lua` needs of the `index`th key of a request: a bucket's, or past
    /// the buckets, a concurrency limit's.
    pub(super) fn arguments(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        index: usize,
    ) -> BucketArguments {
        match (requests.get(index), leasing) {
            (Some(request), _) => BucketArguments::of(request),
            (None, Some(leasing)) => {
                BucketArguments::lease(leasing.slots[index - requests.len()].slots, self.lease)
            }
            (None, None) => unreachable!("a key past the buckets is a concurrency limit's"),
        }
    }

    /// Decides in Redis, or times out at `deadline`; gives the keys back with the decision.
    async fn decide_in_redis(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        keys: StoreKeys,
        deadline: Instant,
    ) -> Result<(StoreKeys, StoreVerdict, Leased), StoreError> {
        let node = match &self.connection {
            Connection::Single(node) => node,
            Connection::Cluster(_) => {
                // Each call keeps the deadline itself, to be listened to after it. Boxed, as
                // the token leases' decision is above.
                let (decision, leased) =
                    Box::pin(self.decide_across_slots(requests, leasing, &keys, deadline)).await?;
                return Ok((keys, decision, leased));
            }
        };
        let shape: Shape = (0..keys.len())
            .map(|index| self.arguments(requests, leasing, index))
            .collect();
        let lease_name = leasing.map(|leasing| leasing.name.to_owned());
        // The batcher keeps the deadline: no timer per request.
        let (keys, reply) = self
            .batcher
            .decide(
                (node, &self.decide),
                (&self.server_clock, &self.late),
                (keys, shape, lease_name),
                deadline,
            )
            .await;
        let reply = reply?;
        let (buckets, slots) = reply
            .buckets
            .split_at(requests.len().min(reply.buckets.len()));
        let verdicts = requests
            .iter()
            .zip(buckets)
            .map(|(request, bucket)| bucket.verdict(&request.charge))
            .collect();
        let leased = leased(reply.admitted, slots);
        Ok((keys, StoreVerdict::new(reply.admitted, verdicts), leased))
    }
}

/// What a decision did with the leases, from the replies for its concurrency slots.
pub(super) fn leased(admitted: bool, slots: &[BucketReply]) -> Leased {
    if admitted {
        return Leased::Taken(
            slots
                .iter()
                .map(|slot| slot.tokens.max(0.0) as u32)
                .collect::<SmallVec<_>>(),
        );
    }
    Leased::NotTaken(slots.iter().position(|slot| !slot.sufficient))
}
