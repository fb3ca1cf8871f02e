//! Writing buffered leaves back to disk: eviction (the block leaves memory) and checkpoints
//! (the block stays, made clean).
//!
//! Leaves are written shadow-style: always to a newly allocated page, never over the page
//! the last checkpoint references (see `persist.rs`), so a crash at any moment leaves the
//! last checkpoint intact.

use super::inner::{ChildRef, Entry, Path, Seek};
use super::leaf::{live_records, node_records, with_page_buf};
use super::{Attempt, Restart, Shared, FLAG_DIRTY, NO_PAGE};
use crate::error::Result;
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind};
use crate::pool::{EvictGuard, Location, PageId, WriteGuard};
use crate::store::{PageBuf, PageStore};
use crate::sync::{self, Arc, MutexGuard, Ordering};

/// What the caller wants done with the cached node once its changes are on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterWrite {
    /// Detach it: the mapping table points at the disk page (eviction).
    Detach,
    /// Keep it cached, marked clean (checkpoint).
    Keep,
}

/// What write-back asks the lock holder to do to the leaf's mapping entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Action {
    /// Point the entry at this disk page and drop the block.
    Detach(u64),
    /// Keep the block; it now matches this disk page (mark it clean).
    KeepClean(u64),
    /// Nothing changed on disk; keep the block as it is.
    Nothing,
}

impl Shared {
    /// The eviction callback: writes back the leaf whose block reached the head.
    pub(super) fn evict_block(&self, page: &mut EvictGuard<'_, '_>, bytes: &[u8]) -> Attempt<()> {
        Ok(
            match self.write_back(page.page_id(), bytes, AfterWrite::Detach, None)? {
                Ok(Action::Detach(disk)) | Ok(Action::KeepClean(disk)) => {
                    page.set_location_disk(disk);
                    Ok(())
                }
                Ok(Action::Nothing) => {
                    // Eviction must free the block: a clean node maps back to its disk page.
                    let disk = NodeRef::from_bytes(bytes).disk_page().unwrap_or(NO_PAGE);
                    page.set_location_disk(disk);
                    Ok(())
                }
                Err(r) => Err(r),
            },
        )
    }

