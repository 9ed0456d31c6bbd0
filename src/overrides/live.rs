//! The overrides a gateway decides with, where they live: this process (kept in `[overrides]
//! file` when set) or Redis (every replica's, polled for changes). Each change is logged and
//! counted, and replaces the table requests read in one swap.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::file::{self, FileError, Kept};
use super::{Override, Table};
use crate::config::Policy;
use crate::key::KeyHasher;
use crate::limit::{Clock, KeyPart, KeyParts, RedisStore, Store, StoreError};
use crate::metrics::{OverrideChange, OverrideMetrics};

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    #[error("the store did not take the change: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    File(#[from] FileError),
}

/// The live overrides.
pub(crate) struct Overrides {
    table: ArcSwap<Table>,
    home: Home,
    clock: Clock,
    /// One change of the table at a time (a file is rewritten whole with each).
    changing: parking_lot::Mutex<()>,
    metrics: OverrideMetrics,
    /// The limits the active gauge has a series of.
    published: parking_lot::Mutex<Vec<String>>,
}

enum Home {
    /// This process's, written to `file` when set.
    Process {
        file: Option<PathBuf>,
        /// What the file keeps of the hashing key (see [`Kept`]).
        hash_secret: Option<String>,
        hashed_with: String,
    },
    /// The fleet's, in Redis; `version` is the one the table was read at.
    Redis {
        store: Arc<RedisStore>,
        version: parking_lot::Mutex<i64>,
    },
}

/// A digest of a hashing key, kept beside the keys it hashed.
fn hasher_digest(hasher: &KeyHasher) -> String {
    let digest = hasher.digest(b"tollgate overrides file");
    let mut hex = [0u8; 32];
    crate::hex::write_hex(&digest, &mut hex);
    String::from_utf8_lossy(&hex[..16]).into_owned()
}

/// The store key of an override's bucket, without the store's prefix (`<limit>:<key>`).
fn field(entry: &Override) -> String {
    format!("{}:{}", entry.limit, entry.key)
}

impl Overrides {
    /// Opens the overrides of a gateway starting with `policy`, and the hasher its requests'
    /// keys are hashed with: the policy's secret, else (with an overrides file) the one the
    /// file keeps, else a new one. An unreadable or malformed file is an error.
    pub(crate) fn open(
        policy: &Policy,
        store: &Store,
        clock: Clock,
        metrics: OverrideMetrics,
    ) -> Result<(Overrides, KeyHasher), FileError> {
        let path = &policy.overrides.file;
        let kept = match (store, path) {
            (Store::Memory(_), Some(path)) => file::read(path)?.unwrap_or_default(),
            _ => Kept::default(),
        };
        let (hasher, hash_secret) = match (&policy.store.hash_key, kept.hash_secret) {
            (Some(secret), _) => (KeyHasher::from_secret(secret.as_bytes()), None),
            (None, Some(secret)) => (KeyHasher::from_secret(secret.as_bytes()), Some(secret)),
            (None, None) => {
                let secret = KeyHasher::random_secret();
                (KeyHasher::from_secret(secret.as_bytes()), Some(secret))
            }
        };
        let hashed_with = hasher_digest(&hasher);
        let mut overrides = kept.overrides;
        if !kept.hashed_with.is_empty() && kept.hashed_with != hashed_with {
            overrides.retain(|entry| {
                let hashed = entry
                    .parts
                    .iter()
                    .any(|part| matches!(part, KeyPart::Digest(_)));
                if hashed {
                    tracing::warn!(
                        target: "tollgate::overrides",
                        limit = %entry.limit,
                        key = %entry.key,
                        "override dropped: its key was hashed with another [store] hash_key"
                    );
                }
                !hashed
            });
        }
        let home = match store {
            Store::Redis(store) => Home::Redis {
                store: store.clone(),
                version: parking_lot::Mutex::new(-1),
            },
            Store::Memory(_) => Home::Process {
                file: path.clone(),
                hash_secret,
                hashed_with,
            },
        };
        let live = Overrides {
            table: ArcSwap::from_pointee(Table::new(overrides)),
            home,
            clock,
            changing: parking_lot::Mutex::new(()),
            metrics,
            published: parking_lot::Mutex::new(Vec::new()),
        };
        // A file kept across a policy change holds overrides of limits the policy may have
        // removed or redefined: dropped as a reload drops them.
        live.reloaded(policy);
        Ok((live, hasher))
    }

    /// What requests look overrides up in.
    #[inline]
    pub(crate) fn table(&self) -> Guard<Arc<Table>> {
        self.table.load()
    }

    /// Now, in Unix seconds, as overrides count time.
    pub(crate) fn now(&self) -> u64 {
        self.clock.unix() as u64
    }

