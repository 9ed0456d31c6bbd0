//! Heavy hitters in bounded memory (pure): the space-saving summary a thread counts into, and
//! the frozen summaries windows and replicas are merged from.
//!
//! Every count is an upper bound of the key's true count, overestimating it by at most the
//! entry's `error`; a key not listed counted at most `bound`. Both stay within total ÷
//! capacity, so every key whose true count exceeds that is listed (Metwally et al.'s
//! space-saving, and its merge kept within the same bound).

use std::collections::HashMap;
use std::hash::Hash;

type Hasher = foldhash::fast::FixedState;

/// One tracked key.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<K> {
    pub key: K,
    /// An upper bound of the key's true count ...
    pub count: f64,
    /// ... which exceeds it by at most this much.
    pub error: f64,
}

/// The live summary: at most `capacity` keys, each weighted increment O(log capacity).
///
/// A new key, with the table full, takes the place of the smallest count and inherits it as
/// its error. The smallest count is the root of a min-heap of entry indexes; entries never
/// move, so the map from key to entry is written only when a key comes or goes.
#[derive(Debug)]
pub struct SpaceSaving<K> {
    capacity: usize,
    entries: Vec<Entry<K>>,
    index: HashMap<K, u32, Hasher>,
    /// Entry indexes ordered as a min-heap by count, and each entry's place in it.
    heap: Vec<u32>,
    place: Vec<u32>,
    total: f64,
    /// The entry counted last: the same key again (a heavy hitter's next request) is found
    /// by one comparison instead of a hash and a probe.
    last: u32,
}

impl<K: Hash + Eq + Clone> SpaceSaving<K> {
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity,
            entries: Vec::new(),
            index: HashMap::with_hasher(Hasher::default()),
            heap: Vec::new(),
            place: Vec::new(),
            total: 0.0,
            last: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0.0
    }

    /// Counts `weight` more for `key`.
    #[inline]
    pub fn add(&mut self, key: &K, weight: f64) {
        // NaN too is no weight.
        if weight.is_nan() || weight <= 0.0 {
            return;
        }
        let last = self.last as usize;
        match self.entries.get_mut(last) {
            Some(entry) if entry.key == *key => {
                self.total += weight;
                entry.count += weight;
                self.sift_down(self.place[last] as usize);
            }
            _ => self.add_found(key, weight),
        }
    }

    /// [`SpaceSaving::add`] of a key other than the last one counted.
    #[inline(never)]
    fn add_found(&mut self, key: &K, weight: f64) {
        if self.capacity == 0 {
            return;
        }
        self.total += weight;
        if let Some(&entry) = self.index.get(key) {
            self.last = entry;
            self.entries[entry as usize].count += weight;
            self.sift_down(self.place[entry as usize] as usize);
        } else if self.entries.len() < self.capacity {
            let entry = self.entries.len() as u32;
            self.last = entry;
            self.entries.push(Entry {
                key: key.clone(),
                count: weight,
                error: 0.0,
            });
            self.index.insert(key.clone(), entry);
            self.place.push(self.heap.len() as u32);
            self.heap.push(entry);
            self.sift_up(self.heap.len() - 1);
        } else {
            let entry = self.heap[0];
            self.last = entry;
            let smallest = &mut self.entries[entry as usize];
            self.index.remove(&smallest.key);
            self.index.insert(key.clone(), entry);
            smallest.key = key.clone();
            smallest.error = smallest.count;
            smallest.count += weight;
            self.sift_down(0);
        }
    }

    /// What was counted, frozen: the live table is left as it was.
    pub fn freeze(&self) -> Summary<K> {
        let full = self.entries.len() == self.capacity;
        Summary {
            entries: self.entries.clone(),
            bound: match self.heap.first() {
                Some(&smallest) if full => self.entries[smallest as usize].count,
                _ => 0.0,
            },
            total: self.total,
        }
    }

    /// Everything counted so far, frozen, and the table emptied.
    pub fn take(&mut self) -> Summary<K> {
        let summary = self.freeze();
        *self = SpaceSaving::new(self.capacity);
        summary
    }

    fn count_at(&self, place: usize) -> f64 {
        self.entries[self.heap[place] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.place[self.heap[a] as usize] = a as u32;
        self.place[self.heap[b] as usize] = b as u32;
    }

    fn sift_up(&mut self, mut place: usize) {
        while place > 0 {
            let parent = (place - 1) / 2;
            if self.count_at(parent) <= self.count_at(place) {
                break;
            }
            self.swap(parent, place);
            place = parent;
        }
    }

    fn sift_down(&mut self, mut place: usize) {
        loop {
            let (left, right) = (2 * place + 1, 2 * place + 2);
            let mut smallest = place;
            if left < self.heap.len() && self.count_at(left) < self.count_at(smallest) {
                smallest = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(smallest) {
                smallest = right;
            }
            if smallest == place {
                return;
            }
            self.swap(place, smallest);
            place = smallest;
        }
    }
}

/// A summary no longer counted into: a slot of time, a window, a replica's view.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary<K> {
    pub entries: Vec<Entry<K>>,
    /// The most a key not listed was counted.
    pub bound: f64,
    /// All that was counted, listed or not.
    pub total: f64,
}

