//! Giving charged tokens back (`refund.lua`): what a Cluster's admitting slots charged for a
//! request another slot refused, and what a delayed request booked before its client left.

use futures_util::future::join_all;

use super::keys::{group_by_slot, StoreKeys};
use super::{script_command, Connection, Number, RedisStore};
use crate::limit::{BucketRequest, Charge, StoreError};

/// Charges to give back, owned: a refund may run after the request that made it is gone.
#[derive(Debug)]
pub struct Refund {
    keys: StoreKeys,
    charges: Vec<Charge>,
}

impl RedisStore {
    /// The refund of every charge of `requests`.
    pub fn refund_of<'a>(
        &self,
        requests: impl IntoIterator<Item = &'a BucketRequest<'a>>,
    ) -> Refund {
        let requests: Vec<&BucketRequest<'_>> = requests.into_iter().collect();
        Refund {
            keys: StoreKeys::new(&self.prefix, requests.iter().map(|request| &request.key)),
            charges: requests.iter().map(|request| request.charge).collect(),
        }
    }

    /// Gives the refund's tokens back, one call per slot, each capped at its capacity.
    pub async fn give_back(&self, refund: Refund) -> Result<(), StoreError> {
        let groups = match &self.connection {
            Connection::Single(_) => vec![(0..refund.charges.len()).collect::<Vec<usize>>()],
            Connection::Cluster(_) => group_by_slot(refund.keys.iter()),
        };
        let calls = groups.into_iter().map(|group| {
            let charged = group
                .into_iter()
                .map(|index| (index, refund.charges[index]))
                .collect();
            self.call_refund(&refund.keys, charged)
        });
        join_all(calls).await.into_iter().collect()
    }

    /// Gives back the cost of each `(bucket, charge in force)`.
    pub(super) async fn call_refund(
        &self,
        keys: &StoreKeys,
        charged: Vec<(usize, Charge)>,
    ) -> Result<(), StoreError> {
        if charged.is_empty() {
            return Ok(());
        }
        let group: Vec<usize> = charged.iter().map(|(index, _)| *index).collect();
        let command = script_command(&self.refund, keys, &group, None, |command, position| {
            let charge = &charged[position].1;
            command
                .arg(Number(charge.capacity))
                .arg(Number(charge.rate))
                .arg(Number(charge.cost));
        });
        let _: i64 = self.send(&self.refund, command).await?;
        Ok(())
    }
}