    /// Sets `entry` in place of its key's override; returns the one it replaced.
    pub(crate) async fn set(&self, entry: Override) -> Result<Option<Arc<Override>>, ChangeError> {
        let before = self.table().get(&entry.limit, &entry.parts).cloned();
        match &self.home {
            Home::Redis { store, .. } => {
                store.put_override(&field(&entry), &entry.to_json()).await?;
                self.read_after_change(store, |table| table.with(entry.clone()).0)
                    .await;
            }
            Home::Process { .. } => {
                let changing = self.changing.lock();
                let (table, _) = self.table().with(entry.clone());
                self.keep(&table)?;
                self.install(table, None);
                drop(changing);
            }
        }
        let by = entry.created_by.clone();
        self.changed(
            OverrideChange::Set,
            before.as_deref(),
            Some(&entry),
            &by,
            None,
        );
        Ok(before)
    }

    /// Deletes the override of `limit`'s key `parts`; returns it, `None` if there was none.
    pub(crate) async fn delete(
        &self,
        limit: &str,
        parts: &KeyParts,
        by: &str,
    ) -> Result<Option<Arc<Override>>, ChangeError> {
        // One that ended is gone already, as far as anyone can tell (the sweep drops it).
        let now = self.now();
        let found = self.table().get(limit, parts).cloned();
        let Some(before) = found.filter(|entry| entry.active_at(now)) else {
            return Ok(None);
        };
        match &self.home {
            Home::Redis { store, .. } => {
                if !store.delete_override(&field(&before), None).await? {
                    return Ok(None);
                }
                self.read_after_change(store, |table| table.without(limit, parts).0)
                    .await;
            }
            Home::Process { .. } => {
                let changing = self.changing.lock();
                let (table, _) = self.table().without(limit, parts);
                self.keep(&table)?;
                self.install(table, None);
                drop(changing);
            }
        }
        self.changed(OverrideChange::Delete, Some(&before), None, by, None);
        Ok(Some(before))
    }

    /// The Redis store whose overrides these are, if they are the fleet's.
    pub(crate) fn fleet_store(&self) -> Option<&Arc<RedisStore>> {
        match &self.home {
            Home::Redis { store, .. } => Some(store),
            Home::Process { .. } => None,
        }
    }

    /// Reads the fleet's overrides again when their version moved (with Redis; nothing
    /// to do otherwise).
    pub(crate) async fn refresh(&self) -> Result<(), StoreError> {
        let Home::Redis { store, version } = &self.home else {
            return Ok(());
        };
        let stored = store.overrides_version().await?;
        if stored.parse::<i64>().ok() == Some(*version.lock()) {
            return Ok(());
        }
        self.read_all(store).await
    }

    /// Drops the overrides that ended, each counted and logged.
    pub(crate) async fn expire(&self) {
        let now = self.now();
        let ended: Vec<Arc<Override>> = self
            .table()
            .iter()
            .filter(|entry| !entry.active_at(now))
            .cloned()
            .collect();
        if ended.is_empty() {
            return;
        }
        match &self.home {
            Home::Redis { store, .. } => {
                for entry in &ended {
                    // Every replica tries; the one whose delete takes it counts it.
                    match store
                        .delete_override(&field(entry), Some(&entry.to_json()))
                        .await
                    {
                        Ok(true) => {
                            self.changed(OverrideChange::Expire, Some(entry), None, "", None);
                        }
                        Ok(false) => {}
                        Err(error) => {
                            tracing::debug!(%error, "an ended override stays in the store for now");
                        }
                    }
                }
                let _ = self.read_all(store).await;
            }
            Home::Process { .. } => {
                let changing = self.changing.lock();
                let (table, dropped) = self.table().split_off(|entry| !entry.active_at(now));
                if let Err(error) = self.keep(&table) {
                    // Still ended: decisions never apply an ended override.
                    tracing::error!(%error, "the overrides file keeps overrides that ended");
                }
                self.install(table, None);
                drop(changing);
                for entry in &dropped {
                    self.changed(OverrideChange::Expire, Some(entry), None, "", None);
                }
            }
        }
    }

