//! Writing buffered leaves back to disk: eviction (the block leaves memory) and checkpoints
//! (the block stays, made clean).
//!
//! Leaves are written shadow-style: always to a newly allocated page, never over the page
//! the last checkpoint references (see `persist/open.rs`), so a crash at any moment leaves the
//! last checkpoint intact.

use super::page_batch::PageBatch;
use crate::error::{Error, Result};
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind};
use crate::pool::{EvictGuard, Location, PageId, WriteGuard};
use crate::store::{PageBuf, PageStore};
use crate::sync;
use crate::tree::cache::{live_records, node_records, with_page_buf};
use crate::tree::index::SmoGuard;
use crate::tree::index::{Bounds, Entry, Seek};
use crate::tree::stats::Event;
use crate::tree::storage::Storage;
use crate::tree::{Attempt, Restart, Shared, Step, FLAG_DAMAGED, FLAG_DIRTY, NO_PAGE};

/// What the caller wants done with the cached node once its changes are on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::tree) enum AfterWrite {
    /// Detach it: the mapping table points at the disk page (eviction).
    Detach,
    /// Keep it cached, marked clean (checkpoint).
    Keep,
}

/// What write-back asks the lock holder to do to the leaf's mapping entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::tree) enum Action {
    /// Point the entry at this disk page and drop the block.
    Detach(u64),
    /// Keep the block; it now matches this disk page (mark it clean).
    KeepClean(u64),
    /// Nothing changed on disk; keep the block as it is.
    Nothing,
    /// The leaf is built in a page batch, bound for page `new`, and not written yet; once
    /// the batch is written, the lock holder records the move (`Shared::write_staged` in
    /// `checkpoint.rs`). Only a write-back given a batch returns this.
    Staged {
        /// The page the leaf lived in before.
        old: Option<u64>,
        /// The page the batch writes it to.
        new: u64,
    },
}

/// What a merge of a mini-page into its leaf's page came to.
enum Merged {
    /// The merged leaf is written (or staged).
    Written(Action),
    /// The merged records overflow the page or leave it empty (or the page was damaged
    /// and these are the records salvaged from the mini-page): these are they, for the
    /// general path, and whether the leaf is damaged (`FLAG_DAMAGED`).
    Fallback(Vec<Record>, bool),
}

/// Whether every record of `merged` (a mini-page's leaf with the mini-page merged in) from
/// the mini-page's first inserted key on came from the mini-page: its inserts were appended
/// past the end of the leaf (ascending inserts), so a split should leave the left part full.
fn appended_past_end(mini: NodeRef<'_>, merged: &[Record]) -> bool {
    let mut first = None;
    let mut inserts = 0;
    for i in 0..mini.len() {
        if mini.record_kind(i) == RecordKind::Insert {
            inserts += 1;
            if first.is_none() {
                let mut key = Vec::new();
                mini.key_into(i, &mut key);
                first = Some(key);
            }
        }
    }
    let Some(first) = first else {
        return false;
    };
    let tail = merged.len() - merged.partition_point(|r| r.key.as_slice() < first.as_slice());
    tail > 0 && tail <= inserts && tail < merged.len()
}

/// Whether a cached node holds changes its disk page lacks: a dirty (or never written)
/// full-page mirror, or a mini-page with dirty records.
pub(in crate::tree) fn needs_write_back(node: NodeRef<'_>) -> bool {
    match node.kind() {
        NodeKind::Leaf => node.flags() & FLAG_DIRTY != 0 || node.disk_page().is_none(),
        _ => node.dirty_count() > 0,
    }
}

/// The leaves a split writes: `records` cut into `groups` (each with its low fence), the
/// last bounded above by `high`, all marked damaged if the leaf was.
#[derive(Clone, Copy)]
struct Leaves<'a> {
    records: &'a [Record],
    groups: &'a [(std::ops::Range<usize>, Option<Vec<u8>>)],
    high: Option<&'a [u8]>,
    damaged: bool,
}

/// What became of an emptied leaf.
enum Unlink {
    /// Removed from the structure.
    Done,
    /// The structure lock is busy: not now.
    Busy,
    /// It stays (the only leaf).
    Kept,
}

