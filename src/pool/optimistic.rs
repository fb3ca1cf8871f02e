//! Optimistic reads (paper §4.1, optimistic lock coupling on leaves): read a page's
//! mini-page without taking its lock, and find out afterwards whether a writer interfered.
//!
//! Each mapping entry carries a version beside its lock word (`mapping.rs`). Every write
//! lock makes it odd when taken and even again when let go (`begin_write`, `end_write`, run
//! by `WriteGuard` and nothing else), and every change to a mapped block's bytes, to the
//! entry's location or to the block's ownership happens between the two. A reader:
//!
//! 1. loads the version (acquire); odd means a writer is in: fall back to the lock;
//! 2. loads the location and, for a mini-page, the block's header, and checks that the
//!    header names this page and fits the ring (else the page changed under us); the
//!    header's line and the next ones, where a node keeps its first metas, are requested
//!    together, so a lookup waits on memory once for both instead of once for each;
//! 3. loads the words it needs with atomic loads ([`BlockView::load_word`]), trusting
//!    none of them (`node/racy.rs` reads a node that way);
//! 4. loads the version again after an acquire fence ([`OptimisticRead::validate`]): the
//!    same even value proves no writer entered between 1 and 4, so every word read is what
//!    the page held at one instant, and only then may the caller keep its answer.
//!
//! Nothing here stores to shared memory: readers leave the lock word and the version as they
//! found them. A stale read is harmless: the ring stays mapped for the pool's life, so the
//! loads stay in bounds, and a block is reused by another page only after a write-locked
//! detach, which bumped this page's version.
//!
//! The reads race with writers by design (the seqlock pattern): writers store plain bytes
//! while a reader loads them. Rust's memory model has no blessed way to do this yet (an
//! "atomic memcpy", RFC 3301), so it is done as seqlocks in Rust do it today: each word
//! the reader decides with is loaded once, atomically (`BlockView::load_word`), and bulk
//! bytes are copied once into the reader's own memory (`BlockView::copy_bytes`, `copy_to`),
//! so no check can be undone by a second, different read of the same memory. What a racing
//! read returned is thrown away when validation fails, before anything is decided on it.

use std::marker::PhantomData;
use std::sync::atomic::AtomicU64 as RawAtomicU64;

use super::latch;
use super::ring::header;
use super::{BufferPool, Location, PageId, WriteGuard};
use crate::sync::{fence, AtomicU64, Ordering};

/// Bytes from a block's start an optimistic read starts loading at once: its header and the
/// first metas of its node (a full leaf page's run to one or two KiB). Lookups ran faster
/// with 1 KiB than with 512 B or 2 KiB: more lines spend the memory's time on bytes that a
/// search seldom reads.
const EARLY_PREFETCH: u64 = 1024;

/// Marks the start of a write: the version goes odd before the writer changes anything.
/// Called with the page's write lock held, so no other thread stores the version.
pub(super) fn begin_write(version: &AtomicU64) {
    let v = version.load(Ordering::Relaxed);
    debug_assert!(v.is_multiple_of(2), "a write began inside another");
    version.store(v + 1, Ordering::Relaxed);
    // Orders the odd version before every store the writer makes to the page: a reader that
    // sees any of those stores sees the odd version (or a later one) when it validates.
    fence(Ordering::Release);
}

/// Marks the end of a write (before the lock is let go): the version goes even again,
/// releasing every store the writer made.
pub(super) fn end_write(version: &AtomicU64) {
    let v = version.load(Ordering::Relaxed);
    debug_assert!(!v.is_multiple_of(2), "a write ended that never began");
    version.store(v + 1, Ordering::Release);
}

/// A read of one page begun without its lock: what it saw, to be proven current by
/// [`OptimisticRead::validate`].
pub(crate) struct OptimisticRead<'a> {
    pool: &'a BufferPool,
    pid: PageId,
    version: &'a AtomicU64,
    /// The even version seen at the start.
    seen: u64,
    location: Location,
    /// For a mini-page whose header looked right: its physical offset and payload bytes.
    block: Option<(u64, usize)>,
}

