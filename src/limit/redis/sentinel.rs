//! Redis under Sentinel: the master the sentinels name, asked at start and again every second,
//! and the store pointed at it when they name another (a failover). In between, calls fail
//! as the store's failures do, and each route's `on_store_failure` decides.

use std::sync::Weak;
use std::time::Duration;

use super::{node_client, node_manager, Connection, Credentials, RedisStore};
use crate::limit::StoreError;

/// How often the sentinels are asked: a failover is followed within this of their naming
/// the new master (and the time to connect).
const ASK_EVERY: Duration = Duration::from_secs(1);

impl RedisStore {
    /// Asks the sentinels (the first that answers) for the master, checks that the node they
    /// name says it is one, and points the store at it if it moved. Whether it moved.
    pub async fn find_master(&self) -> Result<bool, StoreError> {
        let (Some(settings), Connection::Single(node)) = (&self.sentinel, &self.connection) else {
            return Ok(false);
        };
        let sentinel = settings.sentinel.as_ref().expect("sentinel settings");
        let mut named = None;
        for url in &sentinel.sentinels {
            match self.ask(url, &sentinel.credentials, &sentinel.master).await {
                Ok(Some(address)) => {
                    named = Some(address);
                    break;
                }
                Ok(None) | Err(_) => continue,
            }
        }
        let Some((host, port)) = named else {
            return Err(StoreError::Redis(format!(
                "no sentinel names a master {:?}",
                sentinel.master
            )));
        };
        let url = format!("{}://{host}:{port}/{}", sentinel.scheme, sentinel.db);
        if node.url().as_deref() == Some(url.as_str()) {
            return Ok(false);
        }
        if !self.is_master(&url).await? {
            return Err(StoreError::Redis(format!(
                "{host}:{port}, which the sentinels name, is not a master (yet)"
            )));
        }
        let manager = node_manager(&url, settings, self.ca_roots.as_deref())?;
        node.replace(url, manager);
        // What this replica remembers was decided at the old master.
        self.deny_cache.clear();
        tracing::info!(master = %sentinel.master, address = %format!("{host}:{port}"), "store: following the master the sentinels name");
        Ok(true)
    }

    /// `SENTINEL get-master-addr-by-name` of one sentinel.
    async fn ask(
        &self,
        url: &str,
        credentials: &Credentials,
        master: &str,
    ) -> Result<Option<(String, u16)>, StoreError> {
        let failed = |error: redis::RedisError| StoreError::Redis(error.to_string());
        let client =
            node_client(url.to_owned(), credentials, self.ca_roots.as_deref()).map_err(failed)?;
        let asking = async {
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut connection)
                .await
        };
        tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), asking)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(failed)
    }

    /// Whether the node at `url` says it is a master (`ROLE`).
    async fn is_master(&self, url: &str) -> Result<bool, StoreError> {
        let failed = |error: redis::RedisError| StoreError::Redis(error.to_string());
        let client = node_client(url.to_owned(), &self.credentials, self.ca_roots.as_deref())
            .map_err(failed)?;
        let asking = async {
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut connection)
                .await
        };
        let role = tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), asking)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(failed)?;
        Ok(match role {
            redis::Value::Array(parts) => matches!(
                parts.first(),
                Some(redis::Value::BulkString(role)) if role == b"master"
            ),
            _ => false,
        })
    }

    /// Asks the sentinels every second until the store is dropped.
    pub(crate) async fn follow_master(store: Weak<RedisStore>) {
        loop {
            tokio::time::sleep(ASK_EVERY).await;
            let Some(store) = store.upgrade() else {
                return;
            };
            if let Err(error) = store.find_master().await {
                tracing::warn!(%error, "store: the master could not be found");
            }
        }
    }

    /// Whether the store's node is the master the sentinels name.
    pub fn under_sentinel(&self) -> bool {
        self.sentinel.is_some()
    }
}
