//! The circular buffer's memory and the 8-byte block header (paper §4.3).
//!
//! The ring is one anonymous mapping; blocks are packed in it with no gaps, each an 8-byte
//! header followed by its payload. Logical addresses grow forever and the physical offset is
//! `logical % size`; a block never straddles the physical end (a filler tombstone pads it).
//! Headers are atomics because the evictor reads a block's header while its holder may
//! change its state; payload bytes are never touched by two parties at once (the ownership
//! rules in `mod.rs` say who may).

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64 as RawAtomicU64;

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// Header word layout: `owner` (or free-list shard) in bits 0..32, state in 32..36, the
/// claimed bit (the evictor has taken the block) at 36, total size / 8 in bits 40..64.
pub(super) mod header {
    /// Memory never written since the head passed it (all zero): a tail allocation is
    /// between moving the tail and writing its header.
    pub(crate) const UNWRITTEN: u64 = 0;
    /// Held by a `NewBlock` token.
    pub(crate) const ALLOCATING: u64 = 1;
    /// Mapped by its owner's entry; changes only under the owner's write lock.
    pub(crate) const READY: u64 = 2;
    /// Held by a `DetachedBlock` token.
    pub(crate) const DETACHED: u64 = 3;
    /// On a free list; changes only under that list shard's lock.
    pub(crate) const FREE: u64 = 4;
    /// Dead: the head may pass it (also the filler at the physical end).
    pub(crate) const TOMBSTONE: u64 = 5;

    const STATE_SHIFT: u32 = 32;
    const CLAIMED: u64 = 1 << 36;
    const SIZE_SHIFT: u32 = 40;

    /// A header word for a block of `total` bytes (header included).
    pub(crate) fn make(owner: u32, state: u64, total: u64) -> u64 {
        debug_assert!(total.is_multiple_of(8) && total / 8 < (1 << 24) && state < 16);
        u64::from(owner) | (state << STATE_SHIFT) | ((total / 8) << SIZE_SHIFT)
    }
    /// The owner page id (or free-list shard index when `FREE`).
    pub(crate) fn owner(h: u64) -> u32 {
        h as u32
    }
    /// The state, one of the constants above.
    pub(crate) fn state(h: u64) -> u64 {
        (h >> STATE_SHIFT) & 0xF
    }
    /// Whether an evictor has claimed the block (it will never be free-listed again).
    pub(crate) fn claimed(h: u64) -> bool {
        h & CLAIMED != 0
    }
    /// Total bytes of the block, header included.
    pub(crate) fn total(h: u64) -> u64 {
        (h >> SIZE_SHIFT) * 8
    }
    /// `h` with the claimed bit set.
    pub(crate) fn with_claimed(h: u64) -> u64 {
        h | CLAIMED
    }
    /// `h` with a new state and owner, keeping the size and the claimed bit.
    pub(crate) fn with_state(h: u64, state: u64, owner: u32) -> u64 {
        (h & !(0xF << STATE_SHIFT) & !0xFFFF_FFFF) | (state << STATE_SHIFT) | u64::from(owner)
    }
}

/// The ring's memory: exactly `capacity` mapped bytes, of which `size` (rounded down to 8)
/// hold blocks.
pub(super) struct Ring {
    /// Keeps the mapping alive; never dereferenced after `base` was taken, so the only way to
    /// the bytes is through `base` (no `&mut [u8]` to the whole ring ever exists).
    _map: MmapMut,
    /// Start of the mapping (page aligned, so every 8-byte offset is 8-byte aligned).
    base: NonNull<u8>,
    /// Bytes used for blocks: the capacity rounded down to a multiple of 8.
    size: u64,
}

// SAFETY: `Ring` is a raw region of memory; which thread may touch which bytes is decided by
// the block states (headers are only accessed atomically) and the page locks, as documented
// on each accessor. The mapping itself is not tied to a thread.
unsafe impl Send for Ring {}
// SAFETY: as above; shared access goes through atomics or through the ownership protocol.
unsafe impl Sync for Ring {}

impl Ring {
    /// Maps `capacity` bytes, advised for transparent huge pages on Linux (failure to advise
    /// is fine: huge pages only reduce TLB misses).
    pub(super) fn new(capacity: usize) -> Result<Ring> {
        let mut map =
            MmapMut::map_anon(capacity).map_err(|e| Error::io("<anonymous mapping>", e))?;
        // Miri cannot run `madvise`; the advice changes no behaviour it could check.
        #[cfg(all(target_os = "linux", not(miri)))]
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = NonNull::new(map.as_mut_ptr()).ok_or(Error::InvalidConfig {
            reason: "the circular buffer mapping returned a null address",
        })?;
        Ok(Ring {
            _map: map,
            base,
            size: (capacity as u64) & !7,
        })
    }

    /// Bytes available for blocks.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// The header word of the block at physical offset `phys`.
    pub(super) fn header(&self, phys: u64) -> &RawAtomicU64 {
        debug_assert!(phys.is_multiple_of(8) && phys + 8 <= self.size);
        // Header words are plain std atomics (they live in the mapping), invisible to shuttle:
        // make each access a scheduling point so the model explores header races too.
        #[cfg(shuttle)]
        shuttle::thread::yield_now();
        // SAFETY: `phys` is an 8-aligned offset inside the mapping (callers only pass block
        // offsets, which are 8-aligned and below `size`), the mapping is page aligned and lives
        // as long as `self`; header words are only ever accessed atomically while anyone may
        // look at them, and the plain zeroing in `zero` happens only after the head passed
        // the block, when no reference to its header is alive (see `evict.rs`).
        unsafe { &*(self.base.as_ptr().add(phys as usize) as *const RawAtomicU64) }
    }

    /// Starts loading the cache lines of bytes `phys..phys + len` (clamped to the mapping):
    /// a hint, which reads nothing the program observes.
    pub(super) fn prefetch(&self, phys: u64, len: u64) {
        let end = phys.saturating_add(len).min(self.size);
        for at in (phys..end).step_by(64) {
            crate::node::prefetch(self.base.as_ptr().wrapping_add(at as usize));
        }
    }

    /// Pointer to the payload of the block at `phys`. Dereferencing it is governed by the
    /// block's state: only the holder (token, page guard, free-list shard lock) may.
    pub(super) fn payload(&self, phys: u64) -> *mut u8 {
        debug_assert!(phys.is_multiple_of(8) && phys + 8 <= self.size);
        // SAFETY: the offset is inside the mapping (see `header`), so `add` stays in bounds.
        unsafe { self.base.as_ptr().add(phys as usize + 8) }
    }

    /// Zeroes `len` bytes at `phys`, so a later tail allocation there finds an `UNWRITTEN`
    /// header until it writes its own.
    ///
    /// # Safety
    /// Nobody may hold a reference into `[phys, phys + len)`: the head has just passed it.
    pub(super) unsafe fn zero(&self, phys: u64, len: u64) {
        debug_assert!(phys + len <= self.size);
        // SAFETY: in bounds (blocks never straddle the end); exclusive per the contract.
        unsafe { std::ptr::write_bytes(self.base.as_ptr().add(phys as usize), 0, len as usize) }
    }
}
