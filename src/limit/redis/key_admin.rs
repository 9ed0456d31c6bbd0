//! One key looked up and reset by an operator (the admin API), and resets heard from the other
//! replicas: a reset deletes the key in Redis and is published, so that every replica's deny
//! cache forgets its refusals of that key at once.

use futures_util::StreamExt as _;

use super::{Connection, RedisStore};
use crate::limit::{adaptive, BucketKey, Charge, KeyState, StoreError};

/// The hash's fields and the server's time, in one step (on a Cluster, at the key's node).
const READ_KEY: &str = r"
local t = redis.call('TIME')
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'p', 'level', 'hold')
return { t[1], t[2], h[1] or '', h[2] or '', h[3] or '', h[4] or '', h[5] or '' }
";

/// The channel resets are published on, under the store's prefix.
fn reset_channel(prefix: &str) -> String {
    format!("{prefix}resets")
}

impl RedisStore {
    pub(super) fn store_key(&self, key: &BucketKey<'_>) -> String {
        super::StoreKeys::new(&self.prefix, std::iter::once(key))[0].to_owned()
    }

    pub(super) async fn query<T: redis::FromRedisValue + Send>(
        &self,
        command: redis::Cmd,
    ) -> Result<T, StoreError> {
        self.calls.inc();
        let result = match &self.connection {
            Connection::Single(manager) => command.query_async(&mut manager.clone()).await,
            Connection::Cluster(_) => command.query_async(&mut self.cluster().await?).await,
        };
        result.map_err(|error| StoreError::Redis(error.to_string()))
    }

    /// A key's state now, as its next decision would find it.
    pub async fn inspect(
        &self,
        key: &BucketKey<'_>,
        charge: &Charge,
        params: Option<&adaptive::AdaptiveParams>,
    ) -> Result<KeyState, StoreError> {
        let key = self.store_key(key);
        let mut command = redis::cmd("EVAL");
        command.arg(READ_KEY).arg(1).arg(&key);
        let fields: Vec<String> =
            tokio::time::timeout(self.timeout.max(READ_TIMEOUT), self.query(command))
                .await
                .map_err(|_| StoreError::Timeout)??;
        let number = |index: usize| fields.get(index).and_then(|text| text.parse::<f64>().ok());
        let now = number(0).unwrap_or(0.0) + number(1).unwrap_or(0.0) / 1e6;
        let level = number(5).unwrap_or(0.0) as u32;
        let hold = number(6).unwrap_or(0.0) / 1e6;
        let multiplier = match params {
            Some(params) if level > 0 && now < hold => {
                adaptive::multiplier(params, charge.capacity, level)
            }
            _ => 1.0,
        };
        let charge = charge.scaled(multiplier);
        let tokens = match (number(2), charge.period) {
            (None, _) => charge.capacity,
            (Some(tokens), Some(period)) if number(4) == Some(period.end as f64) => {
                tokens.min(charge.capacity)
            }
            (Some(_), Some(_)) => charge.capacity,
            (Some(tokens), None) => {
                let elapsed = (now - number(3).unwrap_or(now * 1e6) / 1e6).max(0.0);
                (tokens + elapsed * charge.rate).min(charge.capacity)
            }
        };
        Ok(KeyState {
            tokens,
            capacity: charge.capacity,
            penalty: (multiplier < 1.0).then_some((multiplier, hold)),
        })
    }

    /// Forgets a key for every replica: deleted in Redis, forgotten by this replica's deny cache
    /// and, through the reset channel, by the others'.
    pub async fn forget(&self, key: &BucketKey<'_>) -> Result<(), StoreError> {
        let key = self.store_key(key);
        let mut delete = redis::cmd("DEL");
        delete.arg(&key);
        let _: i64 = self.query(delete).await?;
        self.deny_cache.forget(&key);
        self.leases.forget(&key);
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(reset_channel(&self.prefix)).arg(&key);
        let _: i64 = self.query(publish).await?;
        Ok(())
    }

    /// Listens for resets published by any replica and forgets their keys in the deny cache,
    /// until the store is dropped. Reconnects (to each node in turn) when the connection ends.
    pub(crate) async fn follow_resets(store: std::sync::Weak<crate::shared::Shared>) {
        let mut attempt = 0usize;
        loop {
            let Some(client) = store.upgrade().and_then(|shared| match &shared.store {
                crate::limit::Store::Redis(redis) => redis
                    .node_client(attempt)
                    .map(|client| (client, redis.prefix.clone())),
                crate::limit::Store::Memory(_) => None,
            }) else {
                return;
            };
            let (client, prefix) = client;
            attempt += 1;
            if let Ok(mut pubsub) = client.get_async_pubsub().await {
                if pubsub.subscribe(reset_channel(&prefix)).await.is_ok() {
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = messages.next().await {
                        let Some(shared) = store.upgrade() else {
                            return;
                        };
                        if let (crate::limit::Store::Redis(redis), Ok(key)) =
                            (&shared.store, message.get_payload::<String>())
                        {
                            redis.deny_cache.forget(&key);
                            redis.leases.forget(&key);
                        }
                    }
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

/// An operator's lookup may wait longer than a decision.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
