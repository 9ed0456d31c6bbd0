//! Concurrency slots shared by every replica: a key's slots are a sorted set of leases, each a
//! request's, scored by when it expires in the server's time. `decide.lua` takes them with the
//! request's tokens; a request renews its leases while in flight and removes them when it
//! ends; a replica that dies leaves leases that expire within one lease, so nothing leaks for
//! longer.

use std::time::Duration;

use super::RedisStore;
use crate::limit::concurrency::SlotKey;
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

fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}
