//! The page store: the only code that touches a data file.
//!
//! One data file of fixed-size pages (page size `P`, a power of two from 4 KiB to 64 KiB)
//! behind one fallible trait, [`PageStore`], with four implementations: [`FileStore`] over
//! `io_uring` or `pread`/`pwrite` (both with `O_DIRECT` where the file system allows it),
//! [`MemStore`] for in-memory trees and tests, and [`FaultStore`], an emulated disk with a
//! volatile cache for fault-injection tests. The store never sees keys.
//!
//! # Byte layout
//! All integers are little-endian and fixed width.
//!
//! **Every page** (data, superblock and free-list pages alike) starts with an 8-byte header
//! that belongs to the store ([`STORE_RESERVED`]):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | crc32c of the page number (u64 LE, 8 bytes) followed by bytes `8..P` |
//! | 4..6 | page magic `0xBF5E` (u16) |
//! | 6 | page format version, `1` |
//! | 7 | page kind: `1` data, `2` superblock, `3` free-list page |
//!
//! Folding the page number into the checksum makes a page written to (or read from) the
//! wrong place fail verification; the magic makes an all-zero, never-written page fail it.
//!
//! **Pages 0 and 1** are the two superblock slots ([`FIRST_DATA_PAGE`] is 2, so `allocate`
//! never returns them). `sync` writes slot `seq % 2`, alternating, so a torn superblock
//! write leaves the other slot valid; `open` takes the valid slot with the highest `seq`.
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | page header (kind 2) |
//! | 8..16 | magic `b"BFKVSTOR"` |
//! | 16..20 | format version (u32), `1` |
//! | 20..24 | page size in bytes (u32) |
//! | 24..32 | sequence number (u64), +1 per `sync` |
//! | 32..40 | file page count (u64), superblock slots included |
//! | 40..48 | number of free pages (u64), inline and in the chain |
//! | 48..56 | first free-list page of this slot's chain (u64), 0 for none |
//! | 56..64 | number of pages in that chain (u64) |
//! | 64..68 | free pages stored inline in this superblock (u32) |
//! | 68..72 | zero |
//! | 72..P | the inline free page numbers (u64 each) |
//!
//! **Free-list pages** (kind 3) continue the free list when it does not fit inline. Each
//! slot has its own chain, owned by the store (never handed out by `allocate`), so writing
//! one slot's chain cannot damage the other slot's:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | page header (kind 3) |
//! | 8..16 | sequence number of the superblock this page belongs to (u64) |
//! | 16..24 | next page of the chain (u64), 0 at the end |
//! | 24..28 | free page numbers in this page (u32) |
//! | 28..32 | zero |
//! | 32..P | the free page numbers (u64 each) |
//!
//! A chain only grows (a slot keeps the pages it once needed), which bounds the pages the
//! store keeps for itself by twice the largest free list divided by `(P - 32) / 8`.

mod alloc;
mod blob;
mod buf;
pub(crate) mod checksum;
mod disk;
mod extents;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod fault;
mod file;
#[cfg(test)]
mod mem;
mod page;
mod paged;
mod superblock;
#[cfg(target_os = "linux")]
mod uring;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_blob;
#[cfg(test)]
mod tests_fault;
#[cfg(test)]
mod tests_file;
#[cfg(all(test, target_os = "linux"))]
mod uring_tests;

use crate::error::Result;

pub(crate) use blob::{blocks_for, BlobFile, BLOB_BLOCK};
pub(crate) use buf::PageBuf;
pub(crate) use extents::Extents;
#[cfg(any(test, fuzzing, bfkv_internals))]
pub(crate) use fault::FaultStore;
pub(crate) use file::{Backend, FileStore};
#[cfg(test)]
pub(crate) use mem::MemStore;

/// A page number: the page's byte offset in the file divided by the page size.
pub(crate) type PageNo = u64;

/// Bytes [0, `STORE_RESERVED`) of every page belong to the store (checksum etc.); callers never
/// put data there. The node layout leaves them free.
pub(crate) const STORE_RESERVED: usize = 8;

/// The first page `allocate` can return: pages 0 and 1 are the superblock slots. Page 0 is
/// therefore never a data page, and callers may use it as a null page number.
pub(crate) const FIRST_DATA_PAGE: PageNo = 2;

/// Counters describing a store, for stats and tests.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StoreStats {
    /// Pages read by callers (`read` and every page of `read_batch`).
    pub reads: u64,
    /// Pages written by callers (`write` and every page of `write_batch`).
    pub writes: u64,
    /// Calls to `sync`.
    pub syncs: u64,
    /// Pages handed out by `allocate` and not freed (the store's own pages excluded).
    pub allocated_pages: u64,
    /// Pages waiting in the free list.
    pub free_pages: u64,
    /// Pages in the file, the store's own included.
    pub file_pages: u64,
}

/// Fixed-size pages on a (possibly emulated) disk, with checksums and page allocation.
pub(crate) trait PageStore: Send + Sync + 'static {
    /// The page size in bytes.
    #[allow(dead_code)] // used by unit tests and the internals harness
    fn page_size(&self) -> usize;

    /// Reads `page` into `buf` and verifies its checksum: a torn, bit-flipped, never-written
    /// or misplaced page is `Error::Corruption { file, page: Some(page), .. }`.
    fn read(&self, page: PageNo, buf: &mut PageBuf) -> Result<()>;

    /// Stamps the checksum into `buf[..STORE_RESERVED]` and writes the page.
    fn write(&self, page: PageNo, buf: &mut PageBuf) -> Result<()>;

    /// Many reads submitted together (one batch, up to the whole slice in flight). Returns the
    /// first error; on error the contents of all `bufs` are unspecified.
    #[allow(dead_code)] // used by unit tests and the internals harness
    fn read_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()>;

    /// Reads pages as `next` names them, the k-th into `bufs[k]`, until it names none or
    /// every buffer is taken, verifying each as `read` does; returns how many were read.
    /// Where the medium allows, the first reads are under way while `next` is still naming
    /// the rest: `next` may run while reads are in flight, and must do no I/O of its own.
    /// Returns the first error; on error the contents of all `bufs` are unspecified.
    fn read_streamed(
        &self,
        bufs: &mut [PageBuf],
        next: &mut dyn FnMut() -> Option<PageNo>,
    ) -> Result<usize> {
        let pages: Vec<PageNo> = std::iter::from_fn(next).take(bufs.len()).collect();
        self.read_batch(&pages, &mut bufs[..pages.len()])?;
        Ok(pages.len())
    }

    /// Many writes submitted together.
    fn write_batch(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()>;

    /// Every write that returned before this call, and the allocation state (free list, page
    /// count), is on stable storage when this returns (fdatasync / fsync).
    fn sync(&self) -> Result<()>;

    /// A page number to write to: a freed page if any (the file never grows while free pages
    /// exist), else a new page at the end of the file.
    fn allocate(&self) -> Result<PageNo>;

    /// Returns `page` for reuse. Freeing a page that is not allocated (double free, a
    /// reserved page, beyond the end) is `Err(Error::corruption(file, Some(page), "..."))`.
    fn free(&self, page: PageNo) -> Result<()>;

    /// Replaces the set of free pages (recovery recomputes it from what a checkpoint references).
    /// Pages the store keeps for its own free-list chains are skipped, so a caller may pass
    /// "every page from [`FIRST_DATA_PAGE`] to the end that the checkpoint does not use".
    fn set_free_pages(&self, free: Vec<PageNo>) -> Result<()>;

    /// Current counters.
    fn stats(&self) -> StoreStats;
}
