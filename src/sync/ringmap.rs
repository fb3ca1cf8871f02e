//! A ring of shared memory mapped twice, back to back: byte `i` of the second copy is byte
//! `i` of the first, so a range that runs off the end of the ring continues at its start
//! without a seam, and the append region (`region`) hands out every range as one slice.
//!
//! The memory is a file's (the write-ahead log's staging ring lives in a file of the log
//! directory, so records stored into it outlive the process: see `wal::ring`). Linux only;
//! elsewhere [`RingMap::new`] reports `Unsupported` and the log appends through its buffer.

use std::fs::File;
use std::io;
#[cfg(target_os = "linux")]
use std::os::unix::io::AsRawFd;

/// `capacity` bytes of a file, mapped twice in a row, readable and writable, shared; and
/// the page of the file just before them, where the ring keeps the word a crashed
/// process's recovery reads ([`RingMap::published_word`]).
#[derive(Debug)]
pub(crate) struct RingMap {
    /// First byte of the first copy; the second copy starts `capacity` bytes later.
    ptr: *mut u8,
    /// Bytes in one copy: a power of two and a multiple of the page size.
    capacity: usize,
    /// The mapped page before the ring's bytes (null when they start the file).
    before: *mut u8,
}

// SAFETY: the mapping is plain shared memory; `RingMap` hands out no references itself,
// only the pointer, and whoever writes through it (`AppendRegion`) keeps writers apart.
unsafe impl Send for RingMap {}
// SAFETY: as for `Send`.
unsafe impl Sync for RingMap {}

impl RingMap {
    /// Allocates `capacity` bytes of `file` from byte `offset` and maps them twice in a
    /// row. `capacity` must be a power of two and a multiple of the page size, `offset` a
    /// multiple of the page size, and the file at least `offset + capacity` bytes long
    /// (else `InvalidInput`); a file system that cannot allocate them fails here.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new(_file: &File, _offset: u64, _capacity: usize) -> io::Result<RingMap> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// As above: allocates and maps (Linux).
    #[cfg(target_os = "linux")]
    pub(crate) fn new(file: &File, offset: u64, capacity: usize) -> io::Result<RingMap> {
        let page = page_size();
        let long_enough = file.metadata()?.len() >= offset.saturating_add(capacity as u64);
        if !capacity.is_power_of_two()
            || !capacity.is_multiple_of(page)
            || !offset.is_multiple_of(page as u64)
            || !long_enough
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring capacity or offset not page-aligned, or the file is too short",
            ));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ring offset too large"))?;
        let len = libc::off_t::try_from(capacity)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
        // Allocate every page now: a store into a page a full file system cannot give is
        // SIGBUS, where this is an error the caller can fall back from.
        // SAFETY: fallocate only reads its integer arguments; the descriptor is `file`'s,
        // which outlives the call.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let span = capacity
            .checked_mul(2)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
        // SAFETY: an anonymous, inaccessible reservation of fresh address space: it aliases
        // nothing, and it is only replaced below by mappings of the same range.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut ring = RingMap {
            ptr: base.cast(),
            capacity,
            before: std::ptr::null_mut(),
        };
        for half in 0..2 {
            // SAFETY: `MAP_FIXED` replaces part of the reservation made above, which this
            // function owns and nobody has a reference into; the file range exists (checked
            // above). On failure `ring`'s drop unmaps the whole reservation.
            let got = unsafe {
                libc::mmap(
                    ring.ptr.add(half * capacity).cast(),
                    capacity,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    offset,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
        }
        if offset >= page as libc::off_t {
            // SAFETY: a new shared mapping of one page of `file` that exists (the ring's
            // bytes follow it), at an address the kernel picks: it aliases nothing of this
            // process. `ring`'s drop unmaps it.
            let got = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    offset - page as libc::off_t,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            ring.before = got.cast();
        }
        // Map every page now rather than fault them in one by one in the first lap. Advice
        // only: without it the pages fault in on first use.
        // SAFETY: MADV_POPULATE_WRITE changes no byte; it only creates page table entries
        // (and pages, for a file range never touched) in the range mapped above.
        unsafe {
            libc::madvise(ring.ptr.cast(), span, libc::MADV_POPULATE_WRITE);
        }
        Ok(ring)
    }

    /// First byte of the first copy; `2 * capacity()` bytes from it are mapped.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes in one copy.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The 8 bytes of the file just before the ring's, as an atomic word (`None` when the
    /// ring starts the file). A store there is in the page cache at once, like the ring's
    /// bytes.
    pub(crate) fn published_word(&self) -> Option<&std::sync::atomic::AtomicU64> {
        if self.before.is_null() {
            return None;
        }
        // SAFETY: `before` maps a whole page (at least 4 KiB), so its last 8 bytes are
        // inside it and 8-aligned (the page is page-aligned); the mapping lives as long as
        // `self`, which the reference borrows. Within this process those bytes are only
        // reached through this atomic; another process reads them only after this one has
        // let go of the ring (`wal::ring`).
        unsafe {
            let word = self.before.add(crate::sys::page_size() - 8).cast::<u64>();
            Some(std::sync::atomic::AtomicU64::from_ptr(word))
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: the range is the reservation `new` made (now both copies), owned by this
        // value alone; nothing borrowed from it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.capacity * 2);
        }
        if !self.before.is_null() {
            // SAFETY: the page `new` mapped, owned by this value alone; the references
            // `published_word` lent borrowed `self`, so none is left.
            unsafe {
                libc::munmap(self.before.cast(), page_size());
            }
        }
    }
}

#[cfg(target_os = "linux")]
use crate::sys::page_size;

#[cfg(all(test, not(shuttle), target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file(len: u64) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("ring"))
            .expect("file");
        f.set_len(len).expect("size");
        (dir, f)
    }

    #[test]
    fn the_second_copy_is_the_first_and_both_are_the_file() {
        let page = page_size();
        let (_dir, f) = file(3 * page as u64);
        let ring = RingMap::new(&f, page as u64, 2 * page).expect("map");
        let cap = ring.capacity();
        // SAFETY: all `2 * cap` bytes are mapped, and this test is the only user.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ring.ptr(), 2 * cap) };
        // A write that runs off the end of the first copy lands at the ring's start.
        bytes[cap - 2..cap + 3].copy_from_slice(b"abcde");
        assert_eq!(&bytes[..3], b"cde");
        assert_eq!(&bytes[2 * cap - 2..], b"ab");
        // Both copies are the file's bytes from `offset`.
        let mut on_file = [0u8; 3];
        f.read_exact_at(&mut on_file, page as u64).expect("read");
        assert_eq!(&on_file, b"cde");
    }

    #[test]
    fn bad_sizes_are_refused() {
        let page = page_size();
        let (_dir, f) = file(4 * page as u64);
        let refused = |offset: u64, cap: usize| {
            RingMap::new(&f, offset, cap)
                .map(|_| ())
                .map_err(|e| e.kind())
        };
        assert_eq!(refused(0, 3 * page), Err(io::ErrorKind::InvalidInput));
        assert_eq!(refused(0, page / 2), Err(io::ErrorKind::InvalidInput));
        assert_eq!(refused(1, page), Err(io::ErrorKind::InvalidInput));
        assert_eq!(
            refused(page as u64, 4 * page),
            Err(io::ErrorKind::InvalidInput)
        );
        assert_eq!(refused(0, 4 * page), Ok(()));
    }
}
