//! Top keys shared by the fleet: each replica's view under a key of its own that expires, and
//! a sorted set of the replicas that sent one lately, all in one slot (`{top}`). One call a
//! second sends; `/top` reads every fresh view in one call. Neither counts in
//! `tollgate_store_calls_total`, which counts what requests cost.

use super::RedisStore;
use crate::limit::StoreError;

/// Stores the view (ARGV[2]) of replica ARGV[1] for ARGV[3] ms, by Redis's clock.
const SEND: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl * 10)
return 1
";

/// The views of the replicas that sent one within ARGV[1] ms, but ARGV[3]'s; ARGV[2] is the
/// views' key prefix.
const READ: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local replicas = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
local views = {}
for _, replica in ipairs(replicas) do
  if replica ~= ARGV[3] then
    local view = redis.call('GET', ARGV[2] .. replica)
    if view then table.insert(views, view) end
  end
end
return views
";

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl RedisStore {
    fn top_keys(&self) -> (String, String) {
        let replicas = format!("{}{{top}}:replicas", self.prefix);
        let views = format!("{}{{top}}:view:", self.prefix);
        (replicas, views)
    }

    /// Sends this replica's view, kept `ttl_ms`.
    pub async fn send_top(&self, replica: &str, view: &str, ttl_ms: u64) -> Result<(), StoreError> {
        let (replicas, views) = self.top_keys();
        let mut command = redis::cmd("EVAL");
        command
            .arg(SEND)
            .arg(2)
            .arg(replicas)
            .arg(format!("{views}{replica}"))
            .arg(replica)
            .arg(view)
            .arg(ttl_ms);
        let _: i64 = tokio::time::timeout(TIMEOUT, self.query_uncounted(command))
            .await
            .map_err(|_| StoreError::Timeout)??;
        Ok(())
    }

    /// Every other replica's view sent within `ttl_ms`.
    pub async fn fleet_top(&self, replica: &str, ttl_ms: u64) -> Result<Vec<String>, StoreError> {
        let (replicas, views) = self.top_keys();
        let mut command = redis::cmd("EVAL");
        command
            .arg(READ)
            .arg(1)
            .arg(replicas)
            .arg(ttl_ms)
            .arg(views)
            .arg(replica);
        tokio::time::timeout(TIMEOUT, self.query_uncounted(command))
            .await
            .map_err(|_| StoreError::Timeout)?
    }
}
