//! One key looked up and reset by an operator (the admin API), and resets heard from the other
//! replicas: a reset deletes the key in Redis and is published, so that every replica's deny
//! cache forgets its refusals of that key at once.

use futures_util::StreamExt as _;
use std::sync::atomic::Ordering;

use super::keys::ban_key;
use super::{Connection, RedisStore};
use crate::limit::{adaptive, BucketKey, Charge, KeyState, StoreError};

/// The bucket's state, its ban's and the server's time, in one step (on a Cluster, at the
/// key's node: the ban key lives in the bucket's slot).
const READ_KEY: &str = r"
local t = redis.call('TIME')
local stored = redis.pcall('GET', KEYS[1])
if type(stored) ~= 'string' then stored = '' end
local ban = redis.pcall('GET', KEYS[2])
if type(ban) ~= 'string' then ban = '' end
return { t[1], t[2], stored, ban }
";

/// When a ban kept as `decide.lua` keeps it (refusals, window opened, until: little-endian
/// doubles, microseconds) ends, in Unix seconds, if it is in force at `now`.
fn banned_until(ban: &[u8], now: f64) -> Option<f64> {
    let until = f64::from_le_bytes(ban.get(16..24)?.try_into().ok()?) / 1e6;
    (ban.len() == 24 && until > now).then_some(until)
}

/// A bucket as `decide.lua` stores it: little-endian doubles, tokens and then the server's
/// time of the last charge (for a quota: the end of its count's period), then for an
/// adaptive key its penalty level and how long it holds.
#[derive(Debug, PartialEq)]
struct StoredBucket {
    tokens: f64,
    second: f64,
    level: u32,
    hold: f64,
}

impl StoredBucket {
    fn parse(bytes: &[u8]) -> Option<StoredBucket> {
        let number = |index: usize| {
            let bytes = bytes.get(index * 8..index * 8 + 8)?;
            Some(f64::from_le_bytes(bytes.try_into().ok()?))
        };
        Some(StoredBucket {
            tokens: number(0)?,
            second: number(1)?,
            level: number(2).unwrap_or(0.0) as u32,
            hold: number(3).unwrap_or(0.0),
        })
    }
}

/// The channel resets are published on, under the store's prefix.
fn reset_channel(prefix: &str) -> String {
    format!("{prefix}resets")
}

