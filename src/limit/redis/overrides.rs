//! Overrides as Redis keeps them for the fleet: one hash of every override (field: limit and
//! key, value: the override as its owner spells it) and a version counted up by each change,
//! in one slot. Each change is announced on `<prefix>overrides`; a replica that hears it (or
//! that cannot hear, its subscription down) reads the version, and the hash again when it
//! moved. A request makes no store call for overrides.

use super::key_admin::overrides_channel;
use super::RedisStore;
use crate::limit::StoreError;

/// Sets a field and counts the change.
pub(super) const PUT: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCR', KEYS[2])
";

/// Deletes a field (only if it still holds ARGV[2], when given) and counts the change; 1 if
/// there was one.
pub(super) const DELETE: &str = r"
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
local deleted = redis.call('HDEL', KEYS[1], ARGV[1])
if deleted == 1 then redis.call('INCR', KEYS[2]) end
return deleted
";

/// The version and every field, read in one step.
pub(super) const READ_ALL: &str = r"
return { redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1]) }
";

/// An operator's change may wait longer than a decision.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl RedisStore {
    fn overrides_keys(&self) -> (String, String) {
        self.table_keys("overrides")
    }

    /// A table's hash and version keys, in one slot.
    pub(super) fn table_keys(&self, table: &str) -> (String, String) {
        let hash = format!("{}{{{table}}}", self.prefix);
        let version = format!("{hash}:version");
        (hash, version)
    }

    async fn overrides_script<T: redis::FromRedisValue + Send>(
        &self,
        script: &str,
        args: &[&str],
    ) -> Result<T, StoreError> {
        self.table_script("overrides", script, args).await
    }

    /// One of this file's scripts on `table`'s hash and version.
    pub(super) async fn table_script<T: redis::FromRedisValue + Send>(
        &self,
        table: &str,
        script: &str,
        args: &[&str],
    ) -> Result<T, StoreError> {
        let (hash, version) = self.table_keys(table);
        let mut command = redis::cmd("EVAL");
        command.arg(script).arg(2).arg(hash).arg(version);
        for arg in args {
            command.arg(*arg);
        }
        tokio::time::timeout(TIMEOUT, self.query(command))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    /// Stores `value` under `field`, for every replica.
    pub async fn put_override(&self, field: &str, value: &str) -> Result<(), StoreError> {
        let _: i64 = self.overrides_script(PUT, &[field, value]).await?;
        self.announce_overrides().await;
        Ok(())
    }

    /// Tells the other replicas that the overrides changed. Unheard, it is caught up by the
    /// replicas that poll while their subscription is down.
    async fn announce_overrides(&self) {
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(overrides_channel(&self.prefix)).arg("changed");
        let announced = tokio::time::timeout(TIMEOUT, self.query::<i64>(publish)).await;
        if !matches!(announced, Ok(Ok(_))) {
            tracing::warn!("a change of the overrides was not announced: the other replicas read it at their next poll (within 10 s)");
        }
    }

    /// Waits until another replica announces a change of the overrides, or this replica's
    /// subscription begins again (a change may have gone unheard meanwhile).
    pub async fn overrides_changed(&self) {
        self.overrides_changed.notified().await;
    }

    /// Deletes `field`; only while it holds `only_if` when that is given (an expiry must not
    /// delete the override that replaced the one that expired). Whether it was deleted.
    pub async fn delete_override(
        &self,
        field: &str,
        only_if: Option<&str>,
    ) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .overrides_script(DELETE, &[field, only_if.unwrap_or_default()])
            .await?;
        if deleted == 1 {
            self.announce_overrides().await;
        }
        Ok(deleted == 1)
    }

    /// The overrides' version: it moves with every change.
    pub async fn overrides_version(&self) -> Result<String, StoreError> {
        let (_, version) = self.overrides_keys();
        let mut command = redis::cmd("GET");
        command.arg(version);
        let version: Option<String> = tokio::time::timeout(TIMEOUT, self.query_uncounted(command))
            .await
            .map_err(|_| StoreError::Timeout)??;
        Ok(version.unwrap_or_else(|| "0".to_owned()))
    }

    /// The version and every stored override's field and value.
    pub async fn all_overrides(&self) -> Result<(String, Vec<(String, String)>), StoreError> {
        let (version, flat): (String, Vec<String>) = self.overrides_script(READ_ALL, &[]).await?;
        let mut pairs = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(field), Some(value)) = (flat.next(), flat.next()) {
            pairs.push((field, value));
        }
        Ok((version, pairs))
    }

    /// Forgets what this replica remembers of a bucket (`<limit>:<key>`) whose numbers
    /// changed: its deny cache's refusal and its token lease, both taken at the old numbers.
    pub fn forget_cached(&self, bucket: &str) {
        let key = format!("{}{bucket}", self.prefix);
        self.deny_cache.forget(&key);
        self.leases.forget(&key);
    }
}
