//! [`PagedStore`]: checksums, allocation and superblocks over any [`Disk`]. `FileStore` and
//! `FaultStore` are this type over a file and over an emulated disk.

use std::cell::RefCell;
use std::io;
use std::path::Path;

use super::alloc::{Allocator, FreeSet};
use super::disk::Disk;
use super::page::{self, Kind};
use super::superblock::{self, Superblock};
use super::{PageBuf, PageNo, PageStore, StoreStats, FIRST_DATA_PAGE};
use crate::config::{MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Mutex, Ordering};

/// The allocation state and which superblock slot comes next.
#[derive(Debug)]
struct Meta {
    /// Free list and page count.
    alloc: Allocator,
    /// Sequence number of the newest durable superblock (0 before the first).
    seq: u64,
    /// Free-list chain pages owned by each superblock slot.
    chains: [Vec<PageNo>; 2],
    /// The free pages of the newest durable superblock: the only existing pages the store
    /// may take for its own chains.
    durable_free: FreeSet,
}

/// A page store over the medium `D`.
#[derive(Debug)]
pub(crate) struct PagedStore<D> {
    /// Where the pages live.
    disk: D,
    /// Bytes per page.
    page_size: usize,
    /// Allocation state; `allocate`, `free` and `sync` take it briefly.
    meta: Mutex<Meta>,
    /// Serialises `sync` calls (each writes one superblock slot).
    sync_lock: Mutex<()>,
    /// Copy of the page count, so reads and writes check bounds without the mutex.
    page_count: AtomicU64,
    /// Pages read by callers.
    reads: AtomicU64,
    /// Pages written by callers.
    writes: AtomicU64,
    /// Calls to `sync`.
    syncs: AtomicU64,
    /// Set once a flush of the medium failed. The kernel may have dropped the dirty pages
    /// that flush was to write and marked them clean, so no later flush can vouch for them:
    /// every later `sync` fails until the store is opened again and recovery re-reads what
    /// is really on the medium.
    sync_failed: std::sync::atomic::AtomicBool,
}

/// Checks that `page_size` is a power of two from 4 KiB to 64 KiB.
pub(super) fn check_page_size(page_size: usize) -> Result<()> {
    if page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            reason: "page size must be a power of two from 4 KiB to 64 KiB",
        })
    }
}

/// Checks a caller's access to `page` with a buffer of `len` bytes in a store of
/// `page_count` pages of `page_size` bytes.
pub(super) fn check_access(
    path: &Path,
    page_size: usize,
    page_count: u64,
    page: PageNo,
    len: usize,
) -> Result<()> {
    if len != page_size {
        return Err(Error::InvalidConfig {
            reason: "page buffer length differs from the page size",
        });
    }
    if page < FIRST_DATA_PAGE {
        return Err(Error::corruption(
            path,
            Some(page),
            "page is a superblock slot, reserved by the store",
        ));
    }
    if page >= page_count {
        return Err(Error::corruption(
            path,
            Some(page),
            "page is beyond the end of the file",
        ));
    }
    Ok(())
}

impl<D: Disk> PagedStore<D> {
    /// Flushes the medium; a failure is sticky (`sync_failed`).
    fn flush_disk(&self) -> Result<()> {
        let result = self.disk.flush();
        if result.is_err() {
            self.sync_failed.store(true, Ordering::Release);
        }
        result
    }

