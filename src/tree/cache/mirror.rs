//! Full-page mirrors (paper §5.5): a mini-page merged with its disk leaf into a copy of the
//! whole leaf (on a write, or kept by a scan that read the leaf), leaf splits when the
//! records outgrow a page, the move of a mini-page to the tail of the buffer
//! (copy-on-access, §4.1), and the removal of an emptied leaf.
//!
//! Like `leaf.rs`, everything here runs with the leaf's lock held, and a function that
//! needs memory it cannot get restarts before changing anything.

use super::leaf::{node_records, with_page_buf, Written};
use crate::error::{Error, Result};
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind};
use crate::pool::{Location, WriteGuard};
use crate::tree::index::{Bounds, Entry, Path};
use crate::tree::stats::Event;
use crate::tree::{Attempt, Restart, Shared, Step, FLAG_DAMAGED, FLAG_DIRTY, NO_PAGE};

impl Shared {
    /// Keeps a leaf read from disk page `disk` in memory as a full-page mirror, merged with
    /// its mini-page if it has one, so the next scan needs no I/O (paper §5.3), or the next
    /// lookup when whole leaves are cached (`whole_leaves.rs`). Best effort and never
    /// evicts: a read does not write to disk. Returns whether it did.
    pub(in crate::tree) fn mirror_read_leaf<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        leaf: NodeRef<'_>,
        disk: u64,
    ) -> bool {
        if leaf.flags() & FLAG_DAMAGED != 0 {
            // A mirror would answer for the keys the damaged leaf lost.
            return false;
        }
        let (records, dirty) = match page.mini() {
            Some(b) => {
                let mini = NodeRef::from_bytes(b);
                let fold =
                    &mut |k: &[u8], b: Option<&[u8]>, ops: &[u8]| self.fold_or_mark(k, b, ops);
                let Ok(records) = node::merge_sorted(leaf, mini, fold) else {
                    return false;
                };
                (records, mini.dirty_count() > 0)
            }
            None => (node_records(leaf), false),
        };
        let (low, high) = path.bounds();
        // Records that need more than a page wait for a write to split them.
        let Some(size) = self.mirror_size(&records, low.as_deref(), high.as_deref()) else {
            return false;
        };
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return false;
        };
        if node::build(
            block.bytes_mut(),
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
            &records,
        )
        .is_err()
        {
            return false;
        }
        let mut node = NodeMut::from_bytes(block.bytes_mut());
        node.set_disk_page(Some(disk));
        node.set_flags(if dirty { FLAG_DIRTY } else { 0 });
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        true
    }

    /// The block the mirror of a leaf read from disk (`records`) takes: the smallest size
    /// class that holds them, or `None` if they need more than a page (exactly when
    /// `leaf_groups` would cut them). Leaves filled by random inserts are about 70 %
    /// full, so whole-page mirrors left a 282 MiB cache short of 5M records (16 B keys and
    /// values) that fit it this way (`BFKV_CENSUS`). A write that does not fit grows the
    /// mirror by a quarter, up to a page (`leaf.rs`); past a page the leaf splits. Mirrors
    /// made for writes take `written_mirror_size`.
    fn mirror_size(
        &self,
        records: &[Record],
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Option<usize> {
        let page = self.page_size();
        let need = node::built_len(records, page, low, high);
        (need <= page).then(|| crate::pool::block_size_for(need).map_or(page, |s| s.min(page)))
    }

    /// The block a mirror built for writes (`to_mirror`, `split_into`, a batch's rebuild)
    /// takes for `records` between `bounds`. A page, with room for the writes that keep
    /// coming; but while the cache holds whole leaves (`whole_leaves.rs`), the smallest size
    /// class holding a quarter more than they need, which a write that does not fit grows by
    /// a quarter (`leaf.rs`). Leaves filled by random inserts are about 70 % full, so
    /// page-sized blocks overfill a cache sized for every leaf in its class: loading 5M
    /// records (16 B keys and values) into 281 MiB that way evicted 2.6k leaves, which the
    /// lookups after the load then read back one at a time.
    pub(in crate::tree) fn written_mirror_size(
        &self,
        records: &[Record],
        (low, high): (Option<&[u8]>, Option<&[u8]>),
    ) -> usize {
        let page = self.page_size();
        if !self.caches_whole_leaves() {
            return page;
        }
        let need = node::built_len(records, page, low, high);
        match crate::pool::block_size_for(need + need / 4) {
            // A node smaller than a page may keep a shorter prefix (`max_prefix_len`).
            Some(size) if size < page && node::built_len(records, size, low, high) <= size => size,
            _ => page,
        }
    }

    /// Merges the mini-page with its disk leaf into a full-page mirror (paper §5.5), or
    /// splits when the merged records need more than a page.
    pub(in crate::tree) fn to_mirror<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
    ) -> Attempt<()> {
        let Some(bytes) = page.mini() else {
            return Ok(Step::Restart(Restart::Retry));
        };
        let mini = NodeRef::from_bytes(bytes);
        let disk = mini.disk_page();
        let bounds = path.bounds();
        let records = self.leaf_records(&bounds, Some(mini), disk)?;
        let dirty = mini.dirty_count() > 0;
        self.counters().count(Event::Merge);
        let (low, high) = bounds;
        let groups = self.leaf_groups(&records, low.as_deref(), high.as_deref(), false);
        if groups.len() > 1 {
            // The merged records need several leaves. After the split the pending write may
            // belong to a new sibling, so the operation restarts from the root.
            let key = records[0].key.clone();
            return Ok(self
                .split_into(path, page, &key, &records, &groups, disk)?
                .then_retry());
        }
        let size = self.written_mirror_size(&records, (low.as_deref(), high.as_deref()));
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return Ok(Step::Restart(Restart::NeedSpace));
        };
        let built = node::build(
            block.bytes_mut(),
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
            &records,
        );
        if built.is_err() {
            return Ok(Step::Restart(Restart::Retry));
        }
        let mut node = NodeMut::from_bytes(block.bytes_mut());
        node.set_disk_page(disk);
        node.set_flags(if dirty || disk.is_none() {
            FLAG_DIRTY
        } else {
            0
        });
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        Ok(Step::Done(()))
    }

    /// Every record of a leaf with `bounds` whose buffered node is `mini` (if any) over disk
    /// page `disk` (if any): the disk leaf's records with the mini-page's merged over them
    /// (newest wins, tombstones hide), as a mirror of the leaf would hold them.
    ///
    /// # Errors
    /// `Io` or `Corruption` reading the page (`Storage::check_leaf_in`); `Corruption` for a
    /// damaged leaf, which a mirror (claiming every record) cannot stand for.
    pub(in crate::tree) fn leaf_records(
        &self,
        bounds: &Bounds,
        mini: Option<NodeRef<'_>>,
        disk: Option<u64>,
    ) -> Result<Vec<Record>> {
        let Some(p) = disk else {
            return match mini {
                Some(mini) => self.live_folded(mini),
                None => Ok(Vec::new()),
            };
        };
        with_page_buf(self.page_size(), |buf| {
            self.storage().read_page(p, buf)?;
            let (low, high) = bounds;
            let leaf = self
                .storage()
                .check_leaf_in(p, buf, low.as_deref(), high.as_deref())?;
            if leaf.flags() & FLAG_DAMAGED != 0 {
                return Err(self
                    .storage()
                    .corruption(Some(p), "a damaged leaf cannot take more writes"));
            }
            match mini {
                Some(mini) => node::merge_sorted(leaf, mini, &mut |k, base, ops| {
                    self.fold_or_mark(k, base, ops)
                }),
                None => Ok(node_records(leaf)),
            }
        })
    }

    /// The records of a leaf whose mini-page `mini` has no page below it: its present
    /// records, pending merges folded over no value.
    ///
    /// # Errors
    /// As [`Shared::fold`].
    pub(in crate::tree) fn live_folded(&self, mini: NodeRef<'_>) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(mini.len());
        for mut r in node_records(mini) {
            if r.kind == RecordKind::Upsert {
                let Some(v) = self.fold_or_mark(&r.key, None, &r.value)? else {
                    continue;
                };
                r.value = node::Bytes::from_slice(&v);
            } else if !r.kind.exists() {
                continue;
            }
            r.kind = RecordKind::Insert;
            out.push(r);
        }
        Ok(out)
    }

    /// Rebuilds a mirror from `records` with the leaf's current bounds, splitting if they do
    /// not fit one page.
    pub(in crate::tree) fn rebuild_leaf<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        records: &[Record],
    ) -> Attempt<Written> {
        let disk = page.mini().and_then(|b| NodeRef::from_bytes(b).disk_page());
        let (low, high) = path.bounds();
        // `key` was written past every other record: an ascending insert, whose leaf is cut
        // where it is full rather than in half.
        let appended = records.last().is_some_and(|r| r.key.as_slice() == key);
        let groups = self.leaf_groups(records, low.as_deref(), high.as_deref(), appended);
        self.split_into(path, page, key, records, &groups, disk)
    }

    /// `records` cut into groups that each fit one leaf page between the fences `low` and
    /// `high`, with each group's low key (the first group's is the leaf's own low bound).
    /// `packed`: each group but the last as full as it can be (`node::split_records_packed`),
    /// for records appended past a leaf's end; else balanced by bytes.
    pub(in crate::tree) fn leaf_groups(
        &self,
        records: &[Record],
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        packed: bool,
    ) -> Vec<(std::ops::Range<usize>, Option<Vec<u8>>)> {
        let cut = if packed {
            node::split_records_packed
        } else {
            node::split_records
        };
        cut(records, self.page_size(), NodeKind::Leaf, low, high)
    }

    /// Installs `records`, cut into `groups`, as this leaf (the first group) and new leaves
    /// (the others), all full-page mirrors, and publishes the new separators.
    pub(in crate::tree) fn split_into<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        records: &[Record],
        groups: &[(std::ops::Range<usize>, Option<Vec<u8>>)],
        disk: Option<u64>,
    ) -> Attempt<Written> {
        let smo = if groups.len() > 1 {
            match self.index().try_smo() {
                Some(g) => Some(g),
                None => return Ok(Step::Restart(Restart::Retry)),
            }
        } else {
            None
        };
        let (low, high) = path.bounds();
        // Each group's bounds: the leaf's own low bound, then each group's low key.
        let bounds: Vec<_> = (0..groups.len())
            .map(|g| {
                let gl = if g == 0 {
                    low.as_deref()
                } else {
                    groups[g].1.as_deref()
                };
                let gh = match groups.get(g + 1) {
                    Some((_, next)) => next.as_deref(),
                    None => high.as_deref(),
                };
                (gl, gh)
            })
            .collect();
        let size = |g: usize| self.written_mirror_size(&records[groups[g].0.clone()], bounds[g]);
        // Allocate everything first so a full buffer leaves the tree unchanged.
        let Some(first) = self.pool().alloc(size(0), page.page_id()) else {
            return Ok(Step::Restart(Restart::NeedSpace));
        };
        let mut blocks = vec![first];
        let mut new_pages: Vec<WriteGuard<'_>> = Vec::new();
        for g in 1..groups.len() {
            let Some(new_page) = self.pool().insert_page(Location::Disk(NO_PAGE)) else {
                for p in new_pages {
                    p.remove();
                }
                return Err(Error::too_many_leaves());
            };
            if let Some(b) = self.pool().alloc(size(g), new_page.page_id()) {
                blocks.push(b);
                new_pages.push(new_page);
            } else {
                new_page.remove();
                for p in new_pages {
                    p.remove();
                }
                return Ok(Step::Restart(Restart::NeedSpace));
            }
        }
        let mut entries = Vec::with_capacity(groups.len());
        for (g, ((range, _), block)) in groups.iter().zip(blocks.iter_mut()).enumerate() {
            let (gl, gh) = bounds[g];
            if node::build(
                block.bytes_mut(),
                NodeKind::Leaf,
                gl,
                gh,
                &records[range.clone()],
            )
            .is_err()
            {
                // `split_records` sized each group for a page; undo and retry rather than lose data.
                debug_assert!(false, "a split group did not fit its page");
                for p in new_pages {
                    p.remove();
                }
                return Ok(Step::Restart(Restart::Retry));
            }
            let mut node = NodeMut::from_bytes(block.bytes_mut());
            node.set_disk_page(if g == 0 { disk } else { None });
            node.set_flags(FLAG_DIRTY);
            let pid = if g == 0 {
                page.page_id()
            } else {
                new_pages[g - 1].page_id()
            };
            entries.push(Entry::leaf(gl.map(<[u8]>::to_vec).unwrap_or_default(), pid));
        }
        let mut blocks = blocks.into_iter();
        if let Some(old) = blocks.next().and_then(|b| page.set_mini(b)) {
            self.pool().dealloc(old);
        }
        for (new_page, block) in new_pages.iter_mut().zip(blocks) {
            new_page.set_mini(block);
        }
        if let Some(smo) = &smo {
            let published = self.publish(smo, key, page.page_id(), entries);
            debug_assert!(published);
            self.counters().count(Event::Split);
        }
        drop(new_pages);
        drop(smo);
        Ok(Step::Done(Written::Done))
    }

    /// Moves a mini-page touched in the copy-on-access region to the tail, dropping cold clean
    /// records (paper §4.1, §5.5). Best effort: without memory it stays where it is.
    ///
    /// A clean full-page mirror keeps only its referenced records, as a mini-page of cached
    /// answers: read-only traffic would otherwise keep moving whole pages for the few hot
    /// records in each (after a load, most of the cache is such pages), crowding out the hot
    /// records of other leaves. One with no referenced record is dropped. A dirty mirror
    /// moves whole: its changes are only in memory. So does every mirror while the cache
    /// holds whole leaves (`whole_leaves.rs`).
    pub(crate) fn copy_to_tail<'p>(&'p self, page: &mut WriteGuard<'p>) {
        let Some(bytes) = page.mini() else { return };
        let node = NodeRef::from_bytes(bytes);
        let mirror = node.kind() == NodeKind::Leaf;
        if let Some(disk) = node
            .disk_page()
            .filter(|_| mirror && node.flags() & FLAG_DIRTY == 0 && !self.caches_whole_leaves())
        {
            let need = node::filtered_len(node, |_, referenced| referenced);
            let size = crate::pool::block_size_for(need).unwrap_or(usize::MAX);
            if size < node.size() {
                self.shrink_mirror(page, disk, size);
                return;
            }
        }
        let keep = |kind: RecordKind, referenced: bool| mirror || kind.is_dirty() || referenced;
        // A mini-page moves into the smallest block its kept records fit: dropping cold
        // records without shrinking left the moved mini-pages 61 % full on a steady YCSB-C
        // (`BFKV_CENSUS`).
        // A clean mirror moving whole (the cache holds whole leaves) takes the smallest
        // class that holds it; a dirty one keeps its room for the writes it is getting.
        let size = if mirror && node.flags() & FLAG_DIRTY != 0 {
            node.size()
        } else {
            let need = node::filtered_len(node, keep);
            crate::pool::block_size_for(need).map_or(node.size(), |s| s.min(node.size()))
        };
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return;
        };
        if node::copy_filtered(node, block.bytes_mut(), keep, true).is_err() {
            return;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        self.counters().count(Event::CopiedToTail);
    }

    /// Replaces the clean mirror of `page` (a copy of disk page `disk`) with a mini-page of
    /// `size` bytes holding its referenced records, or with nothing if none is referenced.
    fn shrink_mirror<'p>(&'p self, page: &mut WriteGuard<'p>, disk: u64, size: usize) {
        let Some(bytes) = page.mini() else { return };
        let node = NodeRef::from_bytes(bytes);
        if (0..node.len()).all(|i| !node.ref_bit(i)) {
            if let Some(old) = page.set_location_disk(disk) {
                self.pool().dealloc(old);
            }
            self.counters().count(Event::MirrorShrunk);
            return;
        }
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return;
        };
        if node::mini_from_mirror(node, block.bytes_mut()).is_err() {
            return;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        self.counters().count(Event::MirrorShrunk);
    }

    /// Removes an emptied leaf from the tree (unless it is the only one or the structure lock
    /// is busy: an empty leaf is harmless and is retried on the next removal).
    pub(in crate::tree) fn remove_empty_leaf<'p>(&'p self, key: &[u8], page: WriteGuard<'p>) {
        let Some(smo) = self.index().try_smo() else {
            return;
        };
        let pid = page.page_id();
        if !self.publish(&smo, key, pid, Vec::new()) {
            return;
        }
        let mut page = page;
        let disk = page.mini().and_then(|b| NodeRef::from_bytes(b).disk_page());
        if let Some(old) = page.set_location_disk(NO_PAGE) {
            self.pool().dealloc(old);
        }
        if let Some(d) = disk {
            self.storage().supersede(d);
        }
        self.storage().pages().forget_leaf(pid);
        page.remove();
        self.counters().count(Event::LeafRemoved);
    }
}

#[cfg(all(test, not(shuttle)))]
#[path = "mirror_tests.rs"]
mod tests;
