//! The buffers a range iterator copies leaves into, kept per thread between iterators.
//!
//! Why: a scan's buffers grow to a leaf or two (the copied records, the copy of a leaf read
//! without its lock, its bounds), and an iterator made for a short scan allocated and
//! zeroed them all again: in YCSB-E in memory (scans of 1-100 records), `malloc`, `free`
//! and `memset` took 7 % of the time. A dropped iterator leaves its buffers here, emptied,
//! and the next one made on the thread takes them.

use std::cell::Cell;

use super::copied::Copied;

/// Buffers larger than this (one scan met a huge leaf or bound) are freed, not kept.
const KEEP_AT_MOST: usize = 256 << 10;

/// Key buffers kept: what one iterator holds (its two bounds, where each end goes on, a
/// spare, the last key yielded from each end).
const KEEP_KEYS: usize = 8;

/// What one range iterator copies into.
#[derive(Default)]
pub(in crate::tree) struct ScanBuffers {
    /// Records copied for the front and for the back.
    pub(in crate::tree) front: Copied,
    pub(in crate::tree) back: Copied,
    /// A leaf's bytes as a refill without the leaf's lock copied them (`optimistic.rs`).
    pub(in crate::tree) snapshot: Vec<u8>,
    /// Buffers for keys: bounds, and the last keys yielded.
    pub(in crate::tree) keys: Vec<Vec<u8>>,
}

thread_local! {
    /// The buffers the last iterator dropped on this thread left.
    static KEPT: Cell<Option<ScanBuffers>> = const { Cell::new(None) };
}

impl ScanBuffers {
    /// The buffers kept on this thread, else new ones.
    pub(in crate::tree) fn take() -> ScanBuffers {
        KEPT.try_with(Cell::take).ok().flatten().unwrap_or_default()
    }

    /// Empties `buffers` and keeps them for the next iterator on this thread, unless one
    /// is kept already or they grew too large.
    pub(in crate::tree) fn give_back(mut buffers: ScanBuffers) {
        let b = &mut buffers;
        let keys: usize = b.keys.iter().map(Vec::capacity).sum();
        if b.front.capacity() + b.back.capacity() + b.snapshot.capacity() + keys > KEEP_AT_MOST {
            return;
        }
        b.front.clear();
        b.back.clear();
        b.keys.truncate(KEEP_KEYS);
        b.keys.iter_mut().for_each(Vec::clear);
        // During thread exit the slot may be gone: then the buffers are just freed.
        let _ = KEPT.try_with(|kept| {
            let held = kept.take();
            kept.set(Some(held.unwrap_or(buffers)));
        });
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_emptied_and_only_one_set_is_kept() {
        let mut b = ScanBuffers::take();
        b.front.push(b"k", b"v");
        b.keys.push(b"bound".to_vec());
        b.snapshot.resize(4096, 7);
        let snapshot = b.snapshot.as_ptr();
        ScanBuffers::give_back(b);
        let mut again = ScanBuffers::take();
        assert_eq!(again.snapshot.as_ptr(), snapshot, "not reused");
        assert!(again.front.is_empty() && again.keys[0].is_empty());
        assert_eq!(again.front.pop_front(), None);
        // A second set while one is kept: the kept one stays.
        let mut other = ScanBuffers::take();
        other.snapshot.resize(64, 0);
        assert_ne!(other.snapshot.as_ptr(), snapshot);
        again.keys.resize(KEEP_KEYS + 3, b"x".to_vec());
        ScanBuffers::give_back(again);
        ScanBuffers::give_back(other);
        let kept = ScanBuffers::take();
        assert_eq!(kept.snapshot.as_ptr(), snapshot);
        assert_eq!(
            kept.keys.len(),
            KEEP_KEYS,
            "no more key buffers than one scan holds"
        );
        assert!(kept.keys.iter().all(Vec::is_empty));
    }

    #[test]
    fn oversized_buffers_are_freed() {
        let mut b = ScanBuffers::take();
        b.snapshot.reserve(KEEP_AT_MOST + 1);
        ScanBuffers::give_back(b);
        assert!(ScanBuffers::take().snapshot.capacity() <= KEEP_AT_MOST);
    }
}
