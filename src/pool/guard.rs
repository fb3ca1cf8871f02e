//! Page guards: the only way to write a mapped mini-page's bytes, and to read them stably. A
//! guard holds its entry's lock (shared or exclusive); a block is mapped (`READY`) only
//! through an entry, and leaves that state only under the entry's write lock, so a guard's
//! view of the bytes is stable. (Reads without the lock, which must validate what they saw,
//! are in `optimistic.rs`.)

use std::marker::PhantomData;

use super::alloc::{DetachedBlock, NewBlock};
use super::latch;
use super::optimistic;
use super::ring::header;
use super::{BufferPool, Location, PageId};
use crate::sync::{AtomicU64, Ordering};

/// A read lock on one page.
pub(crate) struct ReadGuard<'a> {
    pool: &'a BufferPool,
    pid: PageId,
    word: &'a AtomicU64,
    /// Lock guards stay on the thread that took them (parking is per thread).
    _not_send: PhantomData<*const ()>,
}

/// The write lock on one page. While it lives the page's version is odd (`optimistic.rs`).
pub(crate) struct WriteGuard<'a> {
    pool: &'a BufferPool,
    pid: PageId,
    word: &'a AtomicU64,
    version: &'a AtomicU64,
    /// See `ReadGuard`.
    _not_send: PhantomData<*const ()>,
}

impl BufferPool {
    /// A new mapping entry at `loc` (reusing a removed id when there is one), returned
    /// write-locked. A new entry starts on disk: give it a mini-page with `set_mini` (a block
    /// can only be mapped from its `NewBlock` token).
    ///
    /// `None` when all 2^32 ids are taken. Panics if `loc` is `Location::Mini` or a disk
    /// page above `MAX_DISK_PAGE`: neither can come from a correct tree.
    pub(crate) fn insert_page(&self, loc: Location) -> Option<WriteGuard<'_>> {
        let Location::Disk(page) = loc else {
            panic!("insert_page takes a disk location; map a block with set_mini");
        };
        assert!(
            page <= latch::MAX_DISK_PAGE,
            "disk page {page} does not fit a mapping entry"
        );
        let pid = self.table.take_id()?;
        let mut guard = self.write(pid);
        guard.set_location_raw(loc);
        Some(guard)
    }

    /// Where `pid` is right now, read without taking its lock: a hint that may be stale by
    /// the time it is used (a read ahead checks what it read under the lock later).
    pub(crate) fn location_hint(&self, pid: PageId) -> Location {
        latch::decode(self.table.word(pid).load(Ordering::Acquire))
    }

    /// Read-locks `pid` (bounded spin, then park).
    pub(crate) fn read(&self, pid: PageId) -> ReadGuard<'_> {
        let word = self.table.word(pid);
        latch::lock_shared(word);
        #[cfg(all(test, not(shuttle)))]
        self.read_locks.fetch_add(1, Ordering::Relaxed);
        ReadGuard {
            pool: self,
            pid,
            word,
            _not_send: PhantomData,
        }
    }

    /// Write-locks `pid` (bounded spin, then park).
    pub(crate) fn write(&self, pid: PageId) -> WriteGuard<'_> {
        let word = self.table.word(pid);
        latch::lock_exclusive(word);
        WriteGuard::locked(self, pid)
    }

    /// Write-locks `pid` if nobody holds it.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn try_write(&self, pid: PageId) -> Option<WriteGuard<'_>> {
        let word = self.table.word(pid);
        // `then`, not `then_some`: a guard built eagerly would unlock on drop a lock we failed
        // to take.
        latch::try_lock_exclusive(word).then(|| WriteGuard::locked(self, pid))
    }

    /// The payload of the block at `addr`, `size` from its header.
    ///
    /// # Safety
    /// The block is `READY` and mapped by an entry the caller holds locked.
    unsafe fn mapped_bytes(&self, addr: super::BlockAddr) -> (*mut u8, usize) {
        let phys = addr.0 * 8;
        let total = header::total(self.ring.header(phys).load(Ordering::Acquire));
        (self.ring.payload(phys), total as usize - 8)
    }
}

impl<'a> ReadGuard<'a> {
    /// The page id.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn page_id(&self) -> PageId {
        self.pid
    }

    /// Where the page is (`Disk(REMOVED_PAGE)` if the id was removed).
    pub(crate) fn location(&self) -> Location {
        latch::decode(self.word.load(Ordering::Relaxed))
    }

    /// Whether the id was removed (a stale id from before a merge; retry from the parent).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn is_removed(&self) -> bool {
        self.location() == Location::Disk(latch::REMOVED_PAGE)
    }

    /// The mini-page's bytes, if the page has one.
    pub(crate) fn mini(&self) -> Option<&[u8]> {
        let Location::Mini(addr) = self.location() else {
            return None;
        };
        // SAFETY: the entry maps the block and we hold its read lock: the block stays READY
        // (only a writer detaches it) and nobody writes it (writers need the write lock).
        unsafe {
            let (p, len) = self.pool.mapped_bytes(addr);
            Some(std::slice::from_raw_parts(p, len))
        }
    }

    /// Upgrades to the write lock if this is the only reader; otherwise gives this back.
    pub(crate) fn try_upgrade(self) -> Result<WriteGuard<'a>, ReadGuard<'a>> {
        if latch::try_upgrade(self.word) {
            let guard = WriteGuard::locked(self.pool, self.pid);
            std::mem::forget(self);
            Ok(guard)
        } else {
            Err(self)
        }
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        latch::unlock_shared(self.word);
    }
}