    /// Writes back a write-locked leaf for a checkpoint and applies the resulting action.
    pub(super) fn checkpoint_leaf<'p>(
        &'p self,
        page: &mut WriteGuard<'p>,
        smo: Option<&MutexGuard<'_, ()>>,
    ) -> Attempt<()> {
        let Some(bytes) = page.mini() else {
            return Ok(Ok(()));
        };
        let action = match self.write_back(page.page_id(), bytes, AfterWrite::Keep, smo)? {
            Ok(a) => a,
            Err(r) => return Ok(Err(r)),
        };
        match action {
            Action::Detach(disk) => {
                if let Some(old) = page.set_location_disk(disk) {
                    self.pool.dealloc(old);
                }
            }
            Action::KeepClean(disk) => make_clean(page, disk),
            Action::Nothing => {}
        }
        Ok(Ok(()))
    }

    /// Writes a write-locked leaf's buffered changes to disk. A leaf that comes out empty is
    /// removed from the tree; one that overflows a page is split. `smo` is the structure lock
    /// if the caller holds it (checkpoints); otherwise it is tried, and `Retry` returned when
    /// busy.
    fn write_back(
        &self,
        pid: PageId,
        bytes: &[u8],
        after: AfterWrite,
        smo: Option<&MutexGuard<'_, ()>>,
    ) -> Attempt<Action> {
        let node = NodeRef::from_bytes(bytes);
        let disk = node.disk_page();
        let (records, route_key) = match node.kind() {
            NodeKind::Leaf => {
                let dirty = node.flags() & FLAG_DIRTY != 0 || disk.is_none();
                if !dirty {
                    return Ok(Ok(Action::Nothing));
                }
                let records = node_records(node);
                let route = records.first().map(|r| r.key.to_vec());
                (records, route)
            }
            _ => {
                if node.dirty_count() == 0 {
                    return Ok(Ok(Action::Nothing));
                }
                let mut route = Vec::new();
                node.key_into(0, &mut route);
                let records = match disk {
                    Some(p) => match self.merge_in_place(pid, node, p, after)? {
                        Ok(action) => return Ok(Ok(action)),
                        Err(records) => records,
                    },
                    None => live_records(node),
                };
                (records, Some(route))
            }
        };
        self.counters.write_backs.fetch_add(1, Ordering::Relaxed);

        let guard = sync::pin();
        // Bounds come from the structure: any key the leaf holds routes to it while we hold
        // its lock. A leaf with no key at all is written with its own (hint) fences.
        let path = route_key
            .as_deref()
            .map(|k| Path::descend(self.root_ref(&guard), Seek::Key(k)));
        if let Some(p) = &path {
            if p.leaf() != pid {
                debug_assert!(false, "leaf lock held but its key routes elsewhere");
                return Ok(Err(Restart::Retry));
            }
        }
        let (low, high) = match &path {
            Some(p) => p.bounds(),
            None => (None, None),
        };

        if records.is_empty() {
            if let Some(key) = &route_key {
                if self.unlink_empty(pid, disk, key, smo) {
                    return Ok(Ok(Action::Detach(NO_PAGE)));
                }
            }
        }

        let groups = node::split_records(
            &records,
            self.page_size,
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
        );
        if groups.len() > 1 {
            let local;
            let smo = match smo {
                Some(s) => s,
                None => match self.try_smo() {
                    Some(s) => {
                        local = s;
                        &local
                    }
                    None => return Ok(Err(Restart::Retry)),
                },
            };
            let key = route_key.as_deref().unwrap_or_default();
            return self.write_split(pid, disk, key, &records, &groups, high.as_deref(), smo);
        }

        let Some(store) = &self.store else {
            return Ok(Ok(Action::Nothing));
        };
        let new_page = with_page_buf(self.page_size, |buf| -> Result<u64> {
            buf.fill(0);
            if node::build(
                buf,
                NodeKind::Leaf,
                low.as_deref(),
                high.as_deref(),
                &records,
            )
            .is_err()
            {
                // `split_records` said one page suffices; never write a partial leaf.
                return Err(crate::error::Error::corruption(
                    &self.data_path,
                    None,
                    "leaf did not fit its page",
                ));
            }
            self.write_new_page(store, buf)
        })?;
        Ok(Ok(self.moved(pid, disk, new_page, after)))
    }

    /// Writes the leaf built in `buf` to a newly allocated page (freed again if the write
    /// fails) and returns the page.
    fn write_new_page(&self, store: &Arc<dyn PageStore>, buf: &mut PageBuf) -> Result<u64> {
        let page = store.allocate()?;
        NodeMut::from_bytes(buf).set_disk_page(Some(page));
        if let Err(e) = store.write(page, buf) {
            let _ = store.free(page);
            return Err(e);
        }
        Ok(page)
    }

    /// Records that leaf `pid` now lives in `new` instead of `old` and says what becomes of
    /// its cached node.
    fn moved(&self, pid: PageId, old: Option<u64>, new: u64, after: AfterWrite) -> Action {
        if let Some(old) = old {
            self.pages.supersede(self, old);
        }
        self.pages.written(pid, new);
        match after {
            AfterWrite::Detach => Action::Detach(new),
            AfterWrite::Keep => Action::KeepClean(new),
        }
    }

    /// The common case of writing back a mini-page: read its leaf, merge the dirty records
    /// into that page buffer in place, write it to a new page. Falls back (returning the
    /// merged records) when they overflow the page or leave it empty.
    fn merge_in_place(
        &self,
        pid: PageId,
        mini: NodeRef<'_>,
        disk: u64,
        after: AfterWrite,
    ) -> Result<std::result::Result<Action, Vec<Record>>> {
        let Some(store) = &self.store else {
            return Ok(Err(Vec::new()));
        };
        with_page_buf(self.page_size, |buf| {
            self.read_page(disk, buf)?;
            self.check_leaf(disk, buf)?;
            let merged = NodeMut::from_bytes(buf).merge_from(mini);
            // On failure `merge_from` left the leaf unchanged; an emptied leaf is unlinked
            // by the general path.
            if merged.is_err() || NodeRef::from_bytes(buf).is_empty() {
                return Ok(Err(node::merge_sorted(NodeRef::from_bytes(buf), mini)));
            }
            self.counters.write_backs.fetch_add(1, Ordering::Relaxed);
            let new_page = self.write_new_page(store, buf)?;
            Ok(Ok(self.moved(pid, Some(disk), new_page, after)))
        })
    }

    /// Removes an emptied leaf from the structure. Its page id is freed later by
    /// `drain_orphans` (the guard belongs to the caller, who detaches the block). False if it
    /// must stay (the only leaf, or the structure lock is busy).
    fn unlink_empty(
        &self,
        pid: PageId,
        disk: Option<u64>,
        key: &[u8],
        smo: Option<&MutexGuard<'_, ()>>,
    ) -> bool {
        let local;
        let smo = match smo {
            Some(s) => s,
            None => match self.try_smo() {
                Some(s) => {
                    local = s;
                    &local
                }
                None => return false,
            },
        };
        if !self.publish(smo, key, pid, Vec::new()) {
            return false;
        }
        if let Some(d) = disk {
            self.pages.supersede(self, d);
        }
        self.pages.forget_leaf(pid);
        self.pages.orphan(pid);
        self.counters.leaves_removed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Writes records that overflow one page as several leaves and publishes them.
    #[allow(clippy::too_many_arguments)]
    fn write_split(
        &self,
        pid: PageId,
        old_disk: Option<u64>,
        key: &[u8],
        records: &[Record],
        groups: &[(std::ops::Range<usize>, Option<Vec<u8>>)],
        high: Option<&[u8]>,
        smo: &MutexGuard<'_, ()>,
    ) -> Attempt<Action> {
        let Some(store) = &self.store else {
            return Ok(Ok(Action::Nothing));
        };
        // Ids for the new leaves first: running out of them must leave nothing to undo.
        let mut new_leaves = Vec::with_capacity(groups.len() - 1);
        for _ in 1..groups.len() {
            let Some(leaf) = self.pool.insert_page(Location::Disk(NO_PAGE)) else {
                new_leaves.into_iter().for_each(WriteGuard::remove);
                return Err(crate::error::Error::too_many_leaves());
            };
            new_leaves.push(leaf);
        }
        let guard = sync::pin();
        let path = Path::descend(self.root_ref(&guard), Seek::Key(key));
        let (low, _) = path.bounds();
        let pages = match self.write_leaves(&**store, low.as_deref(), high, records, groups) {
            Ok(pages) => pages,
            Err(e) => {
                new_leaves.into_iter().for_each(WriteGuard::remove);
                return Err(e);
            }
        };
        let mut entries = vec![Entry {
            key: low.clone().unwrap_or_default(),
            child: ChildRef::Leaf(pid),
        }];
        for ((g, page_no), mut new_leaf) in pages.iter().enumerate().skip(1).zip(new_leaves) {
            drop(new_leaf.set_location_disk(*page_no));
            self.pages.written(new_leaf.page_id(), *page_no);
            entries.push(Entry {
                key: groups[g].1.clone().unwrap_or_default(),
                child: ChildRef::Leaf(new_leaf.page_id()),
            });
        }
        let published = self.publish(smo, key, pid, entries);
        debug_assert!(published);
        self.counters.splits.fetch_add(1, Ordering::Relaxed);
        if let Some(old) = old_disk {
            self.pages.supersede(self, old);
        }
        self.pages.written(pid, pages[0]);
        Ok(Ok(Action::Detach(pages[0])))
    }

    /// Builds one leaf per group (the first bounded below by `low`, the last above by
    /// `high`) in newly allocated pages and writes them; returns the pages, in group order.
    /// On failure no page stays allocated.
    fn write_leaves(
        &self,
        store: &dyn PageStore,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        records: &[Record],
        groups: &[(std::ops::Range<usize>, Option<Vec<u8>>)],
    ) -> Result<Vec<u64>> {
        let mut pages = Vec::with_capacity(groups.len());
        let mut bufs = Vec::with_capacity(groups.len());
        let mut built = || -> Result<()> {
            for (g, (range, glow)) in groups.iter().enumerate() {
                let gl = if g == 0 { low } else { glow.as_deref() };
                let gh = groups.get(g + 1).map_or(high, |(_, next)| next.as_deref());
                let mut buf = PageBuf::new(self.page_size);
                let page_no = store.allocate()?;
                pages.push(page_no);
                if node::build(&mut buf, NodeKind::Leaf, gl, gh, &records[range.clone()]).is_err() {
                    return Err(crate::error::Error::corruption(
                        &self.data_path,
                        Some(page_no),
                        "leaf did not fit its page",
                    ));
                }
                NodeMut::from_bytes(&mut buf).set_disk_page(Some(page_no));
                bufs.push(buf);
            }
            store.write_batch(&pages, &mut bufs)
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
        for pid in self.pages.take_orphans() {
            self.pool.write(pid).remove();
        }
    }
}

/// After a checkpoint wrote the leaf to `disk`, the cached node matches disk: mark it clean.
fn make_clean(page: &mut WriteGuard<'_>, disk: u64) {
    let Some(bytes) = page.mini_mut() else { return };
    let mut node = NodeMut::from_bytes(bytes);
    node.set_disk_page(Some(disk));
    if node.as_ref().kind() == NodeKind::Leaf {
        let flags = node.as_ref().flags();
        node.set_flags(flags & !FLAG_DIRTY);
        return;
    }
    // A mini-page: its dirty records are now in the leaf; keep them as cached answers.
    for i in 0..node.as_ref().len() {
        match node.as_ref().record_kind(i) {
            RecordKind::Insert | RecordKind::Upsert => node.set_record_kind(i, RecordKind::Cache),
            RecordKind::Tombstone => node.set_record_kind(i, RecordKind::Phantom),
            RecordKind::Cache | RecordKind::Phantom => {}
        }
    }
}
