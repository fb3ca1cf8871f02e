//! [`PageBuf`]: a page-sized, 4096-byte-aligned heap buffer, as `O_DIRECT` requires.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every page buffer: the logical block size `O_DIRECT` needs on any common
/// device, and a multiple of every smaller one.
const ALIGN: usize = 4096;

/// A page-sized heap buffer aligned to 4096 bytes (`O_DIRECT` needs it). Zeroed on creation.
pub(crate) struct PageBuf {
    /// Start of the allocation, `len` bytes, aligned to [`ALIGN`].
    ptr: NonNull<u8>,
    /// Length in bytes (the page size).
    len: usize,
}

// SAFETY: a PageBuf owns its allocation exclusively (like a Box<[u8]>); nothing else holds
// the pointer, so moving it to or sharing `&PageBuf` with another thread is as safe as for
// Box<[u8]>.
unsafe impl Send for PageBuf {}
// SAFETY: shared access only hands out `&[u8]`; mutation needs `&mut PageBuf`.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// A zeroed buffer of `page_size` bytes (a page size is at least 4 KiB; a smaller
    /// request still gets a valid, aligned buffer of that length).
    pub(crate) fn new(page_size: usize) -> PageBuf {
        let layout = Self::layout(page_size);
        // SAFETY: the layout has a non-zero size (at least 1, see `layout`).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        PageBuf {
            ptr,
            len: page_size,
        }
    }

    /// The allocation layout for a buffer of `len` bytes: never zero-sized, since allocating
    /// zero bytes is undefined behaviour.
    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len.max(1), ALIGN) {
            Ok(layout) => layout,
            // Only a size near isize::MAX fails; treat it like any failed allocation.
            Err(_) => alloc::handle_alloc_error(Layout::new::<[u8; ALIGN]>()),
        }
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes (never, for a real page size).
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees the access is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for PageBuf {
    fn clone(&self) -> PageBuf {
        let mut copy = PageBuf::new(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageBuf")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
