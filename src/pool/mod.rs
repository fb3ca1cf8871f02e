//! The buffer pool (paper §3.3, §4): the circular buffer holding every mini-page, and the
//! mapping table from page ids to locations, whose entries carry the page locks.
//!
//! Ownership story (what makes the safe API sound): a block's bytes are reachable only
//! through a guard on the one page whose entry maps it (header state `READY`), or through
//! the `NewBlock` / `DetachedBlock` token that holds it (`ALLOCATING` / `DETACHED`); an
//! optimistic read (`optimistic.rs`) may load a mapped block's bytes without a guard, but
//! keeps nothing it read unless the page's version proves no writer was in. Free
//! blocks (`FREE`) belong to one free-list shard, under its lock. The head passes only
//! tombstones an evictor claimed and finished with, so memory past the head is never
//! reachable, and it is zeroed before the tail hands it out again.
//!
//! Regions (logical addresses grow forever; physical = logical % size): `[head, head +
//! second_chance)` is copy-on-access, `[.., tail)` is in-place; `[tail, head + size)` is
//! free.

mod alloc;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod audit;
mod evict;
mod free_list;
mod guard;
#[cfg(any(fuzzing, bfkv_internals))]
pub(crate) mod harness;
mod latch;
mod mapping;
mod optimistic;
mod ring;
mod size;
mod stats;

#[cfg(all(test, shuttle))]
mod shuttle_tests;
#[cfg(all(test, not(shuttle)))]
mod stress_tests;
#[cfg(all(test, not(shuttle)))]
mod tests;

pub(crate) use alloc::NewBlock;
pub(crate) use evict::{EvictGuard, Evicted};
pub(crate) use free_list::my_shard;
pub(crate) use guard::{ReadGuard, WriteGuard};
pub(crate) use latch::MAX_DISK_PAGE;
pub(crate) use optimistic::{BlockView, OptimisticRead};
pub(crate) use size::{block_size_for, largest_class_within};
pub(crate) use stats::PoolStats;

use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Ordering};
use evict::Evictor;
use free_list::FreeLists;
use mapping::MappingTable;
use ring::Ring;
use stats::Counters;

/// A leaf page's logical id: an index into the mapping table.
pub(crate) type PageId = u32;

/// Smallest accepted pool size in bytes. A 64 KiB node needs a little more than this, so a
/// pool this small only serves smaller nodes (`alloc` of a block that cannot fit returns
/// `None` and `evict_one` then reports nothing to evict).
pub(crate) const MIN_POOL_SIZE: usize = 64 << 10;

/// Where a block is: its header's physical offset in the buffer / 8 (fits 46 bits).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub(crate) struct BlockAddr(pub(super) u64);

/// Where a leaf page is: only on disk (a page number of the data file), or it has a
/// mini-page in the buffer (whose own header records its disk page).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Location {
    /// On disk at this page number only.
    Disk(u64),
    /// With a mini-page at this block.
    Mini(BlockAddr),
}

/// The circular buffer and the mapping table. `Send + Sync`; every method takes `&self`.
pub(crate) struct BufferPool {
    /// The buffer's memory.
    ring: Ring,
    /// Logical address of the oldest unpassed block.
    head: AtomicU64,
    /// Logical address where the next tail allocation goes.
    tail: AtomicU64,
    /// Bytes of the copy-on-access region after the head.
    second_chance: u64,
    /// Free blocks by size class.
    free: FreeLists,
    /// Eviction bookkeeping.
    evict: Evictor,
    /// Page id -> location + lock.
    table: MappingTable,
    /// Counters.
    counters: Counters,
    /// The configured size in bytes.
    capacity: usize,
    /// Read locks taken (tests: which reads took the latch).
    #[cfg(all(test, not(shuttle)))]
    read_locks: std::sync::atomic::AtomicU64,
}