    /// Writes this slot's free-list chain and superblock, flushing before and after the
    /// superblock (`PageStore::sync` without its sticky-failure check).
    fn sync_unchecked(&self) -> Result<()> {
        let (seq, page_count, free, chain) = {
            let mut meta = self.meta.lock();
            let seq = meta.seq + 1;
            let slot = (seq % 2) as usize;
            // Growing the chain takes pages off the free list, so re-check until it fits.
            while meta.chains[slot].len()
                < superblock::chain_pages_needed(self.page_size, meta.alloc.free_list().len())
            {
                let Meta {
                    alloc,
                    durable_free,
                    ..
                } = &mut *meta;
                let page = alloc
                    .allocate_owned(durable_free)
                    .ok_or_else(|| self.file_too_large())?;
                meta.chains[slot].push(page);
            }
            self.page_count
                .store(meta.alloc.page_count(), Ordering::Release);
            let free = meta.alloc.free_list().to_vec();
            (
                seq,
                meta.alloc.page_count(),
                free,
                meta.chains[slot].clone(),
            )
        };
        let (sb, chain_bufs) = superblock::encode(self.page_size, seq, page_count, &free, &chain);
        // Data and this slot's chain first; the superblock that makes them current last, so
        // a crash at any point leaves one complete, valid slot.
        self.disk.write_pages(&chain, &chain_bufs)?;
        self.flush_disk()?;
        self.disk
            .write_pages(&[seq % 2], std::slice::from_ref(&sb))?;
        self.flush_disk()?;
        let durable_free = FreeSet::of(&free);
        let mut meta = self.meta.lock();
        meta.seq = seq;
        meta.durable_free = durable_free;
        Ok(())
    }

    /// A new, empty store on `disk`: writes and syncs the first superblock.
    pub(super) fn format(disk: D, page_size: usize) -> Result<Self> {
        let meta = Meta {
            alloc: Allocator::new(FIRST_DATA_PAGE),
            seq: 0,
            chains: [vec![], vec![]],
            durable_free: FreeSet::default(),
        };
        let store = Self::with_meta(disk, page_size, meta);
        store.sync()?;
        store.syncs.store(0, Ordering::Relaxed);
        Ok(store)
    }

    /// Opens the store on `disk` from its newest valid superblock.
    pub(super) fn mount(disk: D, page_size: usize) -> Result<Self> {
        let loaded = superblock::load(&disk, page_size)?;
        let Superblock {
            seq,
            page_count,
            free,
            chain,
        } = loaded.newest;
        let mut alloc = Allocator::new(page_count);
        let durable_free = FreeSet::of(&free);
        // Both chains are the store's. Should the newest free list name a page of the older
        // slot's chain (it cannot, unless damaged), `set_free` skips it: a leak, never a
        // page handed out twice.
        let other: Vec<PageNo> = loaded
            .other_chain
            .into_iter()
            .filter(|&p| p < page_count)
            .collect();
        for &p in chain.iter().chain(&other) {
            alloc.mark_owned(p);
        }
        alloc
            .set_free(free)
            .map_err(|(p, reason)| Error::corruption(disk.path(), Some(p), reason))?;
        let mut chains = [Vec::new(), Vec::new()];
        chains[(seq % 2) as usize] = chain;
        chains[((seq + 1) % 2) as usize] = other;
        Ok(Self::with_meta(
            disk,
            page_size,
            Meta {
                alloc,
                seq,
                chains,
                durable_free,
            },
        ))
    }