impl<K> Default for Summary<K> {
    fn default() -> Self {
        Summary {
            entries: Vec::new(),
            bound: 0.0,
            total: 0.0,
        }
    }
}

impl<K: Hash + Eq + Clone> Summary<K> {
    /// The summaries added up as one, keeping what `capacity` counters could: each key's count
    /// is the sum of its counts, a summary that does not list it adding its `bound` (to count
    /// and error alike). Past `capacity` keys, those whose count is at most total ÷ `capacity`
    /// are dropped (they cannot be above it), so the bound stays within total ÷ `capacity`, and the result within
    /// (summaries + 1) × `capacity` keys: the merged counts add up to at most that many times
    /// the total.
    pub fn merge<'a>(summaries: impl IntoIterator<Item = &'a Summary<K>>, capacity: usize) -> Self
    where
        K: 'a,
    {
        // Per key: its counts and errors, and the bounds of the summaries that list it; the
        // others each add their bound.
        let mut merged: HashMap<&K, [f64; 3], Hasher> = HashMap::with_hasher(Hasher::default());
        let (mut total, mut absent) = (0.0, 0.0);
        for summary in summaries {
            total += summary.total;
            absent += summary.bound;
            for entry in &summary.entries {
                let [count, error, listed_bounds] = merged.entry(&entry.key).or_default();
                *count += entry.count;
                *error += entry.error;
                *listed_bounds += summary.bound;
            }
        }
        // Within `capacity` keys, every key is kept.
        let threshold = match capacity {
            0 => f64::INFINITY,
            _ if merged.len() <= capacity => f64::NEG_INFINITY,
            _ => total / capacity as f64,
        };
        let mut bound = absent;
        let mut entries = Vec::with_capacity(merged.len());
        for (key, [count, error, listed_bounds]) in merged {
            let (count, error) = (
                count + absent - listed_bounds,
                error + absent - listed_bounds,
            );
            if count > threshold {
                entries.push(Entry {
                    key: key.clone(),
                    count,
                    error,
                });
            } else {
                bound = bound.max(count);
            }
        }
        sort_largest_first(&mut entries);
        Summary {
            entries,
            bound,
            total,
        }
    }

    #[cfg(test)]
    fn lists(&self, key: &K) -> bool {
        self.entries.iter().any(|entry| &entry.key == key)
    }

    /// The `n` largest counts, largest first.
    pub fn top(&self, n: usize) -> Vec<Entry<K>> {
        let mut entries = self.entries.clone();
        sort_largest_first(&mut entries);
        entries.truncate(n);
        entries
    }

    /// The same summary with its keys mapped (a replica's keys as they are sent).
    pub fn map_keys<J>(&self, mut key: impl FnMut(&K) -> J) -> Summary<J> {
        Summary {
            entries: (self.entries.iter())
                .map(|entry| Entry {
                    key: key(&entry.key),
                    count: entry.count,
                    error: entry.error,
                })
                .collect(),
            bound: self.bound,
            total: self.total,
        }
    }
}

