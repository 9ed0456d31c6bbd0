//! What `[scan]` detected in the last hour, and the bans in force: this process's, or the
//! fleet's in Redis (read again every second when its version moved). Requests look a key up
//! only while some ban is in force.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Detection, Tracker};
use crate::config::ScanSettings;
use crate::limit::{parse_parts, Clock, KeyParts, RedisStore, Store, StoreError};
use crate::top::spell;

/// How long a detection stays listed.
pub const LISTED_SECONDS: u64 = 3600;

/// One key found scanning, as `/scans` lists it and Redis keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanRecord {
    pub key: String,
    pub distinct_paths: usize,
    pub first_seen_unix: u64,
    pub last_seen_unix: u64,
    pub banned_until_unix: Option<u64>,
    #[serde(default)]
    pub paths: Vec<String>,
}

impl ScanRecord {
    fn listed_at(&self, now: u64) -> bool {
        self.last_seen_unix + LISTED_SECONDS > now || self.banned_at(now)
    }

    fn banned_at(&self, now: u64) -> bool {
        self.banned_until_unix.is_some_and(|until| until > now)
    }
}

/// The records, and the bans by key for requests.
#[derive(Debug, Default)]
struct Table {
    records: Vec<ScanRecord>,
    bans: HashMap<KeyParts, u64, foldhash::fast::FixedState>,
}

impl Table {
    fn of(records: Vec<ScanRecord>) -> Table {
        let bans = (records.iter())
            .filter_map(|record| Some((parse_parts(&record.key)?, record.banned_until_unix?)))
            .collect();
        Table { records, bans }
    }
}

/// `[scan]`'s live state.
pub(crate) struct Scans {
    table: ArcSwap<Table>,
    tracker: Mutex<Tracker>,
    clock: Clock,
    /// With Redis: the store, and the version the table was read at.
    fleet: Option<(Arc<RedisStore>, Mutex<String>)>,
    detected: prometheus::IntCounter,
}

impl Scans {
    pub(crate) fn new(
        store: &Store,
        max_keys: usize,
        clock: Clock,
        detected: prometheus::IntCounter,
    ) -> Scans {
        let fleet = match store {
            Store::Redis(redis) => Some((redis.clone(), Mutex::new(String::new()))),
            Store::Memory(_) => None,
        };
        Scans {
            table: ArcSwap::default(),
            tracker: Mutex::new(Tracker::new(max_keys)),
            clock,
            fleet,
            detected,
        }
    }

    fn now(&self) -> u64 {
        self.clock.unix() as u64
    }

    /// When the ban of `key` ends (Unix seconds) and the seconds left, if one is in force. A
    /// lookup only while some key is banned.
    pub(crate) fn banned_until(&self, key: &KeyParts) -> Option<(u64, u64)> {
        let table = self.table.load();
        if table.bans.is_empty() {
            return None;
        }
        let until = *table.bans.get(key)?;
        let now = self.now();
        (until > now).then_some((until, until - now))
    }

    /// Counts a path answered with a listed status to `key`; on a detection, logs it, counts
    /// it and records it (with its ban) for every replica.
    pub(crate) async fn answered(&self, key: &KeyParts, path: &str, settings: &ScanSettings) {
        let now = self.clock.unix();
        let detection = self.tracker.lock().record(key, path, now, settings);
        if let Some(detection) = detection {
            self.detected(key, detection, settings).await;
        }
    }

    async fn detected(&self, key: &KeyParts, detection: Detection, settings: &ScanSettings) {
        let now = self.now();
        let shown = spell(key);
        self.detected.inc();
        tracing::warn!(
            target: "tollgate::scan",
            key = %shown,
            distinct_paths = detection.distinct_paths,
            within = %humantime::format_duration(settings.within),
            paths = ?detection.paths,
            ban = settings.ban.map(|ban| humantime::format_duration(ban).to_string()),
            "scan detected"
        );
        let record = ScanRecord {
            key: shown,
            distinct_paths: detection.distinct_paths,
            first_seen_unix: detection.first_seen as u64,
            last_seen_unix: now,
            banned_until_unix: settings.ban.map(|ban| now + ban.as_secs().max(1)),
            paths: detection.paths,
        };
        if let Err(error) = self.put(record).await {
            tracing::warn!(%error, "a scan detected was not shared with the fleet: only this replica bans it");
        }
    }

