//! Top keys (`[top]`): whom each limit refuses and charges most, over the last 1, 5 and 15
//! minutes, in bounded memory; and each route's requests by outcome over the same windows.
//!
//! A request's shares are counted into the space-saving tables of the thread that decided it
//! (one uncontended lock per request, no allocation once a key is tracked). Every ten seconds
//! the threads' tables are closed into each limit's history; `/top` merges the history's
//! slots of a window with what the threads are counting now.

pub mod fleet;
pub mod routes;
pub mod summary;
pub mod windows;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::limit::{push_parts, KeyParts};
use crate::thread_slots::{thread_slot, thread_slots};
use fleet::{LimitView, ReplicaView, SentSummary};
use summary::{SpaceSaving, Summary};
use windows::{History, Window};

/// What a top list ranks keys by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Refusals by the limit.
    Refused = 0,
    /// Tokens charged to the limit's buckets.
    Charged = 1,
}

impl By {
    pub const ALL: [By; 2] = [By::Refused, By::Charged];

    pub fn parse(text: &str) -> Option<By> {
        By::ALL.into_iter().find(|by| by.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            By::Refused => "refused",
            By::Charged => "charged",
        }
    }
}

/// A limit's place in the tables, given when its metrics are resolved (the same for its
/// name across reloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopId(u32);

/// One bucket's share of a decision, as top keys count it.
#[derive(Debug, Clone, Copy)]
pub struct Share<'a> {
    pub id: TopId,
    pub key: &'a KeyParts,
    pub charged: f64,
    pub refused: bool,
}

/// Each limit's live tables in one thread slot: refused, charged.
type Tables = Vec<Option<[SpaceSaving<KeyParts>; 2]>>;

#[repr(align(64))]
struct ThreadTables(Mutex<Tables>);

/// The process's top keys: per limit, per thing counted, what each thread counts now and the
/// closed slots of the last 15 minutes.
pub struct TopKeys {
    /// Names this process among the fleet's replicas.
    replica: String,
    /// `[top] keys_per_limit`: the counters of each table (0: nothing is counted).
    capacity: AtomicUsize,
    /// Limit names by id.
    names: RwLock<Vec<Arc<str>>>,
    threads: Box<[ThreadTables]>,
    histories: Mutex<Vec<[History<KeyParts>; 2]>>,
}

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeys")
            .field("capacity", &self.capacity())
            .field("limits", &self.names.read().len())
            .finish_non_exhaustive()
    }
}

