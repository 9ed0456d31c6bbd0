//! Scans as Redis keeps them for the fleet: a hash of every detection (field: the key as
//! spelled, value: its record) and a version counted up by each change, in one slot, with
//! the scripts the overrides use. Replicas read the version every second, and the hash again
//! when it moved: a ban made on one replica holds on every other within a second.

use super::overrides::{DELETE, PUT, READ_ALL};
use super::RedisStore;
use crate::limit::StoreError;

const TABLE: &str = "scans";

impl RedisStore {
    /// Stores a detection's record under its key.
    pub async fn put_scan(&self, key: &str, record: &str) -> Result<(), StoreError> {
        let _: i64 = self.table_script(TABLE, PUT, &[key, record]).await?;
        Ok(())
    }

    /// Deletes a key's record; whether there was one.
    pub async fn delete_scan(&self, key: &str) -> Result<bool, StoreError> {
        let deleted: i64 = self.table_script(TABLE, DELETE, &[key, ""]).await?;
        Ok(deleted == 1)
    }

    /// The version and every record, read in one step.
    pub async fn all_scans(&self) -> Result<(String, Vec<(String, String)>), StoreError> {
        let (version, flat): (String, Vec<String>) =
            self.table_script(TABLE, READ_ALL, &[]).await?;
        let mut pairs = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(field), Some(value)) = (flat.next(), flat.next()) {
            pairs.push((field, value));
        }
        Ok((version, pairs))
    }

    /// The records' version: it moves with every change.
    pub async fn scans_version(&self) -> Result<String, StoreError> {
        let (_, version) = self.table_keys(TABLE);
        let mut command = redis::cmd("GET");
        command.arg(version);
        let version: Option<String> = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            self.query_uncounted(command),
        )
        .await
        .map_err(|_| StoreError::Timeout)??;
        Ok(version.unwrap_or_else(|| "0".to_owned()))
    }
}
