//! Header maps kept for reuse, per thread. The own HTTP/1.1 paths build a map for every
//! request head and every upstream response head; a new map costs two allocations (its index
//! and its entries) and dropping it two frees, while a cleared map keeps both.

use std::cell::RefCell;

use http::HeaderMap;

/// Spare maps kept per thread at most: enough for the requests one thread has in flight.
const SPARE_MAPS: usize = 256;
/// Maps that grew beyond this many fields are freed, not kept: a rare huge head would
/// otherwise pin its memory for good. (Repeated values of one name are bounded apart: the own
/// paths parse at most 100 request and 128 response fields.)
const KEEP_CAPACITY_AT_MOST: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `fields`, a spare one when this thread has one.
pub(crate) fn take(fields: usize) -> HeaderMap {
    match SPARE.with_borrow_mut(Vec::pop) {
        Some(mut spare) => {
            // An empty map grows without moving entries; a full one would move them all.
            spare.reserve(fields);
            spare
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Clears `map` and keeps it for [`take`], unless it is too big or the spares are many.
pub(crate) fn give_back(mut map: HeaderMap) {
    let capacity = map.capacity();
    if capacity == 0 || capacity > KEEP_CAPACITY_AT_MOST {
        return;
    }
    map.clear();
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_MAPS {
            spare.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderValue, HOST};

    #[test]
    fn a_map_given_back_comes_back_empty_with_its_room() {
        let mut map = take(4);
        map.insert(HOST, HeaderValue::from_static("a"));
        map.append("x-b", HeaderValue::from_static("b"));
        let capacity = map.capacity();
        give_back(map);
        assert_eq!(SPARE.with_borrow(Vec::len), 1);
        let again = take(1);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), capacity, "the spare map, not a new one");
        assert_eq!(SPARE.with_borrow(Vec::len), 0);
    }

    #[test]
    fn huge_and_empty_maps_are_not_kept() {
        let mut huge = HeaderMap::with_capacity(KEEP_CAPACITY_AT_MOST * 2);
        huge.insert(HOST, HeaderValue::from_static("a"));
        give_back(huge);
        give_back(HeaderMap::new());
        assert!(take(0).capacity() <= KEEP_CAPACITY_AT_MOST);
        assert_eq!(SPARE.with_borrow(Vec::len), 0);
    }
}
