//! Slots per thread: each thread that records gets an index of its own, in the order threads
//! first ask, until the owned ones run out; later threads share the last one. Metrics keep a
//! copy of each series per slot (`metrics/per_thread.rs`), top keys a table per slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How many threads get a slot of their own; the slot after them is shared by the rest.
pub(crate) fn owned_slots() -> usize {
    static OWNED: OnceLock<usize> = OnceLock::new();
    *OWNED.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(4, usize::from)
            .clamp(1, 16)
            // The runtime's workers, plus the main thread and a few others that record.
            + 4
    })
}

/// The calling thread's slot: its own one, given out in the order threads first record, or
/// the shared one once every owned slot is taken. A slot is never given to a second thread.
pub(crate) fn slot() -> Slot {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Slot = {
            let (index, owned) = (NEXT.fetch_add(1, Ordering::Relaxed), owned_slots());
            if index < owned {
                Slot::Owned(index)
            } else {
                Slot::Shared(owned)
            }
        };
    }
    // A `Copy` value without a destructor: readable even while the thread's locals are torn
    // down (a request dropped as its thread exits).
    SLOT.with(|slot| *slot)
}

/// The calling thread's slot as an index below [`thread_slots`]: what else is kept per thread
/// (top keys' tables) is kept by the same slots.
pub(crate) fn thread_slot() -> usize {
    match slot() {
        Slot::Owned(index) | Slot::Shared(index) => index,
    }
}

/// How many slots [`thread_slot`] gives out: the owned ones and the shared one after them.
pub(crate) fn thread_slots() -> usize {
    owned_slots() + 1
}

#[derive(Clone, Copy)]
pub(crate) enum Slot {
    Owned(usize),
    Shared(usize),
}
