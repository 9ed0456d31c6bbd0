//! Sliding windows of 1, 5 and 15 minutes over summaries closed every ten seconds (pure).
//!
//! The last ten-second slots answer the minute; every six of them are merged into a minute
//! slot, and the last minutes answer the longer windows. The slot still being counted is added
//! by whoever asks, so a window spans its length less up to ten seconds.

use std::collections::VecDeque;
use std::hash::Hash;

use super::summary::Summary;

/// How often the slot being counted is closed.
pub const SLOT_SECONDS: u64 = 10;

const SLOTS_PER_MINUTE: usize = 6;

/// The windows `/top` answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    OneMinute,
    FiveMinutes,
    FifteenMinutes,
}

impl Window {
    pub const ALL: [Window; 3] = [
        Window::OneMinute,
        Window::FiveMinutes,
        Window::FifteenMinutes,
    ];

    pub fn parse(text: &str) -> Option<Window> {
        Window::ALL
            .into_iter()
            .find(|window| window.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Window::OneMinute => "1m",
            Window::FiveMinutes => "5m",
            Window::FifteenMinutes => "15m",
        }
    }

    pub fn seconds(self) -> u64 {
        self.minutes() as u64 * 60
    }

    fn minutes(self) -> usize {
        match self {
            Window::OneMinute => 1,
            Window::FiveMinutes => 5,
            Window::FifteenMinutes => 15,
        }
    }
}

/// One limit's closed slots, for one thing counted (refusals or tokens charged).
#[derive(Debug)]
pub struct History<K> {
    capacity: usize,
    /// The last closed ten-second slots, newest last.
    tens: VecDeque<Summary<K>>,
    /// Of those, how many closed since the last minute slot was made.
    tens_this_minute: usize,
    /// The last closed minutes, newest last.
    minutes: VecDeque<Summary<K>>,
}

impl<K: Hash + Eq + Clone> History<K> {
    pub fn new(capacity: usize) -> Self {
        History {
            capacity,
            tens: VecDeque::new(),
            tens_this_minute: 0,
            minutes: VecDeque::new(),
        }
    }

    /// Closes a ten-second slot with what was counted in it; every sixth closes a minute.
    pub fn close(&mut self, slot: Summary<K>, capacity: usize) {
        self.capacity = capacity;
        if self.tens.len() == SLOTS_PER_MINUTE {
            self.tens.pop_front();
        }
        self.tens.push_back(slot);
        self.tens_this_minute += 1;
        if self.tens_this_minute == SLOTS_PER_MINUTE {
            let minute = Summary::merge(&self.tens, capacity);
            if self.minutes.len() == Window::FifteenMinutes.minutes() {
                self.minutes.pop_front();
            }
            self.minutes.push_back(minute);
            self.tens_this_minute = 0;
        }
    }

    /// Nothing counted in any window.
    pub fn is_empty(&self) -> bool {
        self.tens
            .iter()
            .chain(&self.minutes)
            .all(|s| s.total == 0.0)
    }

    /// The window's summary: its closed slots and `current`, the slot being counted.
    pub fn window(&self, window: Window, current: &Summary<K>) -> Summary<K> {
        let closed: Vec<&Summary<K>> = match window {
            Window::OneMinute => {
                let skip = self.tens.len().saturating_sub(SLOTS_PER_MINUTE - 1);
                self.tens.iter().skip(skip).collect()
            }
            _ => {
                let tens = self
                    .tens
                    .iter()
                    .skip(self.tens.len() - self.tens_this_minute);
                let minutes = window.minutes() - 1;
                let skip = self.minutes.len().saturating_sub(minutes);
                self.minutes.iter().skip(skip).chain(tens).collect()
            }
        };
        Summary::merge(closed.into_iter().chain([current]), self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::summary::SpaceSaving;

    /// A slot in which `key` was counted `count` times.
    fn slot(key: u32, count: f64) -> Summary<u32> {
        let mut summary = SpaceSaving::new(8);
        summary.add(&key, count);
        summary.freeze()
    }

    fn count_of(summary: &Summary<u32>, key: u32) -> f64 {
        summary
            .entries
            .iter()
            .find(|entry| entry.key == key)
            .map_or(0.0, |entry| entry.count)
    }

    #[test]
    fn windows_are_parsed_and_named_as_the_api_spells_them() {
        for window in Window::ALL {
            assert_eq!(Window::parse(window.as_str()), Some(window));
        }
        assert_eq!(Window::FiveMinutes.seconds(), 300);
        assert_eq!(Window::parse("1h"), None);
    }

    #[test]
    fn each_window_holds_the_slots_of_its_length_and_no_older() {
        let mut history = History::new(200);
        // Slot i (ten seconds each) counts key i once; 20 minutes of them.
        for i in 0..120 {
            history.close(slot(i, 1.0), 200);
        }
        let current = slot(1000, 1.0);
        let minute = history.window(Window::OneMinute, &current);
        assert_eq!(minute.total, 6.0, "five closed slots and the current one");
        assert_eq!(count_of(&minute, 119), 1.0);
        assert_eq!(count_of(&minute, 114), 0.0);
        let five = history.window(Window::FiveMinutes, &current);
        assert_eq!(five.total, 4.0 * 6.0 + 1.0);
        let fifteen = history.window(Window::FifteenMinutes, &current);
        assert_eq!(fifteen.total, 14.0 * 6.0 + 1.0);
        assert_eq!(count_of(&fifteen, 119), 1.0);
        assert_eq!(count_of(&fifteen, 119 - 14 * 6), 0.0);
    }

    #[test]
    fn a_minute_being_filled_counts_in_the_long_windows_before_it_closes() {
        let mut history = History::new(8);
        for i in 0..9 {
            history.close(slot(i % 2, 2.0), 8);
        }
        let current = Summary::default();
        let five = history.window(Window::FiveMinutes, &current);
        assert_eq!(five.total, 18.0);
        assert_eq!(count_of(&five, 0), 10.0);
        assert_eq!(count_of(&five, 1), 8.0);
        assert!(!history.is_empty());
    }
}
