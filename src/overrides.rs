//! Overrides: one key's numbers in one limit, changed while the gateway runs (a launch's
//! raise, an abuser's cut, a partner exempted for a week), for a while.
//!
//! An [`Override`] says which numbers replace the limit's own for one key; a [`Table`] holds
//! them all, looked up by limit and key on the request path (a key without one costs a check
//! that the limit has none). [`change`] reads what an operator asks for, [`live`] keeps the
//! table where it lives (a file beside the memory store, or Redis for the fleet).

pub mod change;
mod file;
pub(crate) mod live;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{Limit, Rate, Tier};
use crate::limit::{self, KeyParts};

pub use change::{Change, FieldError};
pub use file::FileError;
pub(crate) use live::Overrides;

/// What a limit counts, which decides the numbers an override of it may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitKind {
    /// Tokens that refill: `capacity` and `rate`.
    Bucket,
    /// A calendar quota: `quota` per period.
    Quota,
    /// Requests in flight: `concurrency`.
    Concurrency,
}

impl LimitKind {
    pub fn of(limit: &Limit) -> LimitKind {
        if limit.concurrency.is_some() {
            LimitKind::Concurrency
        } else if limit.calendar.is_some() {
            LimitKind::Quota
        } else {
            LimitKind::Bucket
        }
    }
}

/// One key's numbers in one limit, as stored and as the admin API shows it. The numbers it
/// leaves out (`None`) are the limit's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Override {
    pub limit: String,
    /// The key as the access log shows it: networks, ASNs, countries and JA4 in clear, other
    /// values as their keyed hash.
    pub key: String,
    pub kind: LimitKind,
    pub capacity: Option<f64>,
    pub rate_per_second: Option<f64>,
    pub quota: Option<f64>,
    pub concurrency: Option<u32>,
    pub exempt: bool,
    /// When it ends; `None`: when it is deleted.
    pub expires_unix: Option<u64>,
    pub reason: Option<String>,
    pub label: Option<String>,
    pub created_unix: u64,
    /// The address of the peer that set it.
    pub created_by: String,
    /// The key's parts, read from `key`.
    #[serde(skip)]
    pub parts: KeyParts,
}

impl Override {
    /// The override `change` asks for on `limit`'s key `parts`, set at `now` by `by`.
    pub fn new(limit: &Limit, parts: KeyParts, change: Change, now: u64, by: String) -> Override {
        let mut key = String::new();
        limit::push_parts(&parts, &mut key);
        Override {
            limit: limit.name.to_string(),
            key,
            kind: LimitKind::of(limit),
            capacity: change.capacity,
            rate_per_second: change.rate.map(|rate| rate.per_second()),
            quota: change.quota,
            concurrency: change.concurrency,
            exempt: change.exempt,
            expires_unix: change
                .ttl
                .map(|ttl| now.saturating_add(ttl.as_secs().max(1))),
            reason: change.reason,
            label: change.label,
            created_unix: now,
            created_by: by,
            parts,
        }
    }

    /// Reads a stored override back (JSON, as [`Override::to_json`] wrote it); `None` for
    /// anything that is not one.
    pub fn parse(text: &str) -> Option<Override> {
        let mut stored: Override = serde_json::from_str(text).ok()?;
        stored.parts = limit::parse_parts(&stored.key)?;
        Some(stored)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether it is still in force at `now` (Unix seconds).
    pub fn active_at(&self, now: u64) -> bool {
        self.expires_unix.is_none_or(|expires| now < expires)
    }

    /// The numbers a request of this key is decided with in `limit` (a bucket or a quota):
    /// the override's, and the limit's own where it sets none.
    pub fn tier(&self, limit: &Limit) -> Tier {
        if self.exempt {
            return Tier::Exempt;
        }
        let per_second = |tokens: f64| Rate {
            tokens,
            period: Duration::from_secs(1),
        };
        match (self.kind, self.quota) {
            // A quota's rate only spreads it over its nominal period, as a tier's does.
            (LimitKind::Quota, Some(quota)) => Tier::Bucket {
                capacity: quota,
                rate: Rate {
                    tokens: quota,
                    period: limit.rate.period,
                },
            },
            _ => Tier::Bucket {
                capacity: self.capacity.unwrap_or(limit.capacity),
                rate: self.rate_per_second.map_or(limit.rate, per_second),
            },
        }
    }

    /// The slots a concurrency limit gives this key; `None` when it is exempt.
    pub fn slots(&self, limit_slots: u32) -> Option<u32> {
        (!self.exempt).then(|| self.concurrency.unwrap_or(limit_slots))
    }

    /// Soonest to end first, those without an end last: the order lists show them in.
    fn list_order(&self) -> (u64, &str, &str) {
        (
            self.expires_unix.unwrap_or(u64::MAX),
            &self.limit,
            &self.key,
        )
    }
}

/// One limit's overrides, by key.
type Keys = HashMap<KeyParts, Arc<Override>, foldhash::quality::RandomState>;

/// Every override, by limit and key: what requests look up, replaced whole on each change.
/// The limits are few and found by name without hashing it; a key is hashed only in a limit
/// that has overrides.
#[derive(Debug, Default, Clone)]
pub struct Table {
    limits: Vec<(Arc<str>, Keys)>,
}

impl Table {
    pub fn new(overrides: impl IntoIterator<Item = Override>) -> Table {
        let mut table = Table::default();
        for entry in overrides {
            table.insert(Arc::new(entry));
        }
        table
    }

    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The override of `limit`'s key `parts` that fits the limit as it is now (one of a
    /// limit since redefined as another kind is not its any more), in force or not.
    #[inline]
    pub fn find(&self, limit: &Limit, parts: &KeyParts) -> Option<&Arc<Override>> {
        let found = self.keys(&limit.name)?.get(parts)?;
        (found.kind == LimitKind::of(limit)).then_some(found)
    }

