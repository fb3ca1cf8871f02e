//! Free lists per size class (paper §4.1), sharded so threads do not share a lock.
//!
//! Each (size class, shard) is an intrusive doubly linked list threaded through the free
//! blocks' payloads (next, prev physical offsets in the first 16 bytes; every payload has at
//! least 64), so the evictor can unlink any block in O(1) before the head passes it. A
//! block's header says `FREE` exactly while it is on a list, and that header and the links
//! change only under the shard's lock. A free block's header `owner` field names its shard.

use super::ring::{header, Ring};
use crate::sync::{AtomicUsize, Mutex, Ordering};

use super::size::CLASSES;
/// Shards per class; a thread pushes to its own and pops from its own first.
pub(super) const SHARDS: usize = 8;
/// End of a list.
const NIL: u64 = u64::MAX;

/// One list, padded to its own cache lines so two threads' shards never share one.
#[repr(align(128))]
struct Shard {
    /// Physical offset of the first block, or `NIL`.
    first: Mutex<u64>,
    /// Blocks on the list: lets `pop` skip empty shards without taking their locks.
    len: AtomicUsize,
}

/// All the free lists.
pub(super) struct FreeLists {
    shards: Box<[Shard]>,
}

/// The size class of a block's usable size. Blocks are only ever allocated at class sizes
/// (`alloc` checks), so every block has one.
pub(super) fn class_of(size: u64) -> usize {
    let class = usize::try_from(size).ok().and_then(super::size::class_of);
    debug_assert!(class.is_some(), "block of {size} bytes is not a class size");
    class.unwrap_or(0)
}

/// The shard this thread prefers (threads are numbered round-robin on first use).
pub(crate) fn my_shard() -> usize {
    #[cfg(not(shuttle))]
    {
        use std::sync::atomic::AtomicUsize as Counter;
        static NEXT: Counter = Counter::new(0);
        thread_local!(static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        MINE.with(|m| *m)
    }
    #[cfg(shuttle)]
    {
        // Shuttle threads may share an OS thread; hash the model thread's id instead.
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        shuttle::thread::current().id().hash(&mut h);
        (h.finish() as usize) % SHARDS
    }
}

impl FreeLists {
    /// Empty lists.
    pub(super) fn new() -> FreeLists {
        let shards = (0..CLASSES * SHARDS)
            .map(|_| Shard {
                first: Mutex::new(NIL),
                len: AtomicUsize::new(0),
            })
            .collect();
        FreeLists { shards }
    }

    /// Puts the block at `phys` (held by the caller, header state `ALLOCATING` or `DETACHED`)
    /// on `shard` of its class. Returns false, leaving it untouched, if an evictor claimed it
    /// meanwhile: then it must become a tombstone instead.
    pub(super) fn push(&self, ring: &Ring, phys: u64, shard: usize) -> bool {
        let hdr = ring.header(phys);
        let class = class_of(header::total(hdr.load(Ordering::Acquire)) - 8);
        let s = &self.shards[class * SHARDS + shard];
        let mut first = s.first.lock();
        let mut h = hdr.load(Ordering::Acquire);
        loop {
            if header::claimed(h) {
                return false;
            }
            let free = header::with_state(h, header::FREE, shard as u32);
            match hdr.compare_exchange(h, free, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => h = now,
            }
        }
        // SAFETY: the block is FREE on this shard, whose lock we hold: its links are ours.
        unsafe { set_links(ring, phys, *first, NIL) };
        if *first != NIL {
            // SAFETY: `*first` is on this shard (FREE, links owned under this lock).
            unsafe { set_prev(ring, *first, phys) };
        }
        *first = phys;
        s.len.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Takes a block of `class` for `owner`, trying shard `prefer` first: its header becomes
    /// `ALLOCATING` with that owner. Blocks an evictor claimed are turned into tombstones on
    /// the way (the head will pass them).
    pub(super) fn pop(&self, ring: &Ring, class: usize, prefer: usize, owner: u32) -> Option<u64> {
        for i in 0..SHARDS {
            let shard = (prefer + i) % SHARDS;
            let s = &self.shards[class * SHARDS + shard];
            if s.len.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut first = s.first.lock();
            while *first != NIL {
                let phys = *first;
                // SAFETY: `phys` heads this shard's list; we hold the shard lock.
                unsafe { unlink(ring, &mut first, phys) };
                s.len.fetch_sub(1, Ordering::Relaxed);
                let hdr = ring.header(phys);
                let mut h = hdr.load(Ordering::Acquire);
                loop {
                    let (state, mine) = if header::claimed(h) {
                        (header::TOMBSTONE, false)
                    } else {
                        (header::ALLOCATING, true)
                    };
                    let next = header::with_state(h, state, owner);
                    match hdr.compare_exchange(h, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) if mine => return Some(phys),
                        Ok(_) => break,
                        Err(now) => h = now,
                    }
                }
            }
        }
        None
    }

    /// For the evictor: the claimed block at `phys`, if still `FREE`, leaves its list and
    /// becomes a tombstone. Afterwards no list can hand it out.
    pub(super) fn remove_claimed(&self, ring: &Ring, phys: u64) {
        let hdr = ring.header(phys);
        let h = hdr.load(Ordering::Acquire);
        if header::state(h) != header::FREE {
            return;
        }
        debug_assert!(header::claimed(h));
        let shard = header::owner(h) as usize % SHARDS;
        let s = &self.shards[class_of(header::total(h) - 8) * SHARDS + shard];
        let mut first = s.first.lock();
        // Re-read under the lock: a popper may have taken it off already (then it is a
        // tombstone). While FREE, the shard field cannot change.
        let h = hdr.load(Ordering::Acquire);
        if header::state(h) != header::FREE {
            return;
        }
        // SAFETY: the block is FREE on this shard and we hold the shard's lock.
        unsafe { unlink(ring, &mut first, phys) };
        s.len.fetch_sub(1, Ordering::Relaxed);
        hdr.store(
            header::with_state(h, header::TOMBSTONE, 0),
            Ordering::Release,
        );
    }

    /// Blocks on all lists (for stats and tests).
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.len.load(Ordering::Relaxed))
            .sum()
    }
}