impl<'a> WriteGuard<'a> {
    /// The guard for `pid`, whose write lock the caller just took: starts the write
    /// (odd version) that `Drop` or `downgrade` ends.
    pub(super) fn locked(pool: &'a BufferPool, pid: PageId) -> WriteGuard<'a> {
        let entry = pool.table.entry(pid);
        optimistic::begin_write(&entry.version);
        WriteGuard {
            pool,
            pid,
            word: &entry.word,
            version: &entry.version,
            _not_send: PhantomData,
        }
    }

    /// The page id.
    pub(crate) fn page_id(&self) -> PageId {
        self.pid
    }

    /// Where the page is.
    pub(crate) fn location(&self) -> Location {
        latch::decode(self.word.load(Ordering::Relaxed))
    }

    /// Whether the id was removed.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn is_removed(&self) -> bool {
        self.location() == Location::Disk(latch::REMOVED_PAGE)
    }

    /// The mini-page's bytes, if the page has one.
    pub(crate) fn mini(&self) -> Option<&[u8]> {
        let Location::Mini(addr) = self.location() else {
            return None;
        };
        // SAFETY: mapped by this entry, whose write lock we hold; `&self` excludes `mini_mut`.
        unsafe {
            let (p, len) = self.pool.mapped_bytes(addr);
            Some(std::slice::from_raw_parts(p, len))
        }
    }

    /// The mini-page's bytes, writable, if the page has one.
    pub(crate) fn mini_mut(&mut self) -> Option<&mut [u8]> {
        let Location::Mini(addr) = self.location() else {
            return None;
        };
        // SAFETY: mapped by this entry, whose write lock we hold, so nobody else can reach
        // the block (the evictor takes the same lock first); `&mut self` makes it unique.
        unsafe {
            let (p, len) = self.pool.mapped_bytes(addr);
            Some(std::slice::from_raw_parts_mut(p, len))
        }
    }

    /// Maps the page to `block`; returns the previous mini-page, detached.
    pub(crate) fn set_mini(&mut self, block: NewBlock<'a>) -> Option<DetachedBlock<'a>> {
        let phys = block.phys;
        let addr = block.addr();
        std::mem::forget(block);
        let hdr = self.pool.ring.header(phys);
        set_state(hdr, header::READY, self.pid);
        let old = self.location();
        self.set_location_raw(Location::Mini(addr));
        self.detach(old)
    }

    /// Points the entry at disk page `page`; returns the previous mini-page, detached.
    /// Panics if `page > MAX_DISK_PAGE` (the store never hands such numbers out).
    pub(crate) fn set_location_disk(&mut self, page: u64) -> Option<DetachedBlock<'a>> {
        assert!(
            page <= latch::MAX_DISK_PAGE,
            "disk page {page} does not fit a mapping entry"
        );
        let old = self.location();
        self.set_location_raw(Location::Disk(page));
        self.detach(old)
    }

    /// Frees the page id for reuse. A mini-page still mapped is detached and returned to the
    /// pool first (the caller normally merged it already).
    pub(crate) fn remove(mut self) {
        let old = self.location();
        self.set_location_raw(Location::Disk(latch::REMOVED_PAGE));
        drop(self.detach(old));
        let (table, pid) = (&self.pool.table, self.pid);
        drop(self);
        table.give_back(pid);
    }

    /// Turns the write lock into a read lock without letting a writer in between.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn downgrade(self) -> ReadGuard<'a> {
        optimistic::end_write(self.version);
        latch::downgrade(self.word);
        let guard = ReadGuard {
            pool: self.pool,
            pid: self.pid,
            word: self.word,
            _not_send: PhantomData,
        };
        std::mem::forget(self);
        guard
    }

    /// The pool this guard belongs to.
    pub(super) fn pool(&self) -> &'a BufferPool {
        self.pool
    }

    /// Writes the location field (the write lock is held).
    pub(super) fn set_location_raw(&mut self, loc: Location) {
        latch::set_location(self.word, loc);
    }

    /// Hands out the block `old` pointed at, if any, as a detached token.
    fn detach(&self, old: Location) -> Option<DetachedBlock<'a>> {
        let Location::Mini(addr) = old else {
            return None;
        };
        let phys = addr.0 * 8;
        set_state(self.pool.ring.header(phys), header::DETACHED, self.pid);
        let size = header::total(self.pool.ring.header(phys).load(Ordering::Acquire)) as usize - 8;
        Some(DetachedBlock {
            pool: self.pool,
            phys,
            size,
            _owns: PhantomData,
        })
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        optimistic::end_write(self.version);
        latch::unlock_exclusive(self.word);
    }
}

/// Sets a block header's state and owner, keeping its size and claimed bit.
fn set_state(hdr: &std::sync::atomic::AtomicU64, state: u64, owner: PageId) {
    let mut h = hdr.load(Ordering::Acquire);
    loop {
        let next = header::with_state(h, state, owner);
        match hdr.compare_exchange_weak(h, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => h = now,
        }
    }
}
