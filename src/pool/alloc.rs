//! Allocating and returning blocks (paper §4.2), and the two tokens that own a block while
//! no mapping entry points at it.
//!
//! `alloc` tries the size class's free lists, then bumps the tail with a CAS (no global lock).
//! A returned block goes onto a free list, unless it sits in the copy-on-access region or an
//! evictor already claimed it: then it becomes a tombstone the head will pass.

use std::marker::PhantomData;

use super::free_list::{class_of, my_shard};
use super::ring::header;
use super::stats::bump;
use super::{BlockAddr, BufferPool, PageId};
use crate::sync::Ordering;

/// A freshly allocated block, not yet reachable from any mapping entry. Dropping it returns
/// the memory to the pool.
pub(crate) struct NewBlock<'a> {
    pub(super) pool: &'a BufferPool,
    /// Physical offset of the header.
    pub(super) phys: u64,
    /// Usable bytes.
    pub(super) size: usize,
    /// The token owns the bytes: not `Sync`-shared implicitly beyond `&mut` use.
    pub(super) _owns: PhantomData<*mut u8>,
}

/// A block no mapping entry points at any more; nobody but this token can reach it.
/// Dropping it (or `BufferPool::dealloc`) returns the memory.
pub(crate) struct DetachedBlock<'a> {
    pub(super) pool: &'a BufferPool,
    /// Physical offset of the header.
    pub(super) phys: u64,
    /// Usable bytes.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(super) size: usize,
    /// See `NewBlock`.
    pub(super) _owns: PhantomData<*mut u8>,
}

// SAFETY: a token is the sole owner of its block's bytes (the header state ALLOCATING or
// DETACHED keeps everyone else out); moving it to another thread moves that ownership.
unsafe impl Send for NewBlock<'_> {}
// SAFETY: as above.
unsafe impl Send for DetachedBlock<'_> {}
// SAFETY: `&NewBlock` only allows `addr()`; `&DetachedBlock` only reads the bytes, which the
// token owns and nobody writes while it exists.
unsafe impl Sync for NewBlock<'_> {}
// SAFETY: as above.
unsafe impl Sync for DetachedBlock<'_> {}

impl NewBlock<'_> {
    /// The block's usable bytes (`size` of them; initial contents unspecified).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the block is ALLOCATING and this token is its only holder, so `&mut self`
        // gives exclusive access to its payload, which stays mapped while the pool lives.
        unsafe { std::slice::from_raw_parts_mut(self.pool.ring.payload(self.phys), self.size) }
    }

    /// Where the block is.
    pub(crate) fn addr(&self) -> BlockAddr {
        BlockAddr(self.phys / 8)
    }

    /// Usable bytes.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

impl Drop for NewBlock<'_> {
    fn drop(&mut self) {
        self.pool.release(self.phys);
    }
}

impl DetachedBlock<'_> {
    /// The block's usable bytes, as they were when it was detached.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the block is DETACHED and held only by this token; nobody writes it while
        // the token lives, and the head cannot pass it (it is not a tombstone).
        unsafe { std::slice::from_raw_parts(self.pool.ring.payload(self.phys), self.size) }
    }

    /// Where the block was.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn addr(&self) -> BlockAddr {
        BlockAddr(self.phys / 8)
    }
}

impl Drop for DetachedBlock<'_> {
    fn drop(&mut self) {
        self.pool.release(self.phys);
    }
}

impl BufferPool {
    /// Allocates a block whose usable bytes are `size` (a class size: `block_size_for`), tagged
    /// with `owner`: from the size class's free lists first, else the tail. `None` when the
    /// buffer is full (the caller releases its page locks, calls `evict_one`, and retries) or
    /// when a block of that size cannot fit the buffer at all.
    ///
    /// Panics if `size` is not a class size: node sizes are fixed by the tree.
    pub(crate) fn alloc(&self, size: usize, owner: PageId) -> Option<NewBlock<'_>> {
        assert!(
            super::size::class_of(size).is_some(),
            "block size {size} is not a size class in 64..=65536"
        );
        let shard = my_shard();
        let stripe = &self.counters.stripes[shard];
        let total = size as u64 + 8;
        let phys = if let Some(phys) =
            self.free
                .pop(&self.ring, class_of(size as u64), shard, owner)
        {
            bump(&stripe.from_free_list, 1);
            phys
        } else {
            let phys = self.alloc_tail(total, owner)?;
            bump(&stripe.from_tail, 1);
            phys
        };
        bump(&stripe.allocated, total);
        Some(NewBlock {
            pool: self,
            phys,
            size,
            _owns: PhantomData,
        })
    }

    /// Returns a detached block's memory to the pool. (Dropping the block does it; the
    /// method names the moment at call sites that swap blocks.)
    #[allow(clippy::unused_self)]
    pub(crate) fn dealloc(&self, block: DetachedBlock<'_>) {
        drop(block);
    }

    /// Moves the tail over a new block of `total` bytes (and over a filler first when the
    /// block would straddle the physical end). Writes its `ALLOCATING` header.
    fn alloc_tail(&self, total: u64, owner: PageId) -> Option<u64> {
        let ring = self.ring.size();
        if total > ring {
            return None;
        }
        let mut t = self.tail.load(Ordering::Acquire);
        loop {
            let limit = self.head.load(Ordering::Acquire) + ring;
            let phys = t % ring;
            let filler = if phys + total > ring { ring - phys } else { 0 };
            // Everything below `limit - ring` was passed and zeroed, so the new headers land
            // on UNWRITTEN memory and the evictor waits for them (see `evict.rs`).
            let (end, whole) = if t + filler + total <= limit {
                (t + filler + total, true)
            } else if filler > 0 && t + filler <= limit {
                // Pad to the physical end now, so the block fits at 0 once the head moves.
                (t + filler, false)
            } else {
                return None;
            };
            match self
                .tail
                .compare_exchange_weak(t, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if filler > 0 {
                        let h = header::make(0, header::TOMBSTONE, filler);
                        self.ring.header(phys).store(h, Ordering::Release);
                    }
                    if whole {
                        let at = (phys + filler) % ring;
                        let h = header::make(owner, header::ALLOCATING, total);
                        self.ring.header(at).store(h, Ordering::Release);
                        return Some(at);
                    }
                    t = end;
                }
                Err(now) => t = now,
            }
        }
    }

    /// Takes back the block at `phys` from its token (state `ALLOCATING` or `DETACHED`).
    pub(super) fn release(&self, phys: u64) {
        let shard = my_shard();
        let stripe = &self.counters.stripes[shard];
        let hdr = self.ring.header(phys);
        bump(&stripe.released, header::total(hdr.load(Ordering::Acquire)));
        let near_head = self.in_copy_on_access(phys);
        if near_head {
            bump(&stripe.copy_on_access, 1);
        }
        if near_head || !self.free.push(&self.ring, phys, shard) {
            let mut h = hdr.load(Ordering::Acquire);
            loop {
                let dead = header::with_state(h, header::TOMBSTONE, 0);
                match hdr.compare_exchange_weak(h, dead, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(now) => h = now,
                }
            }
        }
    }
}
