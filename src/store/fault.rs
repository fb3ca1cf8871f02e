//! [`FaultStore`]: the page store on an emulated disk with a volatile write cache, for
//! fault-injection tests. It runs the same metadata code as the file store (superblocks,
//! free-list chains), so a crash image is recovered exactly as a reboot would.
//!
//! Faults, each armed relative to now and counted in disk-level operations (every page
//! write, the store's own superblock and free-list pages included, and every flush):
//! - [`fail_nth_write`](FaultStore::fail_nth_write) / [`fail_nth_sync`](FaultStore::fail_nth_sync):
//!   that one operation returns `EIO` (a failed write changes nothing; a failed flush leaves
//!   the cache unflushed);
//! - [`power_cut_at_write`](FaultStore::power_cut_at_write): that write and every later
//!   one are silently dropped and flushes do nothing; [`crash_image`](FaultStore::crash_image)
//!   then shows what survived: exactly the writes followed by a successful flush (plus, for
//!   a torn cut, the first half of the cut write);
//! - [`flip_bit_on_read`](FaultStore::flip_bit_on_read): the next read of a page returns it
//!   with one bit flipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::disk::{self, Disk};
use super::paged::PagedStore;
use super::{PageBuf, PageNo, PageStore, StoreStats};
use crate::error::{Error, Result};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};

/// The name used for the emulated disk in errors.
const FAULT_PATH: &str = ":fault:";

/// Everything the emulated disk holds and the faults armed on it.
#[derive(Debug, Default)]
struct DiskState {
    /// What survives a power cut: the image as of the last successful flush.
    durable: Vec<u8>,
    /// Writes since then, by byte offset (every write is one page).
    cache: HashMap<u64, Vec<u8>>,
    /// Page writes so far.
    writes: u64,
    /// Flushes so far.
    syncs: u64,
    /// The write (by count) that fails with EIO.
    fail_write_at: Option<u64>,
    /// The flush (by count) that fails with EIO.
    fail_sync_at: Option<u64>,
    /// The write (by count) that succeeds but never reaches the disk (a lost write).
    lose_write_at: Option<u64>,
    /// The write (by count) at which power is cut, and whether that write tears.
    cut_at: Option<(u64, bool)>,
    /// Power is off: writes are dropped, flushes do nothing.
    powered_off: bool,
    /// Pending bit flips: page number → bit index.
    flips: HashMap<PageNo, usize>,
    /// How long each call that writes pages takes before they land (tests that race
    /// other threads against a write in flight).
    write_delay: std::time::Duration,
}

/// An emulated disk of `page_size`-byte pages.
#[derive(Debug)]
pub(crate) struct FaultDisk {
    /// Bytes per page (every write is one page).
    page_size: usize,
    /// Contents and faults.
    state: Mutex<DiskState>,
    /// Name for errors.
    path: PathBuf,
}

/// The error an injected fault returns.
fn eio() -> Error {
    Error::io(FAULT_PATH, crate::sys::injected_fault())
}

impl DiskState {
    /// Copies `buf.len()` bytes at `offset` as a read would see them: the durable image
    /// (zeros past its end) overlaid with cached writes.
    fn read_at(&self, page_size: usize, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.durable.get(offset as usize + i).copied().unwrap_or(0);
        }
        let mut at = offset / page_size as u64 * page_size as u64;
        while at < end {
            if let Some(page) = self.cache.get(&at) {
                let (from, to) = (at.max(offset), (at + page.len() as u64).min(end));
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&page[(from - at) as usize..(to - at) as usize]);
                }
            }
            at += page_size as u64;
        }
    }

    /// Writes `bytes` at `offset` into the durable image, growing it.
    fn persist(&mut self, offset: u64, bytes: &[u8]) {
        let (from, to) = (offset as usize, offset as usize + bytes.len());
        if self.durable.len() < to {
            self.durable.resize(to, 0);
        }
        self.durable[from..to].copy_from_slice(bytes);
    }
}

impl FaultDisk {
    /// A disk holding `durable` and nothing else.
    fn with_image(page_size: usize, durable: Vec<u8>) -> FaultDisk {
        FaultDisk {
            page_size,
            state: Mutex::new(DiskState {
                durable,
                ..DiskState::default()
            }),
            path: PathBuf::from(FAULT_PATH),
        }
    }

    /// Byte offset of request `page` with a `len`-byte buffer.
    fn offset(page: PageNo, len: usize) -> Result<u64> {
        disk::offset(page, len)
            .filter(|&o| o <= u64::from(u32::MAX) * 4096)
            .ok_or_else(|| {
                Error::corruption(FAULT_PATH, Some(page), "page beyond the emulated disk")
            })
    }
}