    /// After a reload: drops the overrides of limits that `policy` no longer has, or has as
    /// another kind, each logged.
    pub(crate) fn reloaded(&self, policy: &Policy) {
        let fits = |entry: &Override| {
            policy.limits.iter().any(|limit| {
                *limit.name == *entry.limit && super::LimitKind::of(limit) == entry.kind
            })
        };
        self.cover(policy);
        let changing = self.changing.lock();
        let (table, dropped) = self.table().split_off(|entry| !fits(entry));
        if dropped.is_empty() {
            return;
        }
        match &self.home {
            Home::Redis { store, .. } => {
                let store = store.clone();
                let stored: Vec<(String, String)> = dropped
                    .iter()
                    .map(|entry| (field(entry), entry.to_json()))
                    .collect();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        for (field, value) in stored {
                            if let Err(error) = store.delete_override(&field, Some(&value)).await {
                                tracing::error!(%error, field, "a dropped override stays in the store");
                            }
                        }
                    });
                }
            }
            Home::Process { .. } => {
                if let Err(error) = self.keep(&table) {
                    tracing::error!(%error, "the overrides file keeps overrides of removed limits");
                }
            }
        }
        self.install(table, None);
        drop(changing);
        for entry in &dropped {
            let why = "its limit was removed or redefined as another kind by a reload";
            self.changed(OverrideChange::Delete, Some(entry), None, "", Some(why));
        }
    }

    /// Writes `table` to the overrides file, when there is one.
    fn keep(&self, table: &Table) -> Result<(), FileError> {
        let Home::Process {
            file: Some(path),
            hash_secret,
            hashed_with,
        } = &self.home
        else {
            return Ok(());
        };
        let kept = Kept {
            hash_secret: hash_secret.clone(),
            hashed_with: hashed_with.clone(),
            overrides: table
                .listed()
                .iter()
                .map(|entry| (**entry).clone())
                .collect(),
        };
        file::write(path, &kept)
    }

    /// After a change stored in Redis: the fleet's overrides read again, or, when that read
    /// fails, the change applied to this replica's table as it was.
    async fn read_after_change(
        &self,
        store: &Arc<RedisStore>,
        changed: impl FnOnce(&Table) -> Table,
    ) {
        if self.read_all(store).await.is_err() {
            let _changing = self.changing.lock();
            let table = changed(&self.table());
            self.install(table, Some(store));
        }
    }

    async fn read_all(&self, store: &Arc<RedisStore>) -> Result<(), StoreError> {
        let (stored_version, pairs) = store.all_overrides().await?;
        let table = Table::new(pairs.into_iter().filter_map(|(field, value)| {
            let entry = Override::parse(&value);
            if entry.is_none() {
                tracing::warn!(
                    field,
                    "an override in the store is not one this version reads; skipped"
                );
            }
            entry
        }));
        let Home::Redis { version, .. } = &self.home else {
            return Ok(());
        };
        let stored_version = stored_version.parse::<i64>().unwrap_or(0);
        let _changing = self.changing.lock();
        let mut seen = version.lock();
        // Two reads may end in either order: the older one never replaces the newer.
        if stored_version < *seen {
            return Ok(());
        }
        *seen = stored_version;
        drop(seen);
        self.install(table, Some(store));
        Ok(())
    }

    /// Swaps in `table` and brings the active gauge up to date; with Redis, the buckets whose
    /// numbers changed are forgotten by this replica's deny cache and token leases, both taken
    /// at the old numbers.
    fn install(&self, table: Table, store: Option<&Arc<RedisStore>>) {
        let old = self.table();
        if let Some(store) = store {
            for entry in table.iter() {
                if old.get(&entry.limit, &entry.parts).map(|old| &**old) != Some(&**entry) {
                    store.forget_cached(&field(entry));
                }
            }
            for entry in old.iter() {
                if table.get(&entry.limit, &entry.parts).is_none() {
                    store.forget_cached(&field(entry));
                }
            }
        }
        drop(old);
        self.publish(&table);
        self.table.store(Arc::new(table));
    }

    /// Logs and counts a change, and brings the active gauge up to date.
    fn changed(
        &self,
        change: OverrideChange,
        before: Option<&Override>,
        after: Option<&Override>,
        by: &str,
        why: Option<&str>,
    ) {
        let entry = after.or(before);
        let json =
            |entry: Option<&Override>| entry.map_or_else(|| "null".to_owned(), Override::to_json);
        tracing::info!(
            target: "tollgate::overrides",
            action = if why.is_some() { "drop" } else { change.as_str() },
            limit = entry.map_or("", |entry| entry.limit.as_str()),
            key = entry.map_or("", |entry| entry.key.as_str()),
            before = %json(before),
            after = %json(after),
            reason = entry.and_then(|entry| entry.reason.as_deref()).unwrap_or(""),
            by,
            why = why.unwrap_or(""),
            "override {}",
            change.as_str()
        );
        self.metrics.changed(change);
    }

    /// Gives every limit of `policy` a series of the active gauge, 0 while it has none.
    fn cover(&self, policy: &Policy) {
        {
            let mut published = self.published.lock();
            for limit in &policy.limits {
                if !published.iter().any(|name| **name == *limit.name) {
                    published.push(limit.name.to_string());
                }
            }
        }
        self.publish(&self.table());
    }

    /// Sets the active gauge of every limit with overrides, and to 0 those that had some (or
    /// are in the policy).
    fn publish(&self, table: &Table) {
        let mut published = self.published.lock();
        let counts: Vec<(String, usize)> = table
            .counts()
            .map(|(limit, count)| (limit.to_owned(), count))
            .collect();
        for limit in published.iter() {
            if !counts.iter().any(|(name, _)| name == limit) {
                self.metrics.active(limit, 0);
            }
        }
        for (limit, count) in &counts {
            self.metrics.active(limit, *count);
        }
        for (limit, _) in counts {
            if !published.contains(&limit) {
                published.push(limit);
            }
        }
    }
}