/// The bytes of a block an optimistic read found, as memory holds them now: maybe torn by a
/// writer, so use what they show only after [`OptimisticRead::validate`] says so. Small and
/// `Copy`, so a reader keeps it in registers.
#[derive(Clone, Copy)]
pub(crate) struct BlockView<'a> {
    /// The payload's first byte, 8-aligned, inside the ring (checked by `peek_block`).
    payload: *const u8,
    /// Payload bytes, all inside the ring.
    len: usize,
    _pool: PhantomData<&'a BufferPool>,
}

impl BlockView<'_> {
    /// Payload bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Word `i` (bytes `8 * i..8 * i + 8`) as memory holds it, 0 past the block.
    #[inline]
    pub(crate) fn load_word(&self, i: usize) -> u64 {
        if i >= self.len / 8 {
            return 0;
        }
        #[cfg(shuttle)]
        crate::sync::yield_now();
        // SAFETY: `peek_block` checked that the payload, `len` bytes from the 8-aligned
        // `payload`, lies inside the ring, which stays mapped as long as the pool this view
        // borrows; `i < len / 8` keeps the word inside it. The load is atomic: a writer can
        // tear what a reader sees across words, but not make the load invalid, and a torn
        // view fails validation (module docs).
        unsafe { (*self.payload.cast::<RawAtomicU64>().add(i)).load(Ordering::Relaxed) }
    }

    /// Starts loading the cache line of byte `at` (nothing past the block).
    #[inline]
    pub(crate) fn prefetch_at(&self, at: usize) {
        if at < self.len {
            crate::node::prefetch(self.payload.wrapping_add(at));
        }
    }

    /// Copies bytes `at..at + dst.len()`, clamped to the block, to the start of `dst`: one
    /// plain copy, so each byte is read once, maybe torn like `load_word`'s words.
    #[inline]
    pub(crate) fn copy_to(&self, at: usize, dst: &mut [u8]) {
        let end = at.saturating_add(dst.len()).min(self.len);
        if at >= end {
            return;
        }
        #[cfg(shuttle)]
        crate::sync::yield_now();
        // SAFETY: as in `copy_bytes`: the source lies inside the ring, mapped as long as the
        // pool this view borrows, `end - at <= dst.len()`, `dst` cannot overlap the ring,
        // and a racing writer only tears what validation then throws away.
        unsafe {
            std::ptr::copy_nonoverlapping(self.payload.add(at), dst.as_mut_ptr(), end - at);
        }
    }

    /// Appends bytes `at..at + len`, clamped to the block, to `out`: one plain copy, so each
    /// byte is read once, maybe torn like `load_word`'s words.
    #[inline]
    pub(crate) fn copy_bytes(&self, at: usize, len: usize, out: &mut Vec<u8>) {
        let end = at.saturating_add(len).min(self.len);
        if at >= end {
            return;
        }
        out.reserve(end - at);
        #[cfg(shuttle)]
        crate::sync::yield_now();
        // SAFETY: the payload lies inside the ring, mapped as long as the pool this view
        // borrows (`peek_block`), and `at < end <= len`; `out` has room for `end - at` more
        // bytes after `reserve`, and its buffer cannot overlap the ring. A writer may store
        // to these bytes while they are copied (module docs: the copy is discarded unless
        // validation proves it was not); the copy reads each byte once into memory only this
        // thread sees, so nothing checked in it can change afterwards.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.payload.add(at),
                out.as_mut_ptr().add(out.len()),
                end - at,
            );
            out.set_len(out.len() + end - at);
        }
    }
}

