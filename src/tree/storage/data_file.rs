//! The tree's side of the page store: the data file (absent for in-memory trees), its name
//! for error messages, and the page tracker (`pages.rs`) that decides when a superseded page
//! may be reused. Leaf pages reach the disk only through here.

use std::path::PathBuf;

use super::pages::PageTracker;
use crate::error::{Error, Result};
use crate::node::{NodeKind, NodeMut, NodeRef};
use crate::store::{PageBuf, PageStore, StoreStats};
use crate::sync::Arc;
use crate::tree::blob::Blobs;
use crate::wal::Lsn;

/// The data file and the bookkeeping of its pages.
pub(crate) struct Storage {
    store: Option<Arc<dyn PageStore>>,
    /// The data file's path, named in errors.
    path: PathBuf,
    pages: PageTracker,
    /// The blob file: values too long for a leaf record (`store/blob.rs`).
    blobs: Blobs,
}

impl Storage {
    /// Storage over `store`, named `path` in errors, whose pages `pages` describes, with
    /// large values in `blobs`.
    pub(crate) fn new(
        store: Arc<dyn PageStore>,
        path: PathBuf,
        pages: PageTracker,
        blobs: Blobs,
    ) -> Storage {
        Storage {
            store: Some(store),
            path,
            pages,
            blobs,
        }
    }

    /// No data file: the cache is the whole store.
    pub(crate) fn in_memory() -> Storage {
        Storage {
            store: None,
            path: PathBuf::from("<memory>"),
            pages: PageTracker::default(),
            blobs: Blobs::none(),
        }
    }

    /// Whether there is no data file.
    #[inline]
    pub(crate) fn is_in_memory(&self) -> bool {
        self.store.is_none()
    }

    /// The page store, if the tree has a data file.
    #[inline]
    pub(crate) fn store(&self) -> Option<&Arc<dyn PageStore>> {
        self.store.as_ref()
    }

    /// Which pages hold what.
    #[inline]
    pub(crate) fn pages(&self) -> &PageTracker {
        &self.pages
    }

    /// The blob file.
    #[inline]
    pub(crate) fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// The store's counters (zero for in-memory trees).
    pub(crate) fn stats(&self) -> StoreStats {
        self.store.as_ref().map(|s| s.stats()).unwrap_or_default()
    }

    /// A corruption error about `page` of the data file.
    pub(crate) fn corruption(&self, page: Option<u64>, reason: &'static str) -> Error {
        Error::corruption(&self.path, page, reason)
    }

    /// Reads disk page `page` into `buf`.
    ///
    /// # Errors
    /// `Io` or `Corruption` (checksum) from the store; `Corruption` for an in-memory tree,
    /// which has no pages.
    pub(crate) fn read_page(&self, page: u64, buf: &mut PageBuf) -> Result<()> {
        let Some(store) = &self.store else {
            return Err(self.corruption(Some(page), "in-memory tree has no disk pages"));
        };
        store.read(page, buf)
    }

    /// Checks that page `page`, read into `buf`, is a well-formed leaf.
    ///
    /// # Errors
    /// `Corruption` if it is not.
    pub(crate) fn check_leaf<'b>(&self, page: u64, buf: &'b [u8]) -> Result<NodeRef<'b>> {
        // The store verified the page's checksum before returning it.
        let node = NodeRef::from_checksummed(buf)
            .map_err(|e| Error::corruption(&self.path, Some(page), e.0))?;
        if node.kind() != NodeKind::Leaf {
            return Err(self.corruption(Some(page), "page is not a leaf"));
        }
        Ok(node)
    }

    /// [`Storage::check_leaf`] for the page of a leaf whose bounds are `low..high`: its
    /// records must lie within them.
    ///
    /// A leaf's bounds only widen while a page is its own (a split rewrites it), so a page
    /// holding keys outside them is not the leaf's: it is an older page of another leaf,
    /// as a write the disk acknowledged and then lost reads back (the page number and
    /// checksum are right). Reading it as this leaf would answer for another range, and
    /// writing it back would move another leaf's keys into this one.
    ///
    /// # Errors
    /// `Corruption` if the page is not a well-formed leaf of those bounds.
    pub(crate) fn check_leaf_in<'b>(
        &self,
        page: u64,
        buf: &'b [u8],
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Result<NodeRef<'b>> {
        let node = self.check_leaf(page, buf)?;
        if !node.keys_within(low, high) {
            return Err(self.corruption(Some(page), "a leaf page holds keys outside its leaf"));
        }
        Ok(node)
    }

    /// Writes the leaf built in `buf` to a newly allocated page (freed again if the write
    /// fails) and returns the page.
    ///
    /// # Errors
    /// `Io` from allocating or writing; nothing stays allocated.
    pub(crate) fn write_new_page(store: &dyn PageStore, buf: &mut PageBuf) -> Result<u64> {
        let page = store.allocate()?;
        NodeMut::from_bytes(buf).set_disk_page(Some(page));
        if let Err(e) = store.write(page, buf) {
            let _ = store.free(page);
            return Err(e);
        }
        Ok(page)
    }

    /// Leaf `pid` now lives in `new`, an image built at `lsn`: records that, and frees its
    /// old page `old` now, or after the next checkpoint if a checkpoint references it
    /// (`PageTracker::moved`).
    pub(crate) fn moved(&self, pid: crate::pool::PageId, old: Option<u64>, new: u64, lsn: Lsn) {
        if let (true, Some(old)) = (self.pages.moved(pid, old, new, lsn), old) {
            self.free(old);
        }
    }

    /// `page` no longer holds a current leaf: frees it now, or after the next checkpoint if
    /// a checkpoint references it.
    pub(crate) fn supersede(&self, page: u64) {
        if self.pages.supersede(page) {
            self.free(page);
        }
    }

    /// Frees `page`. A failure means the page was not allocated: a bookkeeping bug that must
    /// not take the write down with it; the page is merely not reused.
    pub(crate) fn free(&self, page: u64) {
        if let Some(store) = &self.store {
            let _ = store.free(page);
        }
    }
}
