//! A consistency walk over the buffer for tests and fuzzing (cfg `fuzzing` or `bfkv_internals`): every
//! byte between head and tail belongs to exactly one well-formed block.

use super::ring::header;
use super::BufferPool;
use crate::sync::Ordering;

/// What the walk found, by header state (bytes, headers included).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Audit {
    /// Blocks held by tokens or mapped (allocating, ready, detached).
    pub(crate) live_bytes: u64,
    /// Blocks on free lists.
    pub(crate) free_bytes: u64,
    /// Tombstones and fillers.
    pub(crate) dead_bytes: u64,
    /// Blocks walked.
    pub(crate) blocks: u64,
}

impl BufferPool {
    /// Walks head..tail; panics (this is test support) on a gap, overlap, bad header or a
    /// block straddling the physical end. Only meaningful while no thread uses the pool.
    pub(crate) fn audit(&self) -> Audit {
        let size = self.ring.size();
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        assert!(
            head <= tail && tail - head <= size,
            "head {head} tail {tail} size {size}"
        );
        let mut a = Audit::default();
        let mut at = head;
        while at < tail {
            let phys = at % size;
            let h = self.ring.header(phys).load(Ordering::Acquire);
            let total = header::total(h);
            assert!(
                total >= 8 && phys + total <= size,
                "bad block at {at}: {h:#x}"
            );
            assert!(at + total <= tail, "block at {at} runs past the tail");
            match header::state(h) {
                header::ALLOCATING | header::READY | header::DETACHED => a.live_bytes += total,
                header::FREE => a.free_bytes += total,
                header::TOMBSTONE => a.dead_bytes += total,
                s => panic!("block at {at} has state {s}"),
            }
            a.blocks += 1;
            at += total;
        }
        assert_eq!(at, tail);
        a
    }
}