impl BufferPool {
    /// Starts an optimistic read of `pid`: `None` if a writer holds the page now (take the
    /// lock instead). Stores nothing.
    pub(crate) fn read_optimistic(&self, pid: PageId) -> Option<OptimisticRead<'_>> {
        let entry = self.table.entry(pid);
        let seen = entry.version.load(Ordering::Acquire);
        if !seen.is_multiple_of(2) {
            return None;
        }
        let location = latch::decode(entry.word.load(Ordering::Relaxed));
        let block = match location {
            Location::Mini(addr) => {
                // The header and the first metas, loaded together rather than one after the
                // other: the header tells how many metas there are only once it arrives.
                self.ring.prefetch(addr.0 * 8, EARLY_PREFETCH);
                self.peek_block(addr.0 * 8, pid)
            }
            Location::Disk(_) => None,
        };
        Some(OptimisticRead {
            pool: self,
            pid,
            version: &entry.version,
            seen,
            location,
            block,
        })
    }

    /// Starts loading `pid`'s mapping entry: a hint for a batch that reads many pages, so
    /// their entries' misses overlap instead of each waiting in turn. Stores nothing.
    pub(crate) fn prefetch_entry(&self, pid: PageId) {
        crate::node::prefetch(std::ptr::from_ref(self.table.entry(pid)).cast());
    }

    /// Starts loading the header line of `pid`'s mini-page, if its entry names one: the
    /// second step of a batch's hints, once [`BufferPool::prefetch_entry`] brought the entry
    /// in. The header line alone: the batch's next step reads each header with
    /// [`BufferPool::read_optimistic`], which requests the block's first bytes itself.
    /// Stores nothing; a location that is stale by the time the read comes costs one wasted
    /// hint.
    pub(crate) fn prefetch_header(&self, pid: PageId) {
        let word = self.table.entry(pid).word.load(Ordering::Relaxed);
        if let Location::Mini(addr) = latch::decode(word) {
            self.ring.prefetch(addr.0 * 8, 8);
        }
    }

    /// The block at `phys` if its header says `pid` maps it and it fits the ring: its
    /// offset and payload size. Anything else means the page changed since its location was
    /// read (validation would fail).
    fn peek_block(&self, phys: u64, pid: PageId) -> Option<(u64, usize)> {
        if phys >= self.ring.size() {
            return None;
        }
        let h = self.ring.header(phys).load(Ordering::Acquire);
        let total = header::total(h);
        let fits = total > 8 && phys + total <= self.ring.size();
        (header::state(h) == header::READY && header::owner(h) == pid && fits)
            .then_some((phys, total as usize - 8))
    }
}

impl<'a> OptimisticRead<'a> {
    /// Where the page was when the read began.
    pub(crate) fn location(&self) -> Location {
        self.location
    }