impl Disk for Arc<FaultDisk> {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_pages(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        let mut state = self.state.lock();
        for (&page, buf) in pages.iter().zip(bufs.iter_mut()) {
            state.read_at(self.page_size, FaultDisk::offset(page, buf.len())?, buf);
            if buf.len() == self.page_size {
                if let Some(bit) = state.flips.remove(&page) {
                    let bit = bit % (buf.len() * 8);
                    buf[bit / 8] ^= 1 << (bit % 8);
                }
            }
        }
        Ok(())
    }

    fn write_pages(&self, pages: &[PageNo], bufs: &[PageBuf]) -> Result<()> {
        let delay = self.state.lock().write_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = self.state.lock();
        for (&page, buf) in pages.iter().zip(bufs) {
            let offset = FaultDisk::offset(page, buf.len())?;
            state.writes += 1;
            let n = state.writes;
            if state.fail_write_at == Some(n) {
                state.fail_write_at = None;
                return Err(eio());
            }
            if state.lose_write_at == Some(n) {
                state.lose_write_at = None;
                continue;
            }
            if let Some((at, torn)) = state.cut_at {
                if n == at {
                    state.powered_off = true;
                    if torn {
                        // The power failed mid-transfer: the first half reached the medium.
                        state.persist(offset, &buf[..buf.len() / 2]);
                    }
                }
            }
            if !state.powered_off {
                state.cache.insert(offset, buf.to_vec());
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut state = self.state.lock();
        state.syncs += 1;
        if state.fail_sync_at == Some(state.syncs) {
            state.fail_sync_at = None;
            // As Linux does after a failed writeback: the dirty data is dropped (the pages
            // are marked clean), so a later flush has nothing left to write.
            state.cache.clear();
            return Err(eio());
        }
        if !state.powered_off {
            let cache = std::mem::take(&mut state.cache);
            for (offset, bytes) in cache {
                state.persist(offset, &bytes);
            }
        }
        Ok(())
    }
}

/// A page store on an emulated disk with fault injection. Share it with `Arc`.
#[derive(Debug)]
pub(crate) struct FaultStore {
    /// The emulated disk, shared with `store`.
    disk: Arc<FaultDisk>,
    /// The store, or why the disk image could not be opened (no valid superblock).
    store: std::result::Result<PagedStore<Arc<FaultDisk>>, (Option<PageNo>, &'static str)>,
    /// Pages written by callers one at a time (`write`), and in batches (`write_batch`).
    written: [AtomicU64; 2],
}

impl FaultStore {
    /// A new, empty store of `page_size`-byte pages, its first superblock already durable.
    pub(crate) fn new(page_size: usize) -> FaultStore {
        let disk = Arc::new(FaultDisk::with_image(page_size, Vec::new()));
        let store = PagedStore::format(disk.clone(), page_size).map_err(|e| unopenable(&e));
        FaultStore::with(disk, store)
    }

    /// What a reboot would find: a new store opened from exactly the durable state. If that
    /// state has no valid superblock, every operation of the new store returns
    /// `Error::Corruption` (as opening a damaged file would); see
    /// [`open_error`](Self::open_error).
    pub(crate) fn crash_image(&self) -> FaultStore {
        let durable = self.disk.state.lock().durable.clone();
        let disk = Arc::new(FaultDisk::with_image(self.disk.page_size, durable));
        let store =
            PagedStore::mount(disk.clone(), self.disk.page_size).map_err(|e| unopenable(&e));
        FaultStore::with(disk, store)
    }

    /// Why this store's disk image could not be opened, if it could not.
    #[cfg(test)]
    pub(crate) fn open_error(&self) -> Option<Error> {
        self.store
            .as_ref()
            .err()
            .map(|&(page, reason)| Error::corruption(FAULT_PATH, page, reason))
    }

    /// The `n`-th page write from now (1 = the next) fails with EIO, once.
    #[cfg(test)]
    pub(crate) fn fail_nth_write(&self, n: u64) {
        let mut state = self.disk.state.lock();
        state.fail_write_at = Some(state.writes + n.max(1));
    }

    /// The `n`-th page write from now (1 = the next) succeeds but never reaches the disk,
    /// once: reads of that page go on returning what it held before.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn lose_nth_write(&self, n: u64) {
        let mut state = self.disk.state.lock();
        state.lose_write_at = Some(state.writes + n.max(1));
    }

    /// The `n`-th flush from now (1 = the next) fails with EIO, once.
    #[cfg(test)]
    pub(crate) fn fail_nth_sync(&self, n: u64) {
        let mut state = self.disk.state.lock();
        state.fail_sync_at = Some(state.syncs + n.max(1));
    }

    /// Power fails at the `n`-th page write from now: it and every later write are dropped
    /// and flushes do nothing. With `torn`, the first half of that write reaches the medium.
    pub(crate) fn power_cut_at_write(&self, n: u64, torn: bool) {
        let mut state = self.disk.state.lock();
        state.cut_at = Some((state.writes + n.max(1), torn));
    }

    /// Every later call that writes pages sleeps `delay` first (without holding the disk),
    /// as a device would keep them in flight.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn slow_writes(&self, delay: std::time::Duration) {
        self.disk.state.lock().write_delay = delay;
    }

    /// Whether a power cut has happened.
    pub(crate) fn is_powered_off(&self) -> bool {
        self.disk.state.lock().powered_off
    }

    /// The next read of `page` returns it with bit `bit` (modulo the page's bits) flipped.
    #[cfg(test)]
    pub(crate) fn flip_bit_on_read(&self, page: PageNo, bit: usize) {
        self.disk.state.lock().flips.insert(page, bit);
    }

    /// A store of `disk`, no page written through it yet.
    fn with(
        disk: Arc<FaultDisk>,
        store: std::result::Result<PagedStore<Arc<FaultDisk>>, (Option<PageNo>, &'static str)>,
    ) -> FaultStore {
        FaultStore {
            disk,
            store,
            written: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Pages callers wrote (the store's own superblocks not counted): (one at a time with
    /// `write`, in batches with `write_batch`).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn pages_written(&self) -> (u64, u64) {
        let [alone, batched] = &self.written;
        (
            alone.load(Ordering::Relaxed),
            batched.load(Ordering::Relaxed),
        )
    }

    /// Page writes the disk has seen (the store's own included).
    pub(crate) fn disk_writes(&self) -> u64 {
        self.disk.state.lock().writes
    }

    /// Flushes so far (counted like `fail_nth_sync` counts them).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn disk_syncs(&self) -> u64 {
        self.disk.state.lock().syncs
    }

    /// Changes the bytes of `page` as reads see them, bypassing checksums; the change is
    /// durable if the page is (corruption tests).
    #[cfg(test)]
    pub(crate) fn modify_page(&self, page: PageNo, f: impl FnOnce(&mut [u8])) {
        let size = self.disk.page_size;
        let offset = page * size as u64;
        let mut state = self.disk.state.lock();
        let mut bytes = vec![0; size];
        state.read_at(size, offset, &mut bytes);
        f(&mut bytes);
        if let Some(cached) = state.cache.get_mut(&offset) {
            *cached = bytes;
        } else {
            state.persist(offset, &bytes);
        }
    }

    /// The store, or the error that kept it from opening.
    fn inner(&self) -> Result<&PagedStore<Arc<FaultDisk>>> {
        self.store
            .as_ref()
            .map_err(|&(page, reason)| Error::corruption(FAULT_PATH, page, reason))
    }
}

/// Keeps what a failed open said, so the error can be rebuilt on every later call.
fn unopenable(e: &Error) -> (Option<PageNo>, &'static str) {
    match e {
        Error::Corruption { page, reason, .. } => (*page, reason),
        _ => (None, "the emulated disk could not be opened"),
    }
}

impl PageStore for FaultStore {
    fn page_size(&self) -> usize {
        self.disk.page_size
    }
    fn read(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.inner()?.read(page, buf)
    }
    fn write(&self, page: PageNo, buf: &mut PageBuf) -> Result<()> {
        self.written[0].fetch_add(1, Ordering::Relaxed);
        self.inner()?.write(page, buf)
    }
    fn read_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        self.inner()?.read_batch(pages, bufs)
    }
    fn read_streamed(
        &self,
        bufs: &mut [PageBuf],
        next: &mut dyn FnMut() -> Option<PageNo>,
    ) -> Result<usize> {
        self.inner()?.read_streamed(bufs, next)
    }
    fn write_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        self.written[1].fetch_add(pages.len() as u64, Ordering::Relaxed);
        self.inner()?.write_batch(pages, bufs)
    }
    fn sync(&self) -> Result<()> {
        self.inner()?.sync()
    }
    fn allocate(&self) -> Result<PageNo> {
        self.inner()?.allocate()
    }
    fn free(&self, page: PageNo) -> Result<()> {
        self.inner()?.free(page)
    }
    fn set_free_pages(&self, free: Vec<PageNo>) -> Result<()> {
        self.inner()?.set_free_pages(free)
    }
    fn stats(&self) -> StoreStats {
        self.inner()
            .map(super::PageStore::stats)
            .unwrap_or_default()
    }
}
