//! [`Disk`]: raw, unchecked page I/O, the seam between the store's metadata logic
//! (`paged.rs`) and a medium (a file through `io_uring` or pread, or the emulated disk of
//! `fault.rs`).

use std::path::Path;

use super::{PageBuf, PageNo};
use crate::error::Result;

/// Positional page I/O on one medium. Request `i` covers `bufs[i].len()` bytes at byte offset
/// `pages[i] * bufs[i].len()`, so a buffer's length picks the page size of that request
/// (open probes a superblock with a page size other than the configured one).
pub(crate) trait Disk: Send + Sync + 'static {
    /// The file the medium stands for, for error messages.
    fn path(&self) -> &Path;

    /// Fills every buffer; bytes beyond the end of the medium read as zeros (so a page that
    /// was never written fails checksum verification like any other damaged page).
    fn read_pages(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()>;

    /// As [`Disk::read_pages`], then `check(i, &bufs[i])` for every request; returns the
    /// first error. A medium that reads pages concurrently runs `check` on each page as soon
    /// as it arrives, overlapping it with the I/O of the others.
    fn read_pages_checked(
        &self,
        pages: &[PageNo],
        bufs: &mut [PageBuf],
        check: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.read_pages(pages, bufs)?;
        bufs.iter()
            .enumerate()
            .try_for_each(|(i, buf)| check(i, buf))
    }

    /// Reads pages as `next` names them, the k-th into `bufs[k]`, until it names none or
    /// every buffer is taken, with `check(k, &bufs[k])` for each as in
    /// [`Disk::read_pages_checked`]; returns how many were read. A medium that reads pages
    /// concurrently starts on the first while `next` is still naming the rest, so `next`
    /// may run while reads are in flight and must do no I/O of its own.
    fn read_pages_streamed(
        &self,
        bufs: &mut [PageBuf],
        next: &mut dyn FnMut() -> Option<PageNo>,
        check: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<usize> {
        read_collected(self, bufs, next, check)
    }

    /// Writes every buffer, extending the medium if needed.
    fn write_pages(&self, pages: &[PageNo], bufs: &[PageBuf]) -> Result<()>;

    /// Makes every completed write durable (`fdatasync`).
    fn flush(&self) -> Result<()>;
}

/// Byte offset of request `page` with a buffer of `len` bytes, or `None` if it overflows.
pub(super) fn offset(page: PageNo, len: usize) -> Option<u64> {
    page.checked_mul(len as u64)
        .filter(|&o| i64::try_from(o).is_ok())
}

/// [`Disk::read_pages_streamed`] by naming every page first, then reading them together.
pub(super) fn read_collected<D: Disk + ?Sized>(
    disk: &D,
    bufs: &mut [PageBuf],
    next: &mut dyn FnMut() -> Option<PageNo>,
    check: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
) -> Result<usize> {
    let pages: Vec<PageNo> = std::iter::from_fn(next).take(bufs.len()).collect();
    disk.read_pages_checked(&pages, &mut bufs[..pages.len()], check)?;
    Ok(pages.len())
}