    /// The mini-page's block, if the page had one whose header looked right.
    pub(crate) fn block(&self) -> Option<BlockView<'a>> {
        let (phys, len) = self.block?;
        Some(BlockView {
            payload: self.pool.ring.payload(phys).cast_const(),
            len,
            _pool: PhantomData,
        })
    }

    /// The page's write lock, if nobody holds it now and no writer held it since the read
    /// began: then the page still holds what the read saw, and the caller may change it, as
    /// a sole reader may upgrade its read lock. Best effort: `None` otherwise.
    pub(crate) fn try_upgrade(&self) -> Option<WriteGuard<'a>> {
        let word = self.pool.table.word(self.pid);
        if !latch::try_lock_exclusive(word) {
            return None;
        }
        // Under the lock no writer can begin; one that ended since the read began left the
        // version past `seen` (its release is ordered before our acquire of the lock).
        if self.version.load(Ordering::Relaxed) != self.seen {
            latch::unlock_exclusive(word);
            return None;
        }
        Some(WriteGuard::locked(self.pool, self.pid))
    }

    /// Whether no writer held the page since the read began: then the location and every
    /// word copied are what the page held at one instant.
    pub(crate) fn validate(&self) -> bool {
        // Keeps the copy's loads before the version's: a writer's store seen by the copy
        // means its odd version is seen here.
        fence(Ordering::Acquire);
        self.version.load(Ordering::Relaxed) == self.seen
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    fn mini_page(pool: &BufferPool, fill: u8) -> PageId {
        let mut w = pool.insert_page(Location::Disk(7)).unwrap();
        let mut block = pool.alloc(256, w.page_id()).unwrap();
        block.bytes_mut().fill(fill);
        drop(w.set_mini(block));
        w.page_id()
    }

    fn entry_words(pool: &BufferPool, pid: PageId) -> (u64, u64) {
        let e = pool.table.entry(pid);
        (
            e.word.load(Ordering::Relaxed),
            e.version.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn a_quiet_page_reads_whole_and_stores_nothing() {
        let pool = BufferPool::new(1 << 20, 10).unwrap();
        let pid = mini_page(&pool, 0xAB);
        let before = entry_words(&pool, pid);
        for _ in 0..3 {
            let read = pool.read_optimistic(pid).unwrap();
            assert!(matches!(read.location(), Location::Mini(_)));
            let block = read.block().unwrap();
            let words = block.len() / 8;
            assert!(words >= 256 / 8);
            for i in 0..words {
                assert_eq!(block.load_word(i), u64::from_ne_bytes([0xAB; 8]));
            }
            assert_eq!(block.load_word(words), 0, "past the block");
            assert!(read.validate());
        }
        assert_eq!(entry_words(&pool, pid), before, "reads changed the entry");
    }

    #[test]
    fn batch_hints_store_nothing() {
        let pool = BufferPool::new(1 << 20, 10).unwrap();
        let mini = mini_page(&pool, 0x11);
        let disk = pool.insert_page(Location::Disk(9)).unwrap().page_id();
        let before = [entry_words(&pool, mini), entry_words(&pool, disk)];
        for pid in [mini, disk] {
            pool.prefetch_entry(pid);
            pool.prefetch_header(pid);
        }
        assert_eq!([entry_words(&pool, mini), entry_words(&pool, disk)], before);
        let read = pool.read_optimistic(mini).unwrap();
        assert!(read.validate(), "hints ended no read");
    }

    #[test]
    fn copies_are_clamped_to_the_block() {
        let pool = BufferPool::new(1 << 20, 10).unwrap();
        let pid = mini_page(&pool, 0x3C);
        let read = pool.read_optimistic(pid).unwrap();
        let block = read.block().unwrap();
        let len = block.len();
        let mut out = vec![1];
        block.copy_bytes(3, 10, &mut out);
        assert_eq!(
            out,
            [1, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C]
        );
        block.copy_bytes(len - 2, 100, &mut out);
        assert_eq!(out.len(), 13, "past the end is cut");
        block.copy_bytes(len + 5, 1, &mut out);
        block.copy_bytes(usize::MAX, usize::MAX, &mut out);
        assert_eq!(out.len(), 13);
        assert!(read.validate());
    }

    #[test]
    fn any_write_lock_fails_a_read_begun_before_it() {
        let pool = BufferPool::new(1 << 20, 10).unwrap();
        let pid = mini_page(&pool, 1);
        let read = pool.read_optimistic(pid).unwrap();
        drop(pool.write(pid));
        assert!(!read.validate(), "a write lock taken and released");

        let read = pool.read_optimistic(pid).unwrap();
        let r = pool.read(pid);
        drop(r.try_upgrade().ok().unwrap().downgrade());
        assert!(!read.validate(), "an upgrade and a downgrade");

        let w = pool.write(pid);
        assert!(pool.read_optimistic(pid).is_none(), "a writer holds it");
        drop(w);
        let read = pool.read_optimistic(pid).unwrap();
        drop(pool.read(pid));
        assert!(read.validate(), "a read lock is no write");

        // An upgrade succeeds only while nothing changed, and is itself a write.
        let read = pool.read_optimistic(pid).unwrap();
        let r = pool.read(pid);
        assert!(read.try_upgrade().is_none(), "a reader holds it");
        drop(r);
        let w = read.try_upgrade().expect("quiet page");
        assert!(read.try_upgrade().is_none(), "a writer holds it");
        drop(w);
        assert!(!read.validate());
        assert!(read.try_upgrade().is_none(), "a write happened since");
        let read = pool.read_optimistic(pid).unwrap();
        assert!(read.try_upgrade().is_some());
    }

    #[test]
    fn a_detached_block_is_not_read_as_the_page() {
        let pool = BufferPool::new(1 << 20, 10).unwrap();
        let pid = mini_page(&pool, 2);
        let read = pool.read_optimistic(pid).unwrap();
        let mut w = pool.write(pid);
        drop(w.set_location_disk(9));
        drop(w);
        assert!(!read.validate());
        let read = pool.read_optimistic(pid).unwrap();
        assert_eq!(read.location(), Location::Disk(9));
        assert!(read.block().is_none());
        assert!(read.validate());
    }
}
