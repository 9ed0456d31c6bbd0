//! `[scan]`: keys that get many distinct paths answered with the listed statuses in a short
//! window (a dictionary of paths walked, all "not found"). The tracker is pure: each key's
//! distinct paths counted exactly up to the threshold, in bounded memory per key, with the
//! keys bounded (the oldest forgotten first). What was detected, and the bans, live in
//! `scan/live.rs`.

pub mod live;

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher as _;

use crate::config::ScanSettings;
use crate::limit::KeyParts;

/// Paths a detection's log line and record keep as examples.
pub const SAMPLE_PATHS: usize = 5;

type Hasher = foldhash::fast::FixedState;

/// One key's recent distinct paths: each path's hash and when it was last answered.
#[derive(Debug, Default)]
struct KeyPaths {
    paths: Vec<(u64, f64)>,
    samples: Vec<String>,
    first_seen: f64,
    /// Which insertion into the tracker's order this is (older ones there are stale).
    generation: u64,
}

/// A key found scanning.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    pub distinct_paths: usize,
    pub first_seen: f64,
    /// Up to [`SAMPLE_PATHS`] of the paths.
    pub paths: Vec<String>,
}

/// Every tracked key's distinct paths within the window.
#[derive(Debug)]
pub struct Tracker {
    keys: HashMap<KeyParts, KeyPaths, Hasher>,
    /// Keys in the order they were first tracked, with their generation.
    order: VecDeque<(KeyParts, u64)>,
    max_keys: usize,
    generations: u64,
    hasher: Hasher,
}

impl Tracker {
    pub fn new(max_keys: usize) -> Self {
        Tracker {
            keys: HashMap::with_hasher(Hasher::default()),
            order: VecDeque::new(),
            max_keys: max_keys.max(1),
            generations: 0,
            hasher: Hasher::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Counts `path` answered with a listed status to `key` at `now` (Unix seconds); a
    /// detection when the key reaches `distinct_paths` within `within`. The key then starts
    /// counting again.
    pub fn record(
        &mut self,
        key: &KeyParts,
        path: &str,
        now: f64,
        settings: &ScanSettings,
    ) -> Option<Detection> {
        let within = settings.within.as_secs_f64();
        let hash = self.hasher.hash_one(path);
        if !self.keys.contains_key(key) {
            self.make_room();
            self.generations += 1;
            self.order.push_back((key.clone(), self.generations));
            self.keys.insert(
                key.clone(),
                KeyPaths {
                    first_seen: now,
                    generation: self.generations,
                    ..KeyPaths::default()
                },
            );
        }
        let tracked = self.keys.get_mut(key)?;
        tracked.paths.retain(|(_, at)| now - at < within);
        if tracked.paths.is_empty() {
            tracked.first_seen = now;
            tracked.samples.clear();
        }
        match tracked.paths.iter_mut().find(|(known, _)| *known == hash) {
            Some((_, at)) => *at = now,
            None => {
                tracked.paths.push((hash, now));
                if tracked.samples.len() < SAMPLE_PATHS {
                    tracked.samples.push(path.to_owned());
                }
            }
        }
        if tracked.paths.len() < settings.distinct_paths {
            return None;
        }
        let detection = Detection {
            distinct_paths: tracked.paths.len(),
            first_seen: tracked.first_seen,
            paths: std::mem::take(&mut tracked.samples),
        };
        tracked.paths.clear();
        Some(detection)
    }

    /// Forgets a key's paths (its ban was lifted: it starts afresh).
    pub fn forget(&mut self, key: &KeyParts) {
        self.keys.remove(key);
    }

    /// Drops keys with no path left in the window.
    pub fn sweep(&mut self, now: f64, within: f64) {
        self.keys
            .retain(|_, tracked| tracked.paths.iter().any(|(_, at)| now - at < within));
        let keys = &self.keys;
        self.order.retain(|(key, generation)| {
            keys.get(key)
                .is_some_and(|tracked| tracked.generation == *generation)
        });
    }

    /// Forgets the oldest tracked keys until one more fits.
    fn make_room(&mut self) {
        while self.keys.len() >= self.max_keys {
            let Some((oldest, generation)) = self.order.pop_front() else {
                return;
            };
            if self
                .keys
                .get(&oldest)
                .is_some_and(|t| t.generation == generation)
            {
                self.keys.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::KeyPart;

    fn settings(distinct_paths: usize) -> ScanSettings {
        let policy = crate::config::Policy::parse(
            "test",
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"a\"\n[scan]\nkey = \"client_network\"\nwithin = \"10s\"\n",
        )
        .unwrap();
        let mut scan = (*policy.scan.unwrap()).clone();
        scan.distinct_paths = distinct_paths;
        assert_eq!(scan.within, Duration::from_secs(10));
        scan
    }

    fn key(octet: u8) -> KeyParts {
        KeyParts::from_iter([KeyPart::Network(
            format!("10.0.0.{octet}/32").parse().unwrap(),
        )])
    }

    #[test]
    fn distinct_paths_within_the_window_are_a_scan_and_repeats_are_not() {
        let settings = settings(3);
        let mut tracker = Tracker::new(100);
        let scanner = key(1);
        assert_eq!(tracker.record(&scanner, "/a", 0.0, &settings), None);
        assert_eq!(
            tracker.record(&scanner, "/a", 1.0, &settings),
            None,
            "a repeat"
        );
        assert_eq!(tracker.record(&scanner, "/b", 2.0, &settings), None);
        let detected = tracker.record(&scanner, "/c", 3.0, &settings).unwrap();
        assert_eq!(detected.distinct_paths, 3);
        assert_eq!(detected.first_seen, 0.0);
        assert_eq!(detected.paths, ["/a", "/b", "/c"]);
        // Counting starts again after a detection.
        assert_eq!(tracker.record(&scanner, "/d", 4.0, &settings), None);
    }

    #[test]
    fn paths_older_than_the_window_do_not_count() {
        let settings = settings(3);
        let mut tracker = Tracker::new(100);
        let slow = key(2);
        for (at, path) in [(0.0, "/a"), (6.0, "/b"), (12.0, "/c"), (18.0, "/d")] {
            assert_eq!(tracker.record(&slow, path, at, &settings), None, "{path}");
        }
    }

    #[test]
    fn keys_are_bounded_and_the_oldest_is_forgotten_first() {
        let settings = settings(2);
        let mut tracker = Tracker::new(2);
        tracker.record(&key(1), "/a", 0.0, &settings);
        tracker.record(&key(2), "/a", 0.0, &settings);
        tracker.record(&key(3), "/a", 0.0, &settings);
        assert_eq!(tracker.len(), 2);
        // Key 1 was forgotten: its next path is its first again.
        assert_eq!(tracker.record(&key(1), "/b", 1.0, &settings), None);
        assert!(tracker.record(&key(3), "/b", 1.0, &settings).is_some());
        tracker.sweep(100.0, 10.0);
        assert!(tracker.is_empty());
    }

    #[test]
    fn memory_per_key_is_bounded_by_the_threshold() {
        let settings = settings(50);
        let mut tracker = Tracker::new(10);
        let scanner = key(1);
        let mut detections = 0;
        for n in 0..1000 {
            if tracker
                .record(&scanner, &format!("/{n}"), f64::from(n) / 1000.0, &settings)
                .is_some()
            {
                detections += 1;
            }
            assert!(tracker.keys[&scanner].paths.len() < 50);
        }
        assert_eq!(detections, 20);
    }
}