impl Shared {
    /// The eviction callback (the seam between the pool and write-back): writes back the
    /// leaf whose block reached the head and detaches the block. A leaf that cannot be
    /// written now (its split needs the busy structure lock) stays attached, which the pool
    /// reports as `Evicted::Busy`.
    pub(in crate::tree) fn evict_block(
        &self,
        page: &mut EvictGuard<'_, '_>,
        bytes: &[u8],
    ) -> Result<()> {
        match self.write_back(page.page_id(), bytes, AfterWrite::Detach, None, None)? {
            Step::Done(Action::Detach(disk) | Action::KeepClean(disk)) => {
                page.set_location_disk(disk);
            }
            Step::Done(Action::Staged { .. }) => {
                // Only a write-back given a batch stages, and this one has none. Were it to
                // happen, leaving the block attached keeps it live and intact for a retry.
                debug_assert!(false, "eviction got a staged write-back");
            }
            Step::Done(Action::Nothing) => {
                // Eviction must free the block: a clean node maps back to its disk page.
                let disk = NodeRef::from_bytes(bytes).disk_page().unwrap_or(NO_PAGE);
                page.set_location_disk(disk);
            }
            Step::Restart(_) => {}
        }
        Ok(())
    }

    /// Writes a write-locked leaf's buffered changes to disk. A leaf that comes out empty is
    /// removed from the tree; one that overflows a page is split. `smo` is the structure lock
    /// if the caller holds it (checkpoints); otherwise it is tried, and `Retry` returned when
    /// busy. With a `batch`, a leaf that fits one new page is built into the batch instead
    /// of written (`Action::Staged`); splits and removals are still done at once.
    pub(in crate::tree) fn write_back(
        &self,
        pid: PageId,
        bytes: &[u8],
        after: AfterWrite,
        smo: Option<&SmoGuard<'_>>,
        mut batch: Option<&mut PageBatch>,
    ) -> Attempt<Action> {
        let node = NodeRef::from_bytes(bytes);
        let disk = node.disk_page();
        if !needs_write_back(node) {
            return Ok(Step::Done(Action::Nothing));
        }
        let mirror = (node.kind() == NodeKind::Leaf).then(|| node_records(node));
        let route_key = match mirror.as_ref().map(|records| records.first()) {
            Some(Some(r)) => Some(r.key.to_vec()),
            // An emptied mirror (its removal found the structure lock busy): its low bound
            // routes to it, and stays its own while its lock is held.
            Some(None) => self
                .index()
                .leaves()
                .into_iter()
                .find(|&(_, p)| p == pid)
                .map(|(low, _)| low),
            None => {
                let mut route = Vec::new();
                node.key_into(0, &mut route);
                Some(route)
            }
        };
        let Some(bounds) = self.bounds_of(pid, route_key.as_deref()) else {
            return Ok(Step::Restart(Restart::Retry));
        };
        let (records, damaged) = match (mirror, disk) {
            (Some(records), _) => (records, node.flags() & FLAG_DAMAGED != 0),
            (None, Some(p)) => {
                match self.merge_in_place(pid, node, p, &bounds, after, batch.as_deref_mut())? {
                    Merged::Written(action) => return Ok(Step::Done(action)),
                    Merged::Fallback(records, damaged) => (records, damaged),
                }
            }
            (None, None) => (self.live_folded(node)?, false),
        };
        self.counters().count(Event::WriteBack);
        let (low, high) = bounds;

        // An emptied damaged leaf stays: removing it would make its lost keys read as absent.
        if records.is_empty() && !damaged {
            if let Some(key) = &route_key {
                match self.unlink_empty(pid, disk, key, smo) {
                    Unlink::Done => return Ok(Step::Done(Action::Detach(NO_PAGE))),
                    // Rather than write an empty page that nothing would remove later, an
                    // eviction tries again and a pass that may skip leaves (a checkpoint's
                    // first, or the idle write-back) leaves the leaf to one that holds the
                    // structure lock.
                    Unlink::Busy => return Ok(Step::Restart(Restart::Retry)),
                    Unlink::Kept => {}
                }
            }
        }

        let packed = node.kind() == NodeKind::Mini && appended_past_end(node, &records);
        let groups = self.leaf_groups(&records, low.as_deref(), high.as_deref(), packed);
        if groups.len() > 1 {
            let local;
            let smo = match smo {
                Some(s) => s,
                None => match self.index().try_smo() {
                    Some(s) => {
                        local = s;
                        &local
                    }
                    None => return Ok(Step::Restart(Restart::Retry)),
                },
            };
            let key = route_key.as_deref().unwrap_or_default();
            let leaves = Leaves {
                records: &records,
                groups: &groups,
                high: high.as_deref(),
                damaged,
            };
            return self.write_split(pid, disk, key, &leaves, smo);
        }

        let Some(store) = self.storage().store() else {
            return Ok(Step::Done(Action::Nothing));
        };
        let (low, high) = (low.as_deref(), high.as_deref());
        if let Some(batch) = batch {
            let buf = batch.next_buf(self.page_size());
            self.build_leaf(buf, low, high, &records, damaged)?;
            let new = batch.stage(&**store)?;
            return Ok(Step::Done(Action::Staged { old: disk, new }));
        }
        let new_page = with_page_buf(self.page_size(), |buf| -> Result<u64> {
            self.build_leaf(buf, low, high, &records, damaged)?;
            let page = Storage::write_new_page(&**store, buf)?;
            self.storage()
                .blobs()
                .page_written(page, NodeRef::from_bytes(buf));
            Ok(page)
        })?;
        let lsn = self.journal().image_lsn();
        Ok(Step::Done(self.moved(pid, disk, new_page, after, lsn)))
    }