impl BufferPool {
    /// A pool of exactly `capacity` bytes (any size >= [`MIN_POOL_SIZE`]; blocks use it
    /// rounded down to a multiple of 8) whose last `second_chance_percent` % before the head
    /// is copy-on-access.
    ///
    /// # Errors
    /// `InvalidConfig` if `capacity` is below `MIN_POOL_SIZE` or the percentage above 100;
    /// `Io` if the memory cannot be mapped.
    pub(crate) fn new(capacity: usize, second_chance_percent: u8) -> Result<BufferPool> {
        if capacity < MIN_POOL_SIZE {
            return Err(Error::InvalidConfig {
                reason: "buffer pool smaller than 64 KiB",
            });
        }
        if second_chance_percent > 100 {
            return Err(Error::InvalidConfig {
                reason: "second-chance percentage above 100",
            });
        }
        let ring = Ring::new(capacity)?;
        let second_chance = ring.size() / 100 * u64::from(second_chance_percent)
            + ring.size() % 100 * u64::from(second_chance_percent) / 100;
        Ok(BufferPool {
            ring,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            second_chance,
            free: FreeLists::new(),
            evict: Evictor::new(0),
            table: MappingTable::new(),
            counters: Counters::default(),
            capacity,
            #[cfg(all(test, not(shuttle)))]
            read_locks: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A pool whose mapping table holds exactly `entries` (id, disk page); unlisted ids below
    /// the largest are free for reuse. For loading a checkpoint.
    ///
    /// # Errors
    /// As [`BufferPool::new`]; `Corruption` if an id repeats or a page number is out of
    /// range (the entries come from a file).
    pub(crate) fn with_pages(
        capacity: usize,
        second_chance_percent: u8,
        entries: &[(PageId, u64)],
    ) -> Result<BufferPool> {
        let pool = BufferPool::new(capacity, second_chance_percent)?;
        let mut ids: Vec<PageId> = entries.iter().map(|&(pid, _)| pid).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::corruption(
                "mapping table",
                None,
                "a page id appears twice",
            ));
        }
        for &(pid, page) in entries {
            if page > MAX_DISK_PAGE {
                return Err(Error::corruption(
                    "mapping table",
                    Some(page),
                    "page number too large",
                ));
            }
            let word = pool.table.word(pid);
            latch::set_location(word, Location::Disk(page));
        }
        let limit = ids.last().map_or(0, |&m| u64::from(m) + 1);
        let mut listed = ids.iter().peekable();
        let mut free = Vec::new();
        for pid in 0..limit {
            if listed.peek().is_some_and(|&&l| u64::from(l) == pid) {
                listed.next();
            } else {
                free.push(pid as PageId);
            }
        }
        // An id list ending at u32::MAX leaves no fresh ids; `take_id` then uses the free list.
        pool.table
            .set_ids(limit.min(u64::from(u32::MAX)) as u32, free);
        Ok(pool)
    }

    /// Whether the block at `addr` is in the copy-on-access region near the head (or already
    /// claimed by an evictor): the tree copies such a mini-page to the tail when it touches it.
    pub(crate) fn is_copy_on_access(&self, addr: BlockAddr) -> bool {
        let phys = addr.0 * 8;
        if phys >= self.ring.size() {
            return false;
        }
        self.in_copy_on_access(phys)
    }

    /// `is_copy_on_access` by physical offset. Exact for blocks between head and tail (any
    /// block someone holds): such a block's logical address is the one in `[head, head+size)`.
    fn in_copy_on_access(&self, phys: u64) -> bool {
        let size = self.ring.size();
        let head = self.head.load(Ordering::Acquire);
        let offset = (phys + size - head % size) % size;
        let claimed = self.evict.cursor().saturating_sub(head);
        offset < self.second_chance.max(claimed)
    }

    /// Counters and occupancy.
    pub(crate) fn stats(&self) -> PoolStats {
        let mut s = self.counters.snapshot();
        let head = self.head.load(Ordering::Acquire);
        s.ring_bytes = self.tail.load(Ordering::Acquire).saturating_sub(head);
        s.free_listed = self.free.len() as u64;
        s
    }

    /// From now on, no new page gets an id, as if 2^32 pages existed (tests of what a full
    /// id space does; really filling it would take a 16 TiB tree).
    #[cfg(test)]
    pub(crate) fn exhaust_ids(&self) {
        self.table.exhaust();
    }

    /// Bytes the tail can still advance before it reaches the head (free-listed blocks and
    /// tombstones inside the ring not counted): what background eviction keeps above a mark.
    pub(crate) fn ring_free(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let used = self.tail.load(Ordering::Acquire).saturating_sub(head);
        self.capacity.saturating_sub(used as usize)
    }

    /// The configured size in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries in the mapping table: the tree's leaves (a relaxed count).
    pub(crate) fn pages_in_use(&self) -> usize {
        self.table.in_use()
    }

    /// One more than the largest page id handed out so far.
    pub(crate) fn page_id_limit(&self) -> PageId {
        self.table.id_limit()
    }

    /// The lock word and the version of `pid`'s entry, as they are (tests: reads must leave
    /// both alone).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn entry_words(&self, pid: PageId) -> (u64, u64) {
        let entry = self.table.entry(pid);
        (
            entry.word.load(Ordering::Relaxed),
            entry.version.load(Ordering::Relaxed),
        )
    }

    /// Read locks taken so far (tests).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn read_locks(&self) -> u64 {
        self.read_locks.load(Ordering::Relaxed)
    }

    /// Every live entry and its location (tests). Takes each entry's read lock briefly.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn page_entries(&self) -> Vec<(PageId, Location)> {
        (0..self.table.id_limit())
            .filter_map(|pid| {
                let guard = self.read(pid);
                (!guard.is_removed()).then(|| (pid, guard.location()))
            })
            .collect()
    }
}
