//! Concurrency slots shared by every replica: a key's slots are a sorted set of leases, each a
//! request's, scored by when it expires in the server's time. `decide.lua` takes them with the
//! request's tokens; a request renews its leases while in flight and removes them when it
//! ends; a replica that dies leaves leases that expire within one lease, so nothing leaks for
//! longer.
//!
//! A request's leases live here from the decision to their give-back: [`PendingSlotLeases`] while
//! the decision's call may have taken them, [`SlotLeases`] (renewed by a task of their own) once it
//! did. Both hold the store and nothing above it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::RedisStore;
use crate::limit::concurrency::{Leasing, SlotKey, SlotRequest};
use crate::limit::{BucketKey, StoreError};

/// Extends a lease that still exists (a lease that expired meanwhile is not brought back).
const RENEW: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[1])
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
return renewed
";

impl RedisStore {
    /// The sorted set of a key's slots: `<prefix><limit>:<key>:slots`.
    pub fn slot_key(&self, key: &SlotKey) -> String {
        let bucket = BucketKey {
            limit: &key.limit,
            fingerprint: key.fingerprint,
            parts: key.parts.clone(),
        };
        let mut text = self.prefix.clone();
        bucket.push_to(&mut text);
        text.push_str(":slots");
        text
    }

    /// Extends `lease_id`'s lease of `key` by a whole lease from now.
    pub async fn renew_slot(&self, key: &str, lease_id: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("EVAL");
        command
            .arg(RENEW)
            .arg(1)
            .arg(key)
            .arg(lease_millis(self.lease))
            .arg(lease_id);
        let _: i64 = self.bounded(command).await?;
        Ok(())
    }

    /// Gives `lease_id`'s slot of `key` back.
    pub async fn give_back_slot(&self, key: &str, lease_id: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("ZREM");
        command.arg(key).arg(lease_id);
        let _: i64 = self.bounded(command).await?;
        Ok(())
    }

    /// A call within the store's timeout.
    async fn bounded<T: redis::FromRedisValue + Send>(
        &self,
        command: redis::Cmd,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, self.query(command))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    /// How long a lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

/// SlotLeases a decision is about to take. Until the decision says what became of them, they may
/// have been taken (a call given up on may still run): dropped unsettled, they are given back.
pub struct PendingSlotLeases {
    store: Arc<RedisStore>,
    name: String,
    keys: SmallVec<[String; 2]>,
    settled: bool,
}

impl PendingSlotLeases {
    pub fn new(store: &Arc<RedisStore>, requests: &[SlotRequest]) -> PendingSlotLeases {
        PendingSlotLeases {
            store: store.clone(),
            name: lease_name(),
            keys: requests
                .iter()
                .map(|request| store.slot_key(&request.key))
                .collect(),
            settled: false,
        }
    }

    /// What the decision's call is to take.
    pub fn leasing<'a>(&'a self, requests: &'a [SlotRequest]) -> Leasing<'a> {
        Leasing {
            name: &self.name,
            slots: requests,
        }
    }

    /// The decision took them: held, and renewed, until dropped.
    pub fn taken(mut self, requests: &[SlotRequest]) -> SlotLeases {
        self.settled = true;
        let keys = std::mem::take(&mut self.keys)
            .into_iter()
            .zip(requests)
            .map(|(key, request)| {
                if let Some(gauge) = &request.in_use {
                    gauge.inc();
                }
                (key, request.in_use.clone())
            })
            .collect();
        SlotLeases::renewed(&self.store, std::mem::take(&mut self.name), keys)
    }

    /// The decision took none (or gave them back itself), or no call was made (the circuit is
    /// open): nothing to give back.
    pub fn none_taken(mut self) {
        self.settled = true;
    }
}

impl Drop for PendingSlotLeases {
    fn drop(&mut self) {
        if !self.settled {
            give_back(
                self.store.clone(),
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.keys),
            );
        }
    }
}

/// SlotLeases of one request, renewed every third of a lease until dropped; dropping gives them
/// back.
pub struct SlotLeases {
    store: Arc<RedisStore>,
    name: String,
    keys: SmallVec<[(String, Option<prometheus::IntGauge>); 2]>,
    renewing: tokio::task::AbortHandle,
}

impl std::fmt::Debug for SlotLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotLeases")
            .field("name", &self.name)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl SlotLeases {
    /// SlotLeases taken, renewed from now on by a task of their own.
    fn renewed(
        store: &Arc<RedisStore>,
        name: String,
        keys: SmallVec<[(String, Option<prometheus::IntGauge>); 2]>,
    ) -> SlotLeases {
        let renewed_keys: Vec<String> = keys.iter().map(|(key, _)| key.clone()).collect();
        let renewing = tokio::spawn(renew(
            Arc::downgrade(store),
            store.lease / 3,
            name.clone(),
            renewed_keys,
        ))
        .abort_handle();
        SlotLeases {
            store: store.clone(),
            name,
            keys,
            renewing,
        }
    }
}

/// Renews the leases `every` so often while the store lives (until aborted).
async fn renew(store: Weak<RedisStore>, every: Duration, name: String, keys: Vec<String>) {
    loop {
        tokio::time::sleep(every).await;
        let Some(store) = store.upgrade() else {
            return;
        };
        for key in &keys {
            if let Err(error) = store.renew_slot(key, &name).await {
                tracing::debug!(%error, "renewing a concurrency slot failed");
            }
        }
    }
}

impl Drop for SlotLeases {
    fn drop(&mut self) {
        self.renewing.abort();
        let keys = std::mem::take(&mut self.keys);
        for gauge in keys.iter().filter_map(|(_, gauge)| gauge.as_ref()) {
            gauge.dec();
        }
        give_back(
            self.store.clone(),
            std::mem::take(&mut self.name),
            keys.into_iter().map(|(key, _)| key),
        );
    }
}

/// Gives a request's leases back in the background: a drop cannot wait. Without a runtime
/// (the process is ending), the leases expire on their own.
fn give_back(store: Arc<RedisStore>, name: String, keys: impl IntoIterator<Item = String>) {
    let keys: SmallVec<[String; 2]> = keys.into_iter().collect();
    if keys.is_empty() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            for key in &keys {
                if let Err(error) = store.give_back_slot(key, &name).await {
                    tracing::debug!(%error, "giving a concurrency slot back failed; it expires with its lease");
                }
            }
        });
    }
}

/// A lease's name in the sorted sets: random, so that no two requests of any replica share
/// one.
fn lease_name() -> String {
    let mut random = [0u8; 12];
    let _ = getrandom::getrandom(&mut random);
    let mut text = [0u8; 24];
    crate::hex::write_hex(&random, &mut text);
    String::from_utf8_lossy(&text).into_owned()
}

fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}