fn sort_largest_first<K>(entries: &mut [Entry<K>]) {
    entries.sort_by(|a, b| b.count.total_cmp(&a.count));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The true counts of a stream of (key, weight).
    fn truth(stream: &[(u16, f64)]) -> HashMap<u16, f64> {
        let mut counts = HashMap::new();
        for &(key, weight) in stream {
            *counts.entry(key).or_insert(0.0) += weight;
        }
        counts
    }

    /// What SPEC promises of a summary of `stream` kept in `capacity` counters.
    fn assert_guarantee(summary: &Summary<u16>, stream: &[(u16, f64)], capacity: usize) {
        let counts = truth(stream);
        let total: f64 = counts.values().sum();
        let slack = 1e-6 * (1.0 + total);
        assert!((summary.total - total).abs() < slack);
        assert!(summary.bound <= total / capacity as f64 + slack);
        for entry in &summary.entries {
            let true_count = counts[&entry.key];
            assert!(
                entry.count + slack >= true_count,
                "{entry:?} under {true_count}"
            );
            assert!(entry.count - entry.error <= true_count + slack, "{entry:?}");
            assert!(entry.error <= total / capacity as f64 + slack, "{entry:?}");
        }
        for (key, count) in &counts {
            if *count > total / capacity as f64 + slack {
                assert!(summary.lists(key), "{key} ({count} of {total}) not listed");
            } else if !summary.lists(key) {
                assert!(*count <= summary.bound + slack);
            }
        }
    }

    #[test]
    fn fewer_keys_than_counters_are_counted_exactly() {
        let mut summary = SpaceSaving::new(10);
        for (key, times) in [("a", 5), ("b", 3), ("c", 1)] {
            for _ in 0..times {
                summary.add(&key, 1.0);
            }
        }
        let frozen = summary.freeze();
        let top = frozen.top(2);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].key, top[0].count, top[0].error), ("a", 5.0, 0.0));
        assert_eq!((top[1].key, top[1].count, top[1].error), ("b", 3.0, 0.0));
        assert_eq!(frozen.bound, 0.0);
        assert_eq!(frozen.total, 9.0);
    }

    #[test]
    fn a_new_key_takes_the_smallest_count_as_its_error() {
        let mut summary = SpaceSaving::new(2);
        summary.add(&"a", 4.0);
        summary.add(&"b", 1.0);
        summary.add(&"c", 2.0);
        let frozen = summary.freeze();
        assert_eq!(
            frozen.top(2),
            vec![
                Entry {
                    key: "a",
                    count: 4.0,
                    error: 0.0
                },
                Entry {
                    key: "c",
                    count: 3.0,
                    error: 1.0
                },
            ]
        );
        assert_eq!(frozen.bound, 3.0);
    }

    #[test]
    fn zero_negative_and_nan_weights_count_nothing() {
        let mut summary = SpaceSaving::new(2);
        for weight in [0.0, -1.0, f64::NAN] {
            summary.add(&"a", weight);
        }
        assert!(summary.is_empty());
        assert!(summary.freeze().entries.is_empty());
    }

    #[test]
    fn a_capacity_of_zero_tracks_nothing() {
        let mut summary = SpaceSaving::new(0);
        summary.add(&1u16, 1.0);
        assert!(summary.freeze().entries.is_empty());
    }

    #[test]
    fn merged_counts_of_small_summaries_are_exact_sums() {
        let mut a = SpaceSaving::new(10);
        let mut b = SpaceSaving::new(10);
        a.add(&"x", 3.0);
        b.add(&"x", 4.0);
        b.add(&"y", 1.0);
        let merged = Summary::merge([&a.freeze(), &b.freeze()], 10);
        assert_eq!(
            merged.top(5),
            vec![
                Entry {
                    key: "x",
                    count: 7.0,
                    error: 0.0
                },
                Entry {
                    key: "y",
                    count: 1.0,
                    error: 0.0
                },
            ]
        );
    }

    fn stream() -> impl Strategy<Value = Vec<(u16, f64)>> {
        // A few heavy keys among many light ones, weights whole or fractional.
        let key = prop_oneof![1 => 0u16..4, 3 => 0u16..400];
        let weight = prop_oneof![3 => Just(1.0), 1 => (1u8..20).prop_map(|w| f64::from(w) / 4.0)];
        proptest::collection::vec((key, weight), 0..1500)
    }

    proptest! {
        #[test]
        fn one_summary_keeps_the_guarantee(stream in stream(), capacity in 1usize..64) {
            let mut summary = SpaceSaving::new(capacity);
            for (key, weight) in &stream {
                summary.add(key, *weight);
            }
            assert_guarantee(&summary.freeze(), &stream, capacity);
        }

        #[test]
        fn merged_summaries_keep_the_guarantee(
            streams in proptest::collection::vec(stream(), 1..5),
            capacity in 1usize..64,
            regroup in any::<bool>(),
        ) {
            let summaries: Vec<Summary<u16>> = streams
                .iter()
                .map(|stream| {
                    let mut summary = SpaceSaving::new(capacity);
                    for (key, weight) in stream {
                        summary.add(key, *weight);
                    }
                    summary.freeze()
                })
                .collect();
            // Merged at once, or in two steps as a window merges merged slots.
            let merged = if regroup && summaries.len() > 1 {
                let (first, rest) = summaries.split_at(summaries.len() / 2);
                let first = Summary::merge(first, capacity);
                let rest = Summary::merge(rest, capacity);
                Summary::merge([&first, &rest], capacity)
            } else {
                Summary::merge(&summaries, capacity)
            };
            assert!(merged.entries.len() <= (streams.len() + 1) * capacity);
            assert_guarantee(&merged, &streams.concat(), capacity);
        }
    }
}