    /// The bounds of write-locked leaf `pid`, found by `route`, a key it holds (`None`: a
    /// leaf with no key at all, written with its own hint fences). `None` if the key routes
    /// elsewhere, which the leaf's lock rules out.
    fn bounds_of(&self, pid: PageId, route: Option<&[u8]>) -> Option<Bounds> {
        let Some(key) = route else {
            return Some((None, None));
        };
        // Any key the leaf holds routes to it while we hold its lock.
        let guard = sync::pin();
        let path = self.index().descend(&guard, Seek::Key(key));
        if path.leaf() != pid {
            debug_assert!(false, "leaf lock held but its key routes elsewhere");
            return None;
        }
        Some(path.bounds())
    }

    /// Builds one leaf of `records` between the fences in `buf`.
    pub(in crate::tree) fn build_leaf(
        &self,
        buf: &mut PageBuf,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        records: &[Record],
        damaged: bool,
    ) -> Result<()> {
        buf.fill(0);
        node::build(buf, NodeKind::Leaf, low, high, records).map_err(|_| {
            // `split_records` said one page suffices; never write a partial leaf.
            self.storage().corruption(None, "leaf did not fit its page")
        })?;
        if damaged {
            NodeMut::from_bytes(buf).set_flags(FLAG_DAMAGED);
        }
        Ok(())
    }

    /// Records that leaf `pid` now lives in `new` (an image built at `lsn`, see
    /// `PageTracker`) instead of `old` and says what becomes of its cached node.
    pub(in crate::tree) fn moved(
        &self,
        pid: PageId,
        old: Option<u64>,
        new: u64,
        after: AfterWrite,
        lsn: crate::wal::Lsn,
    ) -> Action {
        self.storage().moved(pid, old, new, lsn);
        match after {
            AfterWrite::Detach => Action::Detach(new),
            AfterWrite::Keep => Action::KeepClean(new),
        }
    }