    /// Assembles a store around its parts.
    fn with_meta(disk: D, page_size: usize, meta: Meta) -> Self {
        PagedStore {
            disk,
            page_size,
            page_count: AtomicU64::new(meta.alloc.page_count()),
            meta: Mutex::new(meta),
            sync_lock: Mutex::new(()),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            sync_failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The medium.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(super) fn disk(&self) -> &D {
        &self.disk
    }

    /// Checks that `page` is a data page inside the file and `len` is the page size.
    fn check(&self, page: PageNo, len: usize) -> Result<()> {
        let count = self.page_count.load(Ordering::Acquire);
        check_access(self.disk.path(), self.page_size, count, page, len)
    }

    /// A corruption error about `page` of this store's file.
    fn corrupt(&self, page: PageNo, reason: &'static str) -> Error {
        Error::corruption(self.disk.path(), Some(page), reason)
    }

    /// An error for a file that reached the largest addressable page count.
    fn file_too_large(&self) -> Error {
        Error::io(
            self.disk.path(),
            io::Error::from(io::ErrorKind::FileTooLarge),
        )
    }

    /// Verifies the data page `pages[i]`, read into `buf`.
    fn verify(&self, pages: &[PageNo], i: usize, buf: &[u8]) -> Result<()> {
        let p = pages.get(i).copied().ok_or(Error::InvalidConfig {
            reason: "read_batch completion for a request it did not make",
        })?;
        page::verify(p, Kind::Data, buf).map_err(|reason| self.corrupt(p, reason))
    }
}

impl<D: Disk> PageStore for PagedStore<D> {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn read(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.check(page, buf.len())?;
        self.disk.read_pages(&[page], std::slice::from_mut(buf))?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        page::verify(page, Kind::Data, buf).map_err(|reason| self.corrupt(page, reason))
    }

    fn write(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.check(page, buf.len())?;
        page::stamp(page, Kind::Data, buf);
        self.disk.write_pages(&[page], std::slice::from_ref(buf))?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn read_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        if pages.len() != bufs.len() {
            return Err(Error::InvalidConfig {
                reason: "read_batch needs one buffer per page",
            });
        }
        for (&p, buf) in pages.iter().zip(bufs.iter()) {
            self.check(p, buf.len())?;
        }
        // Each page is verified when its read completes (with io_uring, a batch longer than
        // the ring verifies its first pages while its last are still in flight).
        let result = self
            .disk
            .read_pages_checked(pages, bufs, &mut |i, buf| self.verify(pages, i, buf));
        // Counted like `read`: pages that came off the medium, verified or not.
        if !matches!(result, Err(Error::Io { .. })) {
            self.reads.fetch_add(pages.len() as u64, Ordering::Relaxed);
        }
        result
    }

    fn read_streamed(
        &self,
        bufs: &mut [PageBuf],
        next: &mut dyn FnMut() -> Option<PageNo>,
    ) -> Result<usize> {
        if bufs.iter().any(|b| b.len() != self.page_size) {
            return Err(Error::InvalidConfig {
                reason: "read_streamed needs buffers of the store's page size",
            });
        }
        // The pages named so far, for the checks; a page this store refuses ends the
        // stream, and its error is the call's.
        let named = RefCell::new(Vec::with_capacity(bufs.len()));
        let mut refused = None;
        let result = self.disk.read_pages_streamed(
            bufs,
            &mut || {
                let p = next()?;
                if let Err(e) = self.check(p, self.page_size) {
                    refused = Some(e);
                    return None;
                }
                named.borrow_mut().push(p);
                Some(p)
            },
            &mut |i, buf| self.verify(&named.borrow(), i, buf),
        );
        let result = match refused {
            Some(e) => Err(e),
            None => result,
        };
        // Counted like `read`: pages that came off the medium, verified or not.
        if !matches!(result, Err(Error::Io { .. })) {
            let read = named.borrow().len();
            self.reads.fetch_add(read as u64, Ordering::Relaxed);
        }
        result
    }

    fn write_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        if pages.len() != bufs.len() {
            return Err(Error::InvalidConfig {
                reason: "write_batch needs one buffer per page",
            });
        }
        for (&p, buf) in pages.iter().zip(bufs.iter_mut()) {
            self.check(p, buf.len())?;
            page::stamp(p, Kind::Data, buf);
        }
        self.disk.write_pages(pages, bufs)?;
        self.writes.fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let _serial = self.sync_lock.lock();
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if self.sync_failed.load(Ordering::Acquire) {
            return Err(Error::io(
                self.disk.path(),
                io::Error::other("an earlier fdatasync of the data file failed; reopen the tree"),
            ));
        }
        self.sync_unchecked()
    }

    fn allocate(&self) -> Result<PageNo> {
        let mut meta = self.meta.lock();
        let page = meta.alloc.allocate().ok_or_else(|| self.file_too_large())?;
        self.page_count
            .store(meta.alloc.page_count(), Ordering::Release);
        Ok(page)
    }

    fn free(&self, page: PageNo) -> Result<()> {
        self.meta
            .lock()
            .alloc
            .free(page)
            .map_err(|reason| self.corrupt(page, reason))
    }

    fn set_free_pages(&self, free: Vec<PageNo>) -> Result<()> {
        self.meta
            .lock()
            .alloc
            .set_free(free)
            .map_err(|(p, reason)| self.corrupt(p, reason))
    }

    fn stats(&self) -> StoreStats {
        let meta = self.meta.lock();
        StoreStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            allocated_pages: meta.alloc.allocated(),
            free_pages: meta.alloc.free_list().len() as u64,
            file_pages: meta.alloc.page_count(),
        }
    }
}