impl TopKeys {
    pub fn new(capacity: usize) -> Self {
        use std::hash::BuildHasher as _;
        let random = foldhash::fast::RandomState::default().hash_one(std::process::id());
        TopKeys {
            replica: format!("{}-{random:016x}", std::process::id()),
            capacity: AtomicUsize::new(capacity),
            names: RwLock::new(Vec::new()),
            threads: (0..thread_slots())
                .map(|_| ThreadTables(Mutex::new(Vec::new())))
                .collect(),
            histories: Mutex::new(Vec::new()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// `keys_per_limit` as a reload sets it; tables already counting keep their size until
    /// their slot closes.
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity, Ordering::Relaxed);
    }

    /// The id of the limit `name`, or `None` while top keys are off.
    pub fn id(&self, name: &Arc<str>) -> Option<TopId> {
        if self.capacity() == 0 {
            return None;
        }
        let found = |names: &[Arc<str>]| names.iter().position(|known| known == name);
        if let Some(index) = found(&self.names.read()) {
            return Some(TopId(index as u32));
        }
        let mut names = self.names.write();
        let index = found(&names).unwrap_or_else(|| {
            names.push(name.clone());
            names.len() - 1
        });
        Some(TopId(index as u32))
    }

    fn id_of(&self, name: &str) -> Option<usize> {
        self.names.read().iter().position(|known| &**known == name)
    }

    /// Counts a request's shares in the calling thread's tables.
    pub fn record(&self, shares: &[Share<'_>]) {
        let capacity = self.capacity();
        if shares.is_empty() || capacity == 0 {
            return;
        }
        let mut tables = self.threads[thread_slot()].0.lock();
        for share in shares {
            let index = share.id.0 as usize;
            if tables.len() <= index {
                tables.resize_with(index + 1, || None);
            }
            let [refused, charged] = tables[index]
                .get_or_insert_with(|| [SpaceSaving::new(capacity), SpaceSaving::new(capacity)]);
            if share.refused {
                refused.add(share.key, 1.0);
            }
            if share.charged > 0.0 {
                charged.add(share.key, share.charged);
            }
        }
    }

    /// Closes the ten-second slot: what every thread counted goes into each limit's history.
    pub fn close_slot(&self) {
        let capacity = self.capacity();
        let limits = self.names.read().len();
        let mut closed: Vec<[Vec<Summary<KeyParts>>; 2]> =
            (0..limits).map(|_| Default::default()).collect();
        for thread in self.threads.iter() {
            let mut tables = thread.0.lock();
            for (index, table) in tables.iter_mut().enumerate() {
                if let Some(table) = table.as_mut().filter(|_| index < limits) {
                    for by in By::ALL {
                        if !table[by as usize].is_empty() {
                            closed[index][by as usize].push(table[by as usize].take());
                        }
                    }
                }
            }
        }
        let mut histories = self.histories.lock();
        histories.resize_with(limits, || [History::new(capacity), History::new(capacity)]);
        for (history, slots) in histories.iter_mut().zip(closed) {
            for by in By::ALL {
                let slot = Summary::merge(&slots[by as usize], capacity);
                history[by as usize].close(slot, capacity);
            }
        }
    }

    /// The limit's summary of `by` over `window`; `None` for a limit never counted.
    pub fn window(&self, limit: &str, by: By, window: Window) -> Option<Summary<KeyParts>> {
        let capacity = self.capacity();
        let index = self.id_of(limit)?;
        let mut current = Vec::new();
        for thread in self.threads.iter() {
            if let Some(Some(table)) = thread.0.lock().get(index) {
                current.push(table[by as usize].freeze());
            }
        }
        let current = Summary::merge(&current, capacity);
        let histories = self.histories.lock();
        Some(match histories.get(index) {
            Some(history) => history[by as usize].window(window, &current),
            None => current,
        })
    }

    /// [`TopKeys::window`] with keys as the access log spells them.
    pub fn spelled(&self, limit: &str, by: By, window: Window) -> Option<Summary<String>> {
        Some(self.window(limit, by, window)?.map_keys(spell))
    }

    /// What this replica sends the fleet: every window of `limits` that counted anything.
    pub fn view(&self, limits: &[Arc<str>]) -> ReplicaView {
        let mut view = ReplicaView {
            replica: self.replica.clone(),
            limits: Vec::new(),
        };
        for limit in limits {
            for by in By::ALL {
                let windows: Vec<SentSummary> = (Window::ALL.into_iter())
                    .filter_map(|window| self.spelled(limit, by, window))
                    .map(|summary| SentSummary::from(&summary))
                    .collect();
                if windows.iter().any(|window| window.total > 0.0) {
                    view.limits.push(LimitView {
                        limit: limit.to_string(),
                        by: by.as_str().to_owned(),
                        windows,
                    });
                }
            }
        }
        view
    }
}

/// A key as the access log spells it.
pub fn spell(parts: &KeyParts) -> String {
    let mut text = String::new();
    push_parts(parts, &mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::KeyPart;

    fn key(octet: u8) -> KeyParts {
        let network = format!("10.0.{octet}.0/24").parse().unwrap();
        KeyParts::from_iter([KeyPart::Network(network)])
    }

    #[test]
    fn shares_counted_now_and_in_closed_slots_add_up_in_a_window() {
        let top = TopKeys::new(100);
        let limit: Arc<str> = "per_network".into();
        let id = top.id(&limit).unwrap();
        assert_eq!(top.id(&limit), Some(id), "one id per name");
        let (heavy, light) = (key(1), key(2));
        let share = |key, charged, refused| Share {
            id,
            key,
            charged,
            refused,
        };
        for _ in 0..5 {
            top.record(&[share(&heavy, 0.0, true), share(&light, 2.0, false)]);
        }
        top.close_slot();
        top.record(&[share(&heavy, 0.0, true)]);
        let refused = top
            .window("per_network", By::Refused, Window::OneMinute)
            .unwrap();
        assert_eq!(refused.top(5).len(), 1);
        assert_eq!((refused.top(5)[0].count, refused.total), (6.0, 6.0));
        let charged = top
            .window("per_network", By::Charged, Window::FifteenMinutes)
            .unwrap();
        assert_eq!(charged.top(5)[0].key, light);
        assert_eq!(charged.top(5)[0].count, 10.0);
        assert!(top
            .window("other", By::Refused, Window::OneMinute)
            .is_none());
    }

    #[test]
    fn a_capacity_of_zero_gives_no_ids_and_counts_nothing() {
        let top = TopKeys::new(0);
        assert_eq!(top.id(&Arc::from("per_network")), None);
    }
}