    /// The common case of writing back a mini-page: read its leaf, merge the dirty records
    /// into that page buffer in place, write it to a new page (or stage it in `batch`).
    /// Falls back (returning the merged records) when they overflow the page or leave it
    /// empty.
    fn merge_in_place(
        &self,
        pid: PageId,
        mini: NodeRef<'_>,
        disk: u64,
        (low, high): &Bounds,
        after: AfterWrite,
        batch: Option<&mut PageBatch>,
    ) -> Result<Merged> {
        let Some(store) = self.storage().store() else {
            return Ok(Merged::Fallback(Vec::new(), false));
        };
        // Given the leaf's page in `buf`: the merged leaf, or the records to fall back with.
        // The page passed its checksum; the merge keeps its flags (a damaged leaf stays so).
        let merge = |buf: &mut PageBuf| -> Result<Option<(Vec<Record>, bool)>> {
            let leaf = self
                .storage()
                .check_leaf_in(disk, buf, low.as_deref(), high.as_deref())?;
            let damaged = leaf.flags() & FLAG_DAMAGED != 0;
            let merged = NodeMut::from_bytes(buf).merge_from(mini);
            // On failure `merge_from` left the leaf unchanged; an emptied leaf is unlinked
            // by the general path.
            if merged.is_err() || NodeRef::from_bytes(buf).is_empty() {
                let records =
                    node::merge_sorted(NodeRef::from_bytes(buf), mini, &mut |k, b, ops| {
                        self.fold_or_mark(k, b, ops)
                    })?;
                return Ok(Some((records, damaged)));
            }
            self.counters().count(Event::WriteBack);
            Ok(None)
        };
        if let Some(batch) = batch {
            let image = batch.take_image(pid, disk);
            let buf = batch.next_buf(self.page_size());
            // An image read ahead under the write token the caller checked
            // (`keep_images_if`) saves the read.
            let (read, replaced) = if let Some(mut image) = image {
                std::mem::swap(buf, &mut image);
                (Ok(()), Some(image))
            } else {
                (self.read_leaf_page(disk, buf), None)
            };
            let merged = read.and_then(|()| merge(buf));
            batch.give_spare(replaced);
            return match merged {
                Ok(Some((records, damaged))) => Ok(Merged::Fallback(records, damaged)),
                Ok(None) => {
                    let new = batch.stage(&**store)?;
                    Ok(Merged::Written(Action::Staged {
                        old: Some(disk),
                        new,
                    }))
                }
                Err(e) => self.salvage(e, mini),
            };
        }
        with_page_buf(self.page_size(), |buf| {
            match self.read_leaf_page(disk, buf).and_then(|()| merge(buf)) {
                Ok(Some((records, damaged))) => return Ok(Merged::Fallback(records, damaged)),
                Ok(None) => {}
                Err(e) => return self.salvage(e, mini),
            }
            let new_page = Storage::write_new_page(&**store, buf)?;
            self.storage()
                .blobs()
                .page_written(new_page, NodeRef::from_bytes(buf));
            Ok(Merged::Written(self.moved(
                pid,
                Some(disk),
                new_page,
                after,
                self.journal().image_lsn(),
            )))
        })
    }

    /// Reads leaf page `disk` into `buf`; reads once more if it fails its checksum, so
    /// that a damaged read is not taken for a damaged page. (`merge` checks its layout.)
    fn read_leaf_page(&self, disk: u64, buf: &mut PageBuf) -> Result<()> {
        match self.storage().read_page(disk, buf) {
            Err(Error::Corruption { .. }) => self.storage().read_page(disk, buf),
            other => other,
        }
    }

    /// A mini-page's leaf page is damaged (`err` is `Corruption`): the leaf is rewritten
    /// from the records the mini-page holds, marked damaged (`FLAG_DAMAGED`), so that its
    /// acknowledged writes reach disk, the damage stays reported, and the rest of the tree
    /// (evictions, checkpoints, the log's trimming) goes on. Any other error is returned.
    fn salvage(&self, err: Error, mini: NodeRef<'_>) -> Result<Merged> {
        match err {
            Error::Corruption { .. } => {
                self.counters().count(Event::Salvage);
                Ok(Merged::Fallback(live_records(mini), true))
            }
            e => Err(e),
        }
    }

    /// Removes an emptied leaf from the structure. Its page id is freed later by
    /// `drain_orphans` (the guard belongs to the caller, who detaches the block).
    fn unlink_empty(
        &self,
        pid: PageId,
        disk: Option<u64>,
        key: &[u8],
        smo: Option<&SmoGuard<'_>>,
    ) -> Unlink {
        let local;
        let smo = match smo {
            Some(s) => s,
            None => match self.index().try_smo() {
                Some(s) => {
                    local = s;
                    &local
                }
                None => return Unlink::Busy,
            },
        };
        if !self.publish(smo, key, pid, Vec::new()) {
            return Unlink::Kept;
        }
        if let Some(d) = disk {
            self.storage().supersede(d);
        }
        self.storage().pages().forget_leaf(pid);
        self.storage().pages().orphan(pid);
        self.counters().count(Event::LeafRemoved);
        Unlink::Done
    }

