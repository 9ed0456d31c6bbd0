//! A Redis Cluster's decisions: a request's buckets may live in different slots, so each slot
//! is decided by a call of its own (all at once), and what admitting slots charged is given
//! back when another slot refuses. The connection is made on first use.

use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;

use tokio::time::Instant;

use super::decide_call::{read_late_reply, BucketReply, DecideCall, RequestReply, Shape};
use super::keys::{group_by_slot, StoreKeys};
use super::verdict::leased;
use super::{Cluster, Connection, RedisStore};
use crate::limit::concurrency::{Leased, Leasing};
use crate::limit::{BucketRequest, Charge, StoreError, StoreVerdict, Verdict, Verdicts};

impl RedisStore {
    /// A Cluster's decision: one call per slot that the request's keys live in, all at once,
    /// each given up on at `deadline`; if a slot refuses, what the others charged is given
    /// back, and the leases they took.
    pub(super) async fn decide_across_slots(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        keys: &StoreKeys,
        deadline: Instant,
    ) -> Result<(StoreVerdict, Leased), StoreError> {
        let groups = group_by_slot(keys.iter());
        let replies = join_all(
            groups
                .iter()
                .map(|group| self.call_decide(requests, leasing, keys, group, deadline)),
        )
        .await;
        let buckets = requests.len();
        let mut verdicts: Verdicts = smallvec::smallvec![Verdict::unobserved(); buckets];
        let mut slots = vec![None; keys.len() - buckets];
        let mut admitted = true;
        let mut charged_groups = Vec::new();
        for (group, reply) in groups.iter().zip(replies) {
            let reply = reply?;
            admitted &= reply.admitted;
            if reply.admitted {
                charged_groups.push(group);
            }
            for (index, reply) in group.iter().zip(reply.buckets) {
                match requests.get(*index) {
                    Some(request) => verdicts[*index] = reply.verdict(&request.charge),
                    None => slots[*index - buckets] = Some(reply),
                }
            }
        }
        let slots: Vec<BucketReply> = slots.into_iter().flatten().collect();
        if admitted || charged_groups.is_empty() {
            return Ok((
                StoreVerdict::new(admitted, verdicts),
                leased(admitted, &slots),
            ));
        }
        // Another slot refused: give back what the admitting slots charged and leased.
        self.give_back_groups(
            requests,
            leasing,
            keys,
            &charged_groups,
            &verdicts,
            deadline,
        )
        .await?;
        for index in charged_groups.into_iter().flatten() {
            let (Some(verdict), Some(request)) = (verdicts.get_mut(*index), requests.get(*index))
            else {
                continue;
            };
            if verdict.sufficient || verdict.booked {
                let charge = verdict.in_force(&request.charge);
                let tokens = verdict.tokens + charge.cost;
                *verdict = Verdict::observed(&charge, tokens, verdict.sufficient);
            }
        }
        Ok((StoreVerdict::new(false, verdicts), leased(false, &slots)))
    }

    /// Gives back what the slots of `charged_groups` charged and leased for a request another
    /// slot refused.
    async fn give_back_groups(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        keys: &StoreKeys,
        charged_groups: &[&Vec<usize>],
        verdicts: &Verdicts,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let refunds = charged_groups.iter().map(|group| {
            let charged: Vec<(usize, Charge)> = group
                .iter()
                .filter(|index| {
                    verdicts
                        .get(**index)
                        .is_some_and(|verdict| verdict.sufficient || verdict.booked)
                })
                .map(|index| (*index, verdicts[*index].in_force(&requests[*index].charge)))
                .collect();
            let leases: Vec<usize> = group
                .iter()
                .copied()
                .filter(|index| *index >= requests.len())
                .collect();
            async move {
                self.call_refund(keys, charged).await?;
                for index in leases {
                    let name = leasing.map_or("", |leasing| leasing.name);
                    self.give_back_slot(&keys[index], name).await?;
                }
                Ok::<(), StoreError>(())
            }
        });
        // A refund gives back a charge that did happen: it carries no deadline, and one that
        // runs late is still right.
        let refunds = tokio::time::timeout_at(deadline, join_all(refunds))
            .await
            .map_err(|_| StoreError::Timeout)?;
        for result in refunds {
            result?;
        }
        Ok(())
    }

    /// One slot's buckets of one request, decided by a call of their own, which carries
    /// `deadline` in the time of the slot's node. Given up on, it is listened to for a while.
    async fn call_decide(
        &self,
        requests: &[BucketRequest<'_>],
        leasing: Option<&Leasing<'_>>,
        keys: &StoreKeys,
        group: &[usize],
        deadline: Instant,
    ) -> Result<RequestReply, StoreError> {
        let shape: Shape = group
            .iter()
            .map(|index| self.arguments(requests, leasing, *index))
            .collect();
        let mut call = DecideCall::for_requests(1);
        let lease_name = leasing.map(|leasing| leasing.name);
        call.push(group.iter().map(|index| &keys[*index]), &shape, lease_name);
        let slot = self.clock_slot(keys, group);
        let command = call.command(&self.decide, self.server_clock.deadline(slot, deadline));
        let read_late = read_late_reply(self.server_clock.clone(), slot);
        let reply = self
            .call_until(&self.decide, command, deadline, read_late)
            .await?;
        let mut replies = call.read(&reply, (&self.server_clock, slot), &self.late)?;
        replies
            .pop()
            .ok_or_else(|| StoreError::Reply("an empty script reply".to_owned()))
    }

    pub(super) async fn cluster(&self) -> Result<ClusterConnection, StoreError> {
        let Connection::Cluster(cluster) = &self.connection else {
            return Err(StoreError::Redis("not a cluster".to_owned()));
        };
        let Cluster {
            client,
            connection,
            connecting,
        } = &**cluster;
        if let Some(existing) = connection.load_full() {
            return Ok((*existing).clone());
        }
        let _guard = connecting.lock().await;
        if let Some(existing) = connection.load_full() {
            return Ok((*existing).clone());
        }
        let connected = client
            .get_async_connection()
            .await
            .map_err(|error| StoreError::Redis(error.to_string()))?;
        connection.store(Some(std::sync::Arc::new(connected.clone())));
        Ok(connected)
    }
}
