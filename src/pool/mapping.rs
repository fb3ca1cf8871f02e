//! The mapping table: `PageId` -> one lock-and-location word (paper §3.3) and the page's
//! version, which optimistic readers check (`optimistic.rs`).
//!
//! A segmented array: segment `k` holds `FIRST_SEGMENT << k` entries and is allocated on
//! first use, so the table grows without moving (or stopping) anyone holding an entry.
//! Removed ids go on a free list and are handed out again before new ones.

use std::sync::OnceLock;

use super::PageId;
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering};

/// Words in segment 0; segment `k` holds `FIRST_SEGMENT << k`.
const FIRST_SEGMENT: u64 = 1024;
/// Enough segments for every `u32` id: ids below `FIRST_SEGMENT * (2^23 - 1)`.
const SEGMENTS: usize = 23;

/// One page's entry. Both words share a cache line (16-byte alignment), so a reader that
/// checks the version finds the location next to it.
#[repr(C, align(16))]
pub(super) struct Entry {
    /// Location and lock (`latch.rs`).
    pub(super) word: AtomicU64,
    /// Odd while a writer holds the page, bumped again when it lets go (`optimistic.rs`).
    pub(super) version: AtomicU64,
}

impl Entry {
    fn vacant() -> Entry {
        Entry {
            word: AtomicU64::new(0),
            version: AtomicU64::new(0),
        }
    }
}

/// The table. Every word starts vacant (zero: no location, unlocked), every version at 0.
pub(super) struct MappingTable {
    /// Lazily allocated segments. `OnceLock` initialization runs no shuttle operation (it only
    /// allocates), so it is atomic from the model checker's point of view.
    segments: [OnceLock<Box<[Entry]>>; SEGMENTS],
    /// Ids `>= next_id` have never been handed out.
    next_id: AtomicU32,
    /// Removed ids, reused before new ones (not on the read path: only inserts and removals).
    free_ids: Mutex<Vec<PageId>>,
    /// Ids handed out and not given back.
    in_use: AtomicUsize,
    /// Tests: `take_id` answers as if all 2^32 ids were taken (really taking them would need
    /// 32 GiB of table).
    #[cfg(test)]
    exhausted: std::sync::atomic::AtomicBool,
}

impl MappingTable {
    /// An empty table.
    pub(super) fn new() -> MappingTable {
        MappingTable {
            segments: std::array::from_fn(|_| OnceLock::new()),
            next_id: AtomicU32::new(0),
            free_ids: Mutex::new(Vec::new()),
            in_use: AtomicUsize::new(0),
            #[cfg(test)]
            exhausted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Tests: from now on, `take_id` finds every id taken.
    #[cfg(test)]
    pub(super) fn exhaust(&self) {
        self.exhausted.store(true, Ordering::Relaxed);
    }

    /// The entry of `pid`, allocating its segment if nobody has yet.
    pub(super) fn entry(&self, pid: PageId) -> &Entry {
        let n = u64::from(pid) / FIRST_SEGMENT + 1;
        let k = n.ilog2() as usize;
        let offset = (u64::from(pid) - FIRST_SEGMENT * ((1 << k) - 1)) as usize;
        let segment = self.segments[k]
            .get_or_init(|| (0..FIRST_SEGMENT << k).map(|_| Entry::vacant()).collect());
        &segment[offset]
    }

    /// The lock-and-location word of `pid`.
    pub(super) fn word(&self, pid: PageId) -> &AtomicU64 {
        &self.entry(pid).word
    }

    /// An id for a new entry: a removed one if any, else a fresh one. `None` when all 2^32
    /// ids are in use.
    pub(super) fn take_id(&self) -> Option<PageId> {
        #[cfg(test)]
        if self.exhausted.load(Ordering::Relaxed) {
            return None;
        }
        let pid = self.free_ids.lock().pop().or_else(|| self.fresh_id())?;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Some(pid)
    }

    /// An id never handed out, if any is left.
    fn fresh_id(&self) -> Option<PageId> {
        let mut cur = self.next_id.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(1)?;
            match self.next_id.compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(cur),
                Err(now) => cur = now,
            }
        }
    }

    /// Makes `pid` available again (its word is already vacant).
    pub(super) fn give_back(&self, pid: PageId) {
        self.free_ids.lock().push(pid);
        self.in_use.fetch_sub(1, Ordering::Relaxed);
    }

    /// Ids handed out and not given back (a relaxed count: exact once the table is quiet).
    pub(super) fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// One past the largest id ever handed out.
    pub(super) fn id_limit(&self) -> u32 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// For a table being rebuilt: ids below `limit` are taken, except `free` ones.
    pub(super) fn set_ids(&self, limit: u32, mut free: Vec<PageId>) {
        // Reused in ascending order: lower ids keep the table dense.
        free.sort_unstable_by(|a, b| b.cmp(a));
        self.next_id.store(limit, Ordering::Relaxed);
        let in_use = (limit as usize).saturating_sub(free.len());
        self.in_use.store(in_use, Ordering::Relaxed);
        *self.free_ids.lock() = free;
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_every_id_once() {
        let t = MappingTable::new();
        let mut seen = std::collections::HashSet::new();
        for pid in 0..5000 {
            let w = std::ptr::from_ref::<AtomicU64>(t.word(pid)) as usize;
            assert!(seen.insert(w), "two ids share a word: {pid}");
        }
        // The last id lands in the last segment, inside it.
        let n = u64::from(u32::MAX) / FIRST_SEGMENT + 1;
        let k = n.ilog2() as usize;
        assert!(k < SEGMENTS);
        assert!(u64::from(u32::MAX) - FIRST_SEGMENT * ((1 << k) - 1) < FIRST_SEGMENT << k);
    }

    #[test]
    fn ids_are_reused() {
        let t = MappingTable::new();
        assert_eq!(t.take_id(), Some(0));
        assert_eq!(t.take_id(), Some(1));
        t.give_back(0);
        assert_eq!(t.in_use(), 1);
        assert_eq!(t.take_id(), Some(0));
        assert_eq!(t.take_id(), Some(2));
        assert_eq!(t.in_use(), 3);
        t.set_ids(10, vec![7, 3]);
        assert_eq!(t.in_use(), 8);
        assert_eq!(t.take_id(), Some(3));
        assert_eq!(t.take_id(), Some(7));
        assert_eq!(t.in_use(), 10);
        assert_eq!(t.take_id(), Some(10));
        assert_eq!(t.id_limit(), 11);
    }
}