    /// Writes records that overflow one page as several leaves and publishes them.
    #[allow(clippy::too_many_arguments)]
    fn write_split(
        &self,
        pid: PageId,
        old_disk: Option<u64>,
        key: &[u8],
        leaves: &Leaves<'_>,
        smo: &SmoGuard<'_>,
    ) -> Attempt<Action> {
        let groups = leaves.groups;
        let Some(store) = self.storage().store() else {
            return Ok(Step::Done(Action::Nothing));
        };
        // Ids for the new leaves first: running out of them must leave nothing to undo.
        let mut new_leaves = Vec::with_capacity(groups.len() - 1);
        for _ in 1..groups.len() {
            let Some(leaf) = self.pool().insert_page(Location::Disk(NO_PAGE)) else {
                new_leaves.into_iter().for_each(WriteGuard::remove);
                return Err(crate::error::Error::too_many_leaves());
            };
            new_leaves.push(leaf);
        }
        let guard = sync::pin();
        let path = self.index().descend(&guard, Seek::Key(key));
        let (low, _) = path.bounds();
        let pages = match self.write_leaves(&**store, low.as_deref(), leaves) {
            Ok(pages) => pages,
            Err(e) => {
                new_leaves.into_iter().for_each(WriteGuard::remove);
                return Err(e);
            }
        };
        // The split leaf is locked throughout: its images hold every logged write to its
        // range, and none can be logged until it is released.
        let lsn = self.journal().image_lsn();
        let mut entries = vec![Entry::leaf(low.clone().unwrap_or_default(), pid)];
        for ((g, page_no), mut new_leaf) in pages.iter().enumerate().skip(1).zip(new_leaves) {
            drop(new_leaf.set_location_disk(*page_no));
            self.storage()
                .pages()
                .written(new_leaf.page_id(), *page_no, lsn);
            entries.push(Entry::leaf(
                groups[g].1.clone().unwrap_or_default(),
                new_leaf.page_id(),
            ));
        }
        let published = self.publish(smo, key, pid, entries);
        debug_assert!(published);
        self.counters().count(Event::Split);
        self.storage().moved(pid, old_disk, pages[0], lsn);
        Ok(Step::Done(Action::Detach(pages[0])))
    }

    /// Builds one leaf per group (the first bounded below by `low`, the last above by
    /// `high`) in newly allocated pages and writes them; returns the pages, in group order.
    /// On failure no page stays allocated.
    fn write_leaves(
        &self,
        store: &dyn PageStore,
        low: Option<&[u8]>,
        leaves: &Leaves<'_>,
    ) -> Result<Vec<u64>> {
        let Leaves {
            records,
            groups,
            high,
            damaged,
        } = *leaves;
        let mut pages = Vec::with_capacity(groups.len());
        let mut bufs = Vec::with_capacity(groups.len());
        let mut built = || -> Result<()> {
            for (g, (range, glow)) in groups.iter().enumerate() {
                let gl = if g == 0 { low } else { glow.as_deref() };
                let gh = groups.get(g + 1).map_or(high, |(_, next)| next.as_deref());
                let mut buf = PageBuf::new(self.page_size());
                let page_no = store.allocate()?;
                pages.push(page_no);
                if node::build(&mut buf, NodeKind::Leaf, gl, gh, &records[range.clone()]).is_err() {
                    return Err(self
                        .storage()
                        .corruption(Some(page_no), "leaf did not fit its page"));
                }
                let mut node = NodeMut::from_bytes(&mut buf);
                node.set_disk_page(Some(page_no));
                if damaged {
                    node.set_flags(FLAG_DAMAGED);
                }
                bufs.push(buf);
            }
            store.write_batch(&pages, &mut bufs)?;
            for (&page, buf) in pages.iter().zip(&bufs) {
                self.storage()
                    .blobs()
                    .page_written(page, NodeRef::from_bytes(buf));
            }
            Ok(())
        };
        match built() {
            Ok(()) => Ok(pages),
            Err(e) => {
                for p in &pages {
                    let _ = store.free(*p);
                }
                Err(e)
            }
        }
    }

    /// Frees the page ids of leaves removed while their guard belonged to someone else.
    /// Called with no leaf lock held.
    pub(crate) fn drain_orphans(&self) {
        for pid in self.storage().pages().take_orphans() {
            self.pool().write(pid).remove();
        }
    }
}