    /// The override of the limit named `limit` for the key `parts`, whatever its kind.
    pub fn get(&self, limit: &str, parts: &KeyParts) -> Option<&Arc<Override>> {
        self.keys(limit)?.get(parts)
    }

    #[inline]
    fn keys(&self, limit: &str) -> Option<&Keys> {
        self.limits
            .iter()
            .find(|(name, _)| **name == *limit)
            .map(|(_, keys)| keys)
    }

    /// The override of `limit`'s key `parts` in force at `now`.
    pub fn in_force(&self, limit: &Limit, parts: &KeyParts, now: u64) -> Option<&Arc<Override>> {
        self.find(limit, parts).filter(|found| found.active_at(now))
    }

    /// The table with `entry` in place of the key's override, if it had one (returned).
    pub fn with(&self, entry: Override) -> (Table, Option<Arc<Override>>) {
        let mut table = self.clone();
        let before = table.insert(Arc::new(entry));
        (table, before)
    }

    /// The table without the override of `limit`'s key `parts` (returned, if it had one).
    pub fn without(&self, limit: &str, parts: &KeyParts) -> (Table, Option<Arc<Override>>) {
        let mut table = self.clone();
        let removed = table.remove(limit, parts);
        (table, removed)
    }

    /// The table without the overrides `drop` picks, and those.
    pub fn split_off(&self, drop: impl Fn(&Override) -> bool) -> (Table, Vec<Arc<Override>>) {
        let (dropped, kept): (Vec<_>, Vec<_>) = self.iter().cloned().partition(|entry| drop(entry));
        let mut table = Table::default();
        for entry in kept {
            table.insert(entry);
        }
        (table, dropped)
    }

    /// Every override, soonest to end first and those without an end last.
    pub fn listed(&self) -> Vec<Arc<Override>> {
        let mut listed: Vec<Arc<Override>> = self.iter().cloned().collect();
        listed.sort_by(|one, other| one.list_order().cmp(&other.list_order()));
        listed
    }

    /// How many overrides each limit has.
    pub fn counts(&self) -> impl Iterator<Item = (&str, usize)> {
        self.limits
            .iter()
            .map(|(limit, keys)| (&**limit, keys.len()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Override>> {
        self.limits.iter().flat_map(|(_, keys)| keys.values())
    }

    fn insert(&mut self, entry: Arc<Override>) -> Option<Arc<Override>> {
        let at = match self
            .limits
            .iter()
            .position(|(name, _)| **name == *entry.limit)
        {
            Some(at) => at,
            None => {
                self.limits
                    .push((Arc::from(entry.limit.as_str()), Keys::default()));
                self.limits.len() - 1
            }
        };
        self.limits[at].1.insert(entry.parts.clone(), entry)
    }

    fn remove(&mut self, limit: &str, parts: &KeyParts) -> Option<Arc<Override>> {
        let at = self.limits.iter().position(|(name, _)| **name == *limit)?;
        let removed = self.limits[at].1.remove(parts);
        if self.limits[at].1.is_empty() {
            self.limits.swap_remove(at);
        }
        removed
    }
}

#[cfg(test)]
mod tests;
