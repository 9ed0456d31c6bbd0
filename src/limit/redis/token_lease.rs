//! Token leases in Redis (`lease` on a limit): a leased bucket is spent from this replica's
//! lease ([`crate::limit::lease`]) and refilled by `lease.lua`, one call at a time, at most one
//! per lease unless the last one was granted in full. The request's other buckets are decided
//! by the usual call; if they refuse, the leased cost goes back to the lease.

use std::sync::Arc;

use redis::Script;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{Number, RedisStore};
use crate::limit::concurrency::{Leased, Leasing};
use crate::limit::lease::{Grant, Take};
use crate::limit::{clock, BucketRequest, Charge, StoreError, StoreVerdict, Verdict, Verdicts};

pub(super) const LEASE: &str = include_str!("../lease.lua");

impl RedisStore {
    /// Decides a request some of whose buckets are leased: those are spent from the lease
    /// first (refused there, nothing else is asked), then the rest in one call as usual.
    pub(super) async fn decide_with_token_leases(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        let deadline = clock::deadline_in(self.timeout);
        let mut verdicts: Verdicts = smallvec::smallvec![Verdict::unobserved(); requests.len()];
        let mut spent: SmallVec<[(String, f64); 2]> = SmallVec::new();
        let give_back = |spent: &[(String, f64)]| {
            for (key, cost) in spent {
                self.leases.give_back(key, *cost);
            }
        };
        for (index, request) in requests.iter().enumerate() {
            let Some(lease) = request.lease else {
                continue;
            };
            let key = self.store_key(&request.key);
            let verdict = match self
                .spend_leased(&key, &request.charge, lease, deadline)
                .await
            {
                Ok(verdict) => verdict,
                Err(error) => {
                    give_back(&spent);
                    return Err(error);
                }
            };
            verdicts[index] = verdict;
            if verdict.sufficient {
                spent.push((key, request.charge.cost));
            } else if request.charge.enforce {
                give_back(&spent);
                return Ok((StoreVerdict::Refuse(verdicts), Leased::NotTaken(None)));
            }
        }
        let shared: SmallVec<[BucketRequest<'_>; 4]> = requests
            .iter()
            .filter(|request| request.lease.is_none())
            .cloned()
            .collect();
        let (decision, leased) = if shared.is_empty() && leasing.is_none() {
            (StoreVerdict::Admit(Verdicts::new()), Leased::NotTaken(None))
        } else {
            match self.decide_shared(&shared, leasing).await {
                Ok(decided) => decided,
                Err(error) => {
                    give_back(&spent);
                    return Err(error);
                }
            }
        };
        let unleased = requests
            .iter()
            .enumerate()
            .filter(|(_, request)| request.lease.is_none());
        for ((index, _), verdict) in unleased.zip(decision.verdicts()) {
            verdicts[index] = *verdict;
        }
        let admitted = decision.is_admitted();
        if !admitted {
            give_back(&spent);
        }
        Ok((StoreVerdict::new(admitted, verdicts), leased))
    }

    /// Spends `charge.cost` of the leased bucket `key`, calling Redis for a new lease when
    /// this replica's is spent (or waiting for the request already calling).
    async fn spend_leased(
        &self,
        key: &str,
        charge: &Charge,
        lease: std::time::Duration,
        deadline: Instant,
    ) -> Result<Verdict, StoreError> {
        loop {
            let refused = |tokens: f64, wait: f64| {
                let mut verdict = Verdict::observed(charge, tokens, false);
                verdict.wait = verdict.wait.max(wait);
                verdict
            };
            match self.leases.take(key, charge, lease, self.clock.now()) {
                Take::Spent(tokens) => return Ok(Verdict::observed(charge, tokens, true)),
                Take::Refused { tokens, wait } => return Ok(refused(tokens, wait)),
                Take::Wait(mut refilling) => {
                    // Woken when the call ends, whatever its result; a timeout is the store's.
                    let _ = tokio::time::timeout_at(deadline, refilling.changed())
                        .await
                        .map_err(|_| StoreError::Timeout)?;
                }
                Take::Refill(refill) => {
                    let call = self.breaker.permit().ok_or(StoreError::Unavailable)?;
                    let mut command = redis::cmd("EVALSHA");
                    command
                        .arg(self.lease_script.get_hash())
                        .arg(1)
                        .arg(key)
                        .arg(Number(charge.capacity))
                        .arg(Number(charge.rate))
                        .arg(Number(refill.want))
                        .arg(Number(charge.cost))
                        .arg(Number(refill.give_back));
                    let reply = tokio::time::timeout_at(
                        deadline,
                        self.send::<(String, String)>(&self.lease_script, command),
                    )
                    .await
                    .map_err(|_| StoreError::Timeout)
                    .and_then(|reply| reply);
                    let (granted, store_tokens) = match reply {
                        Ok(reply) => {
                            call.success();
                            reply
                        }
                        Err(error) => {
                            call.failure();
                            return Err(error);
                        }
                    };
                    let number = |text: &str| {
                        text.parse::<f64>()
                            .map_err(|_| StoreError::Reply(format!("{granted:?} {store_tokens:?}")))
                    };
                    let grant = Grant {
                        granted: number(&granted)?,
                        store_tokens: number(&store_tokens)?,
                    };
                    return Ok(
                        match refill.granted(grant, charge, lease, self.clock.now()) {
                            Take::Spent(tokens) => Verdict::observed(charge, tokens, true),
                            Take::Refused { tokens, wait } => refused(tokens, wait),
                            Take::Refill(_) | Take::Wait(_) => {
                                unreachable!("a grant spends or refuses")
                            }
                        },
                    );
                }
            }
        }
    }
}

/// The lease script, shared by the store's calls.
pub(super) fn script() -> Arc<Script> {
    Arc::new(Script::new(LEASE))
}