/// The channel changes of the overrides are announced on.
pub(super) fn overrides_channel(prefix: &str) -> String {
    format!("{prefix}overrides")
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
        self.query_uncounted(command).await
    }

    /// A call that `tollgate_store_calls_total` does not count: the overrides' version, read
    /// four times a second whatever the traffic.
    pub(super) async fn query_uncounted<T: redis::FromRedisValue + Send>(
        &self,
        command: redis::Cmd,
    ) -> Result<T, StoreError> {
        let result = match &self.connection {
            Connection::Single(node) => {
                let reply = command.query_async(&mut node.current()?).await;
                node.watcher().saw(&reply);
                reply
            }
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
        command.arg(READ_KEY).arg(2).arg(&key).arg(ban_key(&key));
        let (seconds, micros, stored, ban): (u64, u64, Vec<u8>, Vec<u8>) =
            tokio::time::timeout(self.timeout.max(READ_TIMEOUT), self.query(command))
                .await
                .map_err(|_| StoreError::Timeout)??;
        let now = seconds as f64 + micros as f64 / 1e6;
        let stored = StoredBucket::parse(&stored);
        let (level, hold) = stored
            .as_ref()
            .map_or((0, 0.0), |stored| (stored.level, stored.hold / 1e6));
        let multiplier = match params {
            Some(params) if level > 0 && now < hold => {
                adaptive::multiplier(params, charge.capacity, level)
            }
            _ => 1.0,
        };
        let charge = charge.scaled(multiplier);
        let tokens = match (stored, charge.period) {
            (None, _) => charge.capacity,
            (Some(stored), Some(period)) if stored.second == period.end as f64 => {
                stored.tokens.min(charge.capacity)
            }
            (Some(_), Some(_)) => charge.capacity,
            (Some(stored), None) => {
                let elapsed = (now - stored.second / 1e6).max(0.0);
                (stored.tokens + elapsed * charge.rate).min(charge.capacity)
            }
        };
        Ok(KeyState {
            tokens,
            capacity: charge.capacity,
            penalty: (multiplier < 1.0).then_some((multiplier, hold)),
            banned_until: banned_until(&ban, now),
        })
    }

    /// Forgets a key for every replica: deleted in Redis, forgotten by this replica's deny cache
    /// and, through the reset channel, by the others'.
    pub async fn forget(&self, key: &BucketKey<'_>) -> Result<(), StoreError> {
        let key = self.store_key(key);
        let mut delete = redis::cmd("DEL");
        delete.arg(&key).arg(ban_key(&key));
        let _: i64 = self.query(delete).await?;
        self.deny_cache.forget(&key);
        self.leases.forget(&key);
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(reset_channel(&self.prefix)).arg(&key);
        let _: i64 = self.query(publish).await?;
        Ok(())
    }

    /// Listens for resets published by any replica and forgets their keys in the deny cache,
    /// and for changes of the overrides, until the store is dropped. Reconnects (to each node
    /// in turn) when the connection ends; each new subscription counts as a change of the
    /// overrides, since one may have gone unheard.
    pub(crate) async fn follow_resets(store: std::sync::Weak<RedisStore>) {
        let mut attempt = 0usize;
        loop {
            let Some(redis) = store.upgrade() else {
                return;
            };
            // No node yet (a master the sentinels have not named): asked again below.
            let subscribing = redis
                .node_client(attempt)
                .map(|client| (client, redis.prefix.clone()));
            drop(redis);
            attempt += 1;
            let Some((client, prefix)) = subscribing else {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            };
            if let Ok(mut pubsub) = client.get_async_pubsub().await {
                let overrides = overrides_channel(&prefix);
                let channels = [reset_channel(&prefix), overrides.clone()];
                if pubsub.subscribe(&channels).await.is_ok() {
                    let Some(redis) = store.upgrade() else {
                        return;
                    };
                    redis.hearing_resets.store(true, Ordering::Release);
                    redis.overrides_changed.notify_one();
                    drop(redis);
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = messages.next().await {
                        let Some(redis) = store.upgrade() else {
                            return;
                        };
                        if message.get_channel_name() == overrides {
                            redis.overrides_changed.notify_one();
                        } else if let Ok(key) = message.get_payload::<String>() {
                            redis.deny_cache.forget(&key);
                            redis.leases.forget(&key);
                        }
                    }
                    // Resets published from now until the next subscription go unheard.
                    let Some(redis) = store.upgrade() else {
                        return;
                    };
                    redis.hearing_resets.store(false, Ordering::Release);
                    redis.deny_cache.clear();
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

/// An operator's lookup may wait longer than a decision.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::StoredBucket;

    fn bytes(numbers: &[f64]) -> Vec<u8> {
        numbers
            .iter()
            .flat_map(|number| number.to_le_bytes())
            .collect()
    }

    #[test]
    fn a_stored_bucket_is_read_with_or_without_its_penalty() {
        assert_eq!(
            StoredBucket::parse(&bytes(&[2.5, 1.7e15])),
            Some(StoredBucket {
                tokens: 2.5,
                second: 1.7e15,
                level: 0,
                hold: 0.0
            })
        );
        assert_eq!(
            StoredBucket::parse(&bytes(&[-1.0, 1.7e15, 2.0, 1.8e15, 1.8e15, 1.6e15])),
            Some(StoredBucket {
                tokens: -1.0,
                second: 1.7e15,
                level: 2,
                hold: 1.8e15
            })
        );
        assert_eq!(StoredBucket::parse(b""), None, "no key");
        assert_eq!(StoredBucket::parse(&bytes(&[2.5])), None, "cut short");
    }

    #[test]
    fn a_ban_is_read_only_while_in_force() {
        let ban = bytes(&[0.0, 1.7e15, 1.8e15]);
        assert_eq!(super::banned_until(&ban, 1.75e9), Some(1.8e9));
        assert_eq!(super::banned_until(&ban, 1.8e9), None, "ended");
        assert_eq!(
            super::banned_until(&bytes(&[2.0, 1.7e15, 0.0]), 1.7e9),
            None
        );
        assert_eq!(super::banned_until(b"", 1.7e9), None, "no key");
        assert_eq!(super::banned_until(&ban[..20], 0.0), None, "cut short");
    }
}
