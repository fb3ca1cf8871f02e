//! [`MemStore`]: pages in memory, for in-memory trees and tests. Same checksums, bounds and
//! allocation rules as the file store, so the shared test suite holds for it too.

use std::path::Path;

use super::alloc::Allocator;
use super::page::{self, Kind};
use super::paged::check_access;
use super::{PageBuf, PageNo, PageStore, StoreStats, FIRST_DATA_PAGE};
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Mutex, Ordering};

/// Lock shards: page `p` lives in shard `p % SHARDS`, so threads on different pages rarely
/// contend and a read holds a lock only for one page copy.
const SHARDS: usize = 64;

/// The name used for the store's "file" in errors.
const MEM_PATH: &str = ":memory:";

/// One lock shard: its pages' bytes by index, `None` until written.
type Shard = Mutex<Vec<Option<Box<[u8]>>>>;

/// A page store held in memory.
#[derive(Debug)]
pub(crate) struct MemStore {
    /// Bytes per page.
    page_size: usize,
    /// Page `p` is `shards[p % SHARDS][p / SHARDS]`; `None` until written.
    shards: Box<[Shard]>,
    /// Free list and page count.
    alloc: Mutex<Allocator>,
    /// Copy of the page count for lock-free bounds checks.
    page_count: AtomicU64,
    /// Pages read by callers.
    reads: AtomicU64,
    /// Pages written by callers.
    writes: AtomicU64,
    /// Calls to `sync`.
    syncs: AtomicU64,
}

impl MemStore {
    /// An empty store of `page_size`-byte pages.
    pub(crate) fn new(page_size: usize) -> MemStore {
        MemStore {
            page_size,
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            alloc: Mutex::new(Allocator::new(FIRST_DATA_PAGE)),
            page_count: AtomicU64::new(FIRST_DATA_PAGE),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        }
    }

    /// Checks a caller's access to `page` with a `len`-byte buffer.
    fn check(&self, page: PageNo, len: usize) -> Result<()> {
        let count = self.page_count.load(Ordering::Acquire);
        check_access(Path::new(MEM_PATH), self.page_size, count, page, len)
    }

    /// Runs `f` on the stored bytes of `page` (`None` if never written).
    fn with_page<R>(&self, page: PageNo, f: impl FnOnce(&mut Option<Box<[u8]>>) -> R) -> R {
        let mut shard = self.shards[(page % SHARDS as u64) as usize].lock();
        let index = (page / SHARDS as u64) as usize;
        if index >= shard.len() {
            shard.resize(index + 1, None);
        }
        f(&mut shard[index])
    }

    /// Changes the stored bytes of `page` behind the checksum's back (corruption tests).
    #[cfg(test)]
    pub(crate) fn raw_page(&self, page: PageNo, f: impl FnOnce(&mut [u8])) {
        let size = self.page_size;
        self.with_page(page, |slot| {
            f(slot.get_or_insert_with(|| vec![0; size].into()));
        });
    }

    /// Reads and verifies one page.
    fn read_one(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.check(page, buf.len())?;
        self.with_page(page, |slot| match slot {
            Some(bytes) => buf.copy_from_slice(bytes),
            None => buf.fill(0),
        });
        self.reads.fetch_add(1, Ordering::Relaxed);
        page::verify(page, Kind::Data, buf)
            .map_err(|reason| Error::corruption(MEM_PATH, Some(page), reason))
    }

    /// Stamps and stores one page.
    fn write_one(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.check(page, buf.len())?;
        page::stamp(page, Kind::Data, buf);
        self.with_page(page, |slot| match slot {
            Some(bytes) => bytes.copy_from_slice(buf),
            None => *slot = Some(buf.to_vec().into_boxed_slice()),
        });
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl PageStore for MemStore {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn read(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.read_one(page, buf)
    }

    fn write(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.write_one(page, buf)
    }

    fn read_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        if pages.len() != bufs.len() {
            return Err(Error::InvalidConfig {
                reason: "read_batch needs one buffer per page",
            });
        }
        pages
            .iter()
            .zip(bufs)
            .try_for_each(|(&p, buf)| self.read_one(p, buf))
    }

    fn write_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        if pages.len() != bufs.len() {
            return Err(Error::InvalidConfig {
                reason: "write_batch needs one buffer per page",
            });
        }
        pages
            .iter()
            .zip(bufs)
            .try_for_each(|(&p, buf)| self.write_one(p, buf))
    }

    fn sync(&self) -> Result<()> {
        // Memory is as durable as it gets here; the count keeps stats comparable.
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn allocate(&self) -> Result<PageNo> {
        let mut alloc = self.alloc.lock();
        let page = alloc.allocate().ok_or_else(|| {
            Error::io(
                MEM_PATH,
                std::io::Error::from(std::io::ErrorKind::FileTooLarge),
            )
        })?;
        self.page_count.store(alloc.page_count(), Ordering::Release);
        Ok(page)
    }

    fn free(&self, page: PageNo) -> Result<()> {
        let mut alloc = self.alloc.lock();
        alloc
            .free(page)
            .map_err(|reason| Error::corruption(MEM_PATH, Some(page), reason))?;
        // The bytes of a free page are dead; dropping them returns the memory. Still under
        // the allocator lock, so no one can have reallocated and rewritten the page yet.
        self.with_page(page, |slot| *slot = None);
        Ok(())
    }

    fn set_free_pages(&self, free: Vec<PageNo>) -> Result<()> {
        self.alloc
            .lock()
            .set_free(free)
            .map_err(|(p, reason)| Error::corruption(MEM_PATH, Some(p), reason))
    }

    fn stats(&self) -> StoreStats {
        let alloc = self.alloc.lock();
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            allocated_pages: alloc.allocated(),
            free_pages: alloc.free_list().len() as u64,
            file_pages: alloc.page_count(),
        }
    }
}
