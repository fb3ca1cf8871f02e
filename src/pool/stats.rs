//! Pool counters. The allocation-path ones are striped per thread (one cache line each) so
//! two threads allocating do not bounce a shared line; `stats()` sums the stripes.

use super::free_list::SHARDS;
use crate::sync::{AtomicU64, Ordering};

/// A snapshot of the pool's counters (each read atomically, not all at one instant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolStats {
    /// Bytes (headers included) of blocks handed out and not yet returned or evicted.
    pub(crate) bytes_in_use: u64,
    /// Bytes between head and tail: live blocks, free-listed blocks and tombstones.
    pub(crate) ring_bytes: u64,
    /// Allocations served from a free list.
    pub(crate) allocs_free_list: u64,
    /// Allocations served by advancing the tail.
    pub(crate) allocs_tail: u64,
    /// Live blocks evicted (written out by the callback and detached).
    pub(crate) evictions: u64,
    /// Tombstones (including fillers) the head passed.
    pub(crate) tombstones_passed: u64,
    /// Free-listed blocks the evictor took off their list for the head to pass.
    pub(crate) free_listed_passed: u64,
    /// Blocks returned inside the copy-on-access region (left as tombstones).
    pub(crate) copy_on_access_frees: u64,
    /// Blocks currently on free lists.
    pub(crate) free_listed: u64,
}

/// One thread's share of the allocation-path counters.
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Stripe {
    /// Bytes handed out by `alloc`.
    pub(super) allocated: AtomicU64,
    /// Bytes given back (dealloc, dropped tokens, evicted blocks).
    pub(super) released: AtomicU64,
    /// Allocations from a free list.
    pub(super) from_free_list: AtomicU64,
    /// Allocations from the tail.
    pub(super) from_tail: AtomicU64,
    /// Frees that became tombstones because the block was near the head.
    pub(super) copy_on_access: AtomicU64,
}

/// All counters.
#[derive(Default)]
pub(super) struct Counters {
    /// Per-thread stripes, indexed like the free-list shards.
    pub(super) stripes: [Stripe; SHARDS],
    /// Live blocks evicted.
    pub(super) evictions: AtomicU64,
    /// Tombstones passed by the head.
    pub(super) tombstones_passed: AtomicU64,
    /// Free-listed blocks passed by the head.
    pub(super) free_listed_passed: AtomicU64,
}

/// Adds `n` to a counter nobody needs ordered with anything else.
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// Sums the stripes into a snapshot (ring and free-list figures are filled by the pool).
    pub(super) fn snapshot(&self) -> PoolStats {
        let sum = |f: fn(&Stripe) -> &AtomicU64| -> u64 {
            self.stripes
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .fold(0, u64::wrapping_add)
        };
        PoolStats {
            bytes_in_use: sum(|s| &s.allocated).wrapping_sub(sum(|s| &s.released)),
            allocs_free_list: sum(|s| &s.from_free_list),
            allocs_tail: sum(|s| &s.from_tail),
            copy_on_access_frees: sum(|s| &s.copy_on_access),
            evictions: self.evictions.load(Ordering::Relaxed),
            tombstones_passed: self.tombstones_passed.load(Ordering::Relaxed),
            free_listed_passed: self.free_listed_passed.load(Ordering::Relaxed),
            ..PoolStats::default()
        }
    }
}