    /// Adds or replaces a record: in this process's table, and with Redis in the fleet's.
    async fn put(&self, record: ScanRecord) -> Result<(), StoreError> {
        let mut records: Vec<ScanRecord> = (self.table.load().records.iter())
            .filter(|known| known.key != record.key)
            .cloned()
            .collect();
        records.push(record.clone());
        self.table.store(Arc::new(Table::of(records)));
        if let Some((store, _)) = &self.fleet {
            let text = serde_json::to_string(&record).unwrap_or_default();
            store.put_scan(&record.key, &text).await?;
        }
        Ok(())
    }

    /// Lifts a key's scan (and its ban) on every replica; whether there was one.
    pub(crate) async fn lift(&self, key: &KeyParts) -> Result<bool, StoreError> {
        let shown = spell(key);
        self.tracker.lock().forget(key);
        let table = self.table.load();
        let listed = table.records.iter().any(|record| record.key == shown);
        let records = (table.records.iter())
            .filter(|record| record.key != shown)
            .cloned()
            .collect();
        self.table.store(Arc::new(Table::of(records)));
        let shared = match &self.fleet {
            Some((store, _)) => store.delete_scan(&shown).await?,
            None => false,
        };
        if listed || shared {
            tracing::info!(target: "tollgate::scan", key = %shown, "scan ban lifted");
        }
        Ok(listed || shared)
    }

    /// The records of the last hour, and the bans still in force.
    pub(crate) fn listed(&self) -> Vec<ScanRecord> {
        let now = self.now();
        let mut records: Vec<ScanRecord> = (self.table.load().records.iter())
            .filter(|record| record.listed_at(now))
            .cloned()
            .collect();
        records.sort_by_key(|record| std::cmp::Reverse(record.last_seen_unix));
        records
    }

    /// Every second: the fleet's records read again when their version moved; records past
    /// the hour dropped (from Redis too); keys with no recent path forgotten.
    pub(crate) async fn refresh(&self, settings: Option<&ScanSettings>) -> Result<(), StoreError> {
        let now = self.now();
        if let Some(settings) = settings {
            let within = settings.within.as_secs_f64();
            self.tracker.lock().sweep(self.clock.unix(), within);
        }
        if let Some((store, version)) = &self.fleet {
            let current = store.scans_version().await?;
            if *version.lock() != current {
                let (read_at, pairs) = store.all_scans().await?;
                let records = (pairs.iter())
                    .filter_map(|(_, text)| serde_json::from_str::<ScanRecord>(text).ok())
                    .collect();
                self.table.store(Arc::new(Table::of(records)));
                *version.lock() = read_at;
            }
        }
        let table = self.table.load();
        let ended: Vec<String> = (table.records.iter())
            .filter(|record| !record.listed_at(now))
            .map(|record| record.key.clone())
            .collect();
        if ended.is_empty() {
            return Ok(());
        }
        let kept = (table.records.iter())
            .filter(|record| record.listed_at(now))
            .cloned()
            .collect();
        self.table.store(Arc::new(Table::of(kept)));
        if let Some((store, _)) = &self.fleet {
            for key in ended {
                store.delete_scan(&key).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, last_seen: u64, banned_until: Option<u64>) -> ScanRecord {
        ScanRecord {
            key: key.into(),
            distinct_paths: 30,
            first_seen_unix: last_seen - 5,
            last_seen_unix: last_seen,
            banned_until_unix: banned_until,
            paths: vec!["/a".into()],
        }
    }

    #[test]
    fn a_record_is_listed_for_an_hour_or_while_its_ban_lasts() {
        assert!(record("v4:10.0.0.0/24", 1000, None).listed_at(1000 + 3599));
        assert!(!record("v4:10.0.0.0/24", 1000, None).listed_at(1000 + 3600));
        assert!(record("v4:10.0.0.0/24", 1000, Some(9000)).listed_at(8999));
    }

    #[test]
    fn bans_are_found_by_key_and_unreadable_keys_are_skipped() {
        let table = Table::of(vec![
            record("v4:10.0.0.0/24", 1000, Some(2000)),
            record("v4:10.0.1.0/24", 1000, None),
            record("not a key", 1000, Some(2000)),
        ]);
        assert_eq!(table.bans.len(), 1);
        let key = parse_parts("v4:10.0.0.0/24").unwrap();
        assert_eq!(table.bans.get(&key), Some(&2000));
        let text = serde_json::to_string(&table.records[0]).unwrap();
        assert_eq!(
            serde_json::from_str::<ScanRecord>(&text).unwrap(),
            table.records[0]
        );
    }
}
