//! Each route's requests by outcome over a window (`/top/routes`): the differences of
//! `tollgate_requests_total` since a snapshot taken every ten seconds. Nothing is counted on
//! the request path for it.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::Mutex;

use super::windows::{Window, SLOT_SECONDS};

/// Requests by route, then by outcome.
pub type RouteCounts = BTreeMap<String, BTreeMap<String, u64>>;

/// The snapshots of the last 15 minutes, oldest first; the first is the empty one of the
/// process's start until it ages out.
#[derive(Debug)]
pub struct RouteHistory {
    snapshots: Mutex<VecDeque<RouteCounts>>,
}

impl Default for RouteHistory {
    fn default() -> Self {
        RouteHistory {
            snapshots: Mutex::new(VecDeque::from([RouteCounts::new()])),
        }
    }
}

impl RouteHistory {
    /// Keeps `now`, the counters as they are, as the latest snapshot.
    pub fn close_slot(&self, now: RouteCounts) {
        let kept = (Window::FifteenMinutes.seconds() / SLOT_SECONDS) as usize + 1;
        let mut snapshots = self.snapshots.lock();
        if snapshots.len() == kept {
            snapshots.pop_front();
        }
        snapshots.push_back(now);
    }

    /// What the counters `now` added within `window`: since the snapshot that long ago, or the
    /// oldest kept.
    pub fn window(&self, window: Window, now: &RouteCounts) -> RouteCounts {
        let back = (window.seconds() / SLOT_SECONDS) as usize;
        let snapshots = self.snapshots.lock();
        let base = &snapshots[snapshots.len().saturating_sub(back)];
        let mut counts = RouteCounts::new();
        for (route, outcomes) in now {
            let route_counts = counts.entry(route.clone()).or_default();
            for (outcome, value) in outcomes {
                let before = base.get(route).and_then(|b| b.get(outcome)).copied();
                route_counts.insert(outcome.clone(), value.saturating_sub(before.unwrap_or(0)));
            }
        }
        counts
    }
}

impl RouteHistory {
    /// Each route's requests by outcome in every ten-second slot of the last 15 minutes,
    /// oldest first, the slot being counted (up to `now`) last: what a chart draws.
    pub fn series(&self, now: &RouteCounts) -> BTreeMap<String, BTreeMap<String, Vec<u64>>> {
        let snapshots = self.snapshots.lock();
        let points: Vec<&RouteCounts> = snapshots.iter().chain([now]).collect();
        let mut series: BTreeMap<String, BTreeMap<String, Vec<u64>>> = BTreeMap::new();
        for (route, outcomes) in now {
            for outcome in outcomes.keys() {
                let value = |counts: &RouteCounts| {
                    (counts.get(route).and_then(|o| o.get(outcome)).copied()).unwrap_or(0)
                };
                let slots = (points.windows(2))
                    .map(|pair| value(pair[1]).saturating_sub(value(pair[0])))
                    .collect();
                series
                    .entry(route.clone())
                    .or_default()
                    .insert(outcome.clone(), slots);
            }
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(allowed: u64, limited: u64) -> RouteCounts {
        let outcomes = [("allowed", allowed), ("limited", limited)];
        let outcomes = outcomes.map(|(outcome, n)| (outcome.to_string(), n));
        RouteCounts::from([("login".to_string(), outcomes.into_iter().collect())])
    }

    #[test]
    fn a_window_counts_what_came_since_the_snapshot_that_long_ago() {
        let history = RouteHistory::default();
        // One snapshot every ten seconds: 10 more allowed and 1 more limited each time.
        for slot in 1..=12 {
            history.close_slot(counts(10 * slot, slot));
        }
        let now = counts(125, 13);
        // Since the sixth snapshot back: 50 to 60 s, as the top keys' windows span.
        let minute = history.window(Window::OneMinute, &now);
        assert_eq!(minute["login"]["allowed"], 125 - 70);
        assert_eq!(minute["login"]["limited"], 13 - 7);
        // A process younger than the window counts since its start.
        let fifteen = history.window(Window::FifteenMinutes, &now);
        assert_eq!(fifteen["login"]["allowed"], 125);
    }

    #[test]
    fn the_series_has_each_slots_requests_and_the_one_being_counted() {
        let history = RouteHistory::default();
        history.close_slot(counts(10, 1));
        history.close_slot(counts(15, 1));
        let series = history.series(&counts(18, 3));
        assert_eq!(series["login"]["allowed"], [10, 5, 3]);
        assert_eq!(series["login"]["limited"], [1, 0, 2]);
    }

    #[test]
    fn only_fifteen_minutes_of_snapshots_are_kept() {
        let history = RouteHistory::default();
        for slot in 1..=200 {
            history.close_slot(counts(slot, 0));
        }
        assert_eq!(history.snapshots.lock().len(), 91);
        let fifteen = history.window(Window::FifteenMinutes, &counts(200, 0));
        assert_eq!(fifteen["login"]["allowed"], 200 - 111);
    }
}