/// Reads the links of a listed block.
///
/// # Safety
/// The block is `FREE` on a list whose lock the caller holds.
unsafe fn links(ring: &Ring, phys: u64) -> (u64, u64) {
    let p = ring.payload(phys) as *const u64;
    // SAFETY: the payload is 8-aligned with >= 16 bytes, owned by the list (caller contract).
    unsafe { (p.read(), p.add(1).read()) }
}

/// Writes both links of a listed block. Safety: as [`links`].
unsafe fn set_links(ring: &Ring, phys: u64, next: u64, prev: u64) {
    let p = ring.payload(phys).cast::<u64>();
    // SAFETY: as in `links`.
    unsafe {
        p.write(next);
        p.add(1).write(prev);
    }
}

/// Writes the `prev` link. Safety: as [`links`].
unsafe fn set_prev(ring: &Ring, phys: u64, prev: u64) {
    // SAFETY: as in `links`.
    unsafe { ring.payload(phys).cast::<u64>().add(1).write(prev) }
}

/// Writes the `next` link. Safety: as [`links`].
unsafe fn set_next(ring: &Ring, phys: u64, next: u64) {
    // SAFETY: as in `links`.
    unsafe { ring.payload(phys).cast::<u64>().write(next) }
}

/// Unlinks `phys` from the list whose head is `first`. Safety: as [`links`], for `phys` and
/// its neighbours (all on the same locked list).
unsafe fn unlink(ring: &Ring, first: &mut u64, phys: u64) {
    // SAFETY: the caller holds the list lock; `phys` and its neighbours are on it.
    unsafe {
        let (next, prev) = links(ring, phys);
        if prev == NIL {
            *first = next;
        } else {
            set_next(ring, prev, next);
        }
        if next != NIL {
            set_prev(ring, next, prev);
        }
    }
}
