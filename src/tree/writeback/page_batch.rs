//! A batch of leaf pages for a checkpoint pass or an idle write-back (`checkpoint.rs`): the
//! leaves built and waiting for one `write_batch`, the pages read ahead with one
//! `read_batch`, and spare buffers reused across batches.

use crate::error::Result;
use crate::node::{NodeMut, NodeRef};
use crate::pool::PageId;
use crate::store::{PageBuf, PageStore};
use crate::tree::blob::Blobs;
use crate::tree::storage::Storage;

/// Leaves built by checkpoint write-backs, waiting to be written with one `write_batch`
/// (`checkpoint.rs`). Page `pages[i]` gets `bufs[i]`; buffers beyond `pages.len()` are
/// spares kept from earlier batches.
#[derive(Default)]
pub(in crate::tree) struct PageBatch {
    /// Built leaves, and spare buffers.
    bufs: Vec<PageBuf>,
    /// The allocated page of each built leaf.
    pages: Vec<u64>,
    /// Leaf pages read ahead with one `read_batch` (`checkpoint.rs`), for the merges of the
    /// batch's mini-pages to start from instead of reading one page at a time.
    images: Vec<Image>,
    /// Page buffers no image or built leaf holds, reused so that a long pass does not
    /// allocate two pages per leaf.
    spare: Vec<PageBuf>,
}

/// A leaf's disk page, read ahead without its lock held. It is what the leaf's page holds
/// only while the leaf's write token is still `token`: every write-back, split or removal
/// changes the token, and a superseded page can be reused for other data.
pub(in crate::tree) struct Image {
    /// The leaf.
    pid: PageId,
    /// The page read.
    disk: u64,
    /// The leaf's write token when `disk` was its page.
    token: u64,
    /// The page's bytes.
    buf: PageBuf,
}

impl Image {
    /// Leaf `pid`'s page `disk`, read into `buf` while its write token was `token`.
    pub(in crate::tree) fn new(pid: PageId, disk: u64, token: u64, buf: PageBuf) -> Image {
        Image {
            pid,
            disk,
            token,
            buf,
        }
    }
}

impl PageBatch {
    /// Drops the read-ahead images of leaf `pid` unless its write token is still `token`.
    /// The caller holds the leaf's lock, so a kept image stays valid until it is released.
    pub(in crate::tree) fn keep_images_if(&mut self, pid: PageId, token: u64) {
        self.images.retain(|i| i.pid != pid || i.token == token);
    }

    /// A page buffer from the spares, or a new one.
    pub(in crate::tree) fn spare_buf(&mut self, page_size: usize) -> PageBuf {
        self.spare.pop().unwrap_or_else(|| PageBuf::new(page_size))
    }

    /// Returns the buffers of the images no merge took to the spares.
    pub(in crate::tree) fn recycle_images(&mut self) {
        let images = std::mem::take(&mut self.images);
        self.spare.extend(images.into_iter().map(|i| i.buf));
    }

    /// Adds pages read ahead (after dropping the images no merge took).
    pub(in crate::tree) fn set_images(&mut self, images: impl IntoIterator<Item = Image>) {
        self.recycle_images();
        self.images.extend(images);
    }

    /// Keeps `bufs` as spare buffers.
    pub(in crate::tree) fn give_spare(&mut self, bufs: impl IntoIterator<Item = PageBuf>) {
        self.spare.extend(bufs);
    }

    /// Leaves built and not yet written.
    pub(in crate::tree) fn staged_len(&self) -> usize {
        self.pages.len()
    }

    /// Writes the built leaves with one `write_batch`. On failure they stay staged, for
    /// `abandon` to free their pages.
    ///
    /// # Errors
    /// `Io` from the store.
    pub(in crate::tree) fn write_out(
        &mut self,
        store: &dyn PageStore,
        blobs: &Blobs,
    ) -> Result<()> {
        let n = self.pages.len();
        store.write_batch(&self.pages, &mut self.bufs[..n])?;
        for (&page, buf) in self.pages.iter().zip(&self.bufs) {
            blobs.page_written(page, NodeRef::from_bytes(buf));
        }
        self.pages.clear();
        Ok(())
    }

    /// Gives up on the built leaves: frees their pages in `storage`.
    pub(in crate::tree) fn abandon(&mut self, storage: &Storage) {
        for p in self.pages.drain(..) {
            storage.free(p);
        }
    }

    /// Takes the read-ahead image of leaf `pid`'s disk page `disk`, if there is one.
    pub(in crate::tree) fn take_image(&mut self, pid: PageId, disk: u64) -> Option<PageBuf> {
        let i = self
            .images
            .iter()
            .position(|i| i.pid == pid && i.disk == disk)?;
        Some(self.images.swap_remove(i).buf)
    }

    /// The buffer the next leaf is built in: still free until `stage` claims it.
    pub(in crate::tree) fn next_buf(&mut self, page_size: usize) -> &mut PageBuf {
        let i = self.pages.len();
        if self.bufs.len() == i {
            let buf = self.spare_buf(page_size);
            self.bufs.push(buf);
        }
        &mut self.bufs[i]
    }

    /// Claims the buffer `next_buf` returned, now holding a leaf: allocates the leaf's new
    /// page, stamps it into the leaf and returns it.
    pub(in crate::tree) fn stage(&mut self, store: &dyn PageStore) -> Result<u64> {
        let new = store.allocate()?;
        let i = self.pages.len();
        NodeMut::from_bytes(&mut self.bufs[i]).set_disk_page(Some(new));
        self.pages.push(new);
        Ok(new)
    }
}
