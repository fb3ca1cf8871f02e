//! Leaf and mini-page operations (paper §5): get with promotion, buffered writes, growth
//! through the pool's size classes, conversion to a full-page mirror, leaf splits and
//! empty-leaf removal.
//!
//! Every function here runs with the leaf's lock held (taken in `tree/mod.rs`). A function
//! that needs memory it cannot get returns `Restart::NeedSpace` *before* changing anything,
//! so the caller can release the lock, evict, and try again with the tree unchanged.

use std::cell::RefCell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::inner::{ChildRef, Entry, Path};
use super::{Attempt, Restart, Shared, WriteOp, FLAG_DIRTY, NO_PAGE};
use crate::error::{Error, Result};
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind, Search};
use crate::pool::{Location, ReadGuard, WriteGuard};
use crate::store::PageBuf;
use crate::sync::Ordering;

/// Bytes a mini-page needs beyond its one record: header, two fence metas, fence stubs
/// (prefix + 2 bytes, of which the prefix also shortens the key), one record meta.
const MINI_OVERHEAD: usize = node::HEADER_SIZE + 16 + 2 + 8;

thread_local! {
    static PAGE_BUF: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
    static RNG: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's page buffer (a fresh one if it is in use further up the
/// stack, e.g. an eviction started from inside a read).
pub(crate) fn with_page_buf<R>(page_size: usize, f: impl FnOnce(&mut PageBuf) -> R) -> R {
    let cached = PAGE_BUF
        .with(|b| b.borrow_mut().take())
        .filter(|b| b.len() == page_size);
    let mut buf = cached.unwrap_or_else(|| PageBuf::new(page_size));
    let out = f(&mut buf);
    PAGE_BUF.with(|b| *b.borrow_mut() = Some(buf));
    out
}

/// A uniform number in 0..100 from a per-thread generator.
pub(super) fn percent_roll() -> u8 {
    RNG.with(|r| {
        let mut r = r.borrow_mut();
        let rng = r.get_or_insert_with(|| {
            SmallRng::from_rng(rand::thread_rng())
                .unwrap_or_else(|_| SmallRng::seed_from_u64(0x5eed))
        });
        rng.gen_range(0..100)
    })
}

/// Every record of a node, owned, in key order.
pub(crate) fn node_records(node: NodeRef<'_>) -> Vec<Record> {
    let mut key = Vec::new();
    (0..node.len())
        .map(|i| {
            node.key_into(i, &mut key);
            Record {
                key: node::Bytes::from_slice(&key),
                value: node::Bytes::from_slice(node.value(i)),
                kind: node.record_kind(i),
            }
        })
        .collect()
}

/// The records a leaf with no disk page holds: a mini-page's present records, as inserts.
pub(crate) fn live_records(node: NodeRef<'_>) -> Vec<Record> {
    node_records(node)
        .into_iter()
        .filter(|r| r.kind.exists())
        .map(|r| Record {
            kind: RecordKind::Insert,
            ..r
        })
        .collect()
}

/// Applies a write to sorted records.
fn apply(records: &mut Vec<Record>, key: &[u8], op: WriteOp<'_>) {
    let at = records.binary_search_by(|r| r.key.as_slice().cmp(key));
    match (op, at) {
        (WriteOp::Put(v), Ok(i)) => {
            records[i].value = node::Bytes::from_slice(v);
            records[i].kind = RecordKind::Insert;
        }
        (WriteOp::Put(v), Err(i)) => records.insert(
            i,
            Record {
                key: node::Bytes::from_slice(key),
                value: node::Bytes::from_slice(v),
                kind: RecordKind::Insert,
            },
        ),
        (WriteOp::Delete, Ok(i)) => {
            records.remove(i);
        }
        (WriteOp::Delete, Err(_)) => {}
    }
}

/// What a buffered write left behind.
pub(crate) enum Written {
    Done,
    /// The leaf (a mirror) has no records left.
    Emptied,
}

impl Shared {
    /// Checks that a page read from disk is a well-formed leaf.
    pub(crate) fn check_leaf<'b>(&self, page: u64, buf: &'b [u8]) -> Result<NodeRef<'b>> {
        // The store verified the page's checksum before returning it.
        let node = NodeRef::from_checksummed(buf)
            .map_err(|e| Error::corruption(&self.data_path, Some(page), e.0))?;
        if node.kind() != NodeKind::Leaf {
            return Err(Error::corruption(
                &self.data_path,
                Some(page),
                "page is not a leaf",
            ));
        }
        Ok(node)
    }

    /// Whether a lookup of `key` served from a disk leaf caches its answer: always on the
    /// key's second miss within the doorkeeper's window (`admit.rs`), and on a first miss
    /// with the configured probability, so a cold cache still fills quickly. Never when the
    /// probability is 0 (promotion off).
    fn promotes(&self, key: &[u8]) -> bool {
        let p = self.config.promotion_percent;
        // Every miss is cached at 100: nothing for the doorkeeper to tell apart. Below, the
        // doorkeeper goes first: it must see every miss to count second ones.
        p >= 100 || (p > 0 && (self.doorkeeper.admit(key) || p > percent_roll()))
    }

    /// Looks `key` up in a read-locked leaf. Returns the value and whether a promotion
    /// found the buffer full (the caller evicts after releasing the lock).
    pub(super) fn get_in_leaf(
        &self,
        path: &Path<'_>,
        page: ReadGuard<'_>,
        key: &[u8],
    ) -> Result<(Option<Vec<u8>>, bool)> {
        let mut disk_page = match page.location() {
            Location::Disk(p) => Some(p),
            Location::Mini(_) => None,
        };
        if let (Some(bytes), Location::Mini(addr)) = (page.mini(), page.location()) {
            let node = NodeRef::from_bytes(bytes);
            if let Some((i, kind, value)) = node.get(key) {
                self.counters
                    .hot()
                    .cache_hits
                    .fetch_add(1, Ordering::Relaxed);
                let out = kind.exists().then(|| value.to_vec());
                let needs_ref = !node.ref_bit(i);
                let move_to_tail = self.pool.is_copy_on_access(addr);
                if needs_ref || move_to_tail {
                    // Best effort: only when no other reader holds the leaf.
                    if let Ok(mut w) = page.try_upgrade() {
                        if let Some(bytes) = w.mini_mut() {
                            NodeMut::from_bytes(bytes).set_ref_bit(i, true);
                        }
                        if move_to_tail {
                            self.copy_to_tail(&mut w);
                        }
                    }
                }
                return Ok((out, false));
            }
            if node.kind() == NodeKind::Leaf {
                // A full-page mirror holds every record: absent here means absent.
                self.counters
                    .hot()
                    .cache_hits
                    .fetch_add(1, Ordering::Relaxed);
                return Ok((None, false));
            }
            disk_page = node.disk_page();
        }
        let Some(disk) = disk_page.filter(|p| *p != NO_PAGE) else {
            return Ok((None, false));
        };
        self.counters
            .hot()
            .cache_misses
            .fetch_add(1, Ordering::Relaxed);
        with_page_buf(self.page_size, |buf| {
            self.read_page(disk, buf)?;
            let leaf = self.check_leaf(disk, buf)?;
            let value = leaf
                .get(key)
                .and_then(|(_, kind, v)| kind.exists().then(|| v.to_vec()));
            let mut wants_room = false;
            if self.promotes(key) {
                if let Ok(mut w) = page.try_upgrade() {
                    let (v, kind) = match &value {
                        Some(v) => (v.as_slice(), RecordKind::Cache),
                        None => (&[][..], RecordKind::Phantom),
                    };
                    match self.put_buffered(path, &mut w, key, v, kind)? {
                        Ok(_) => {
                            self.counters
                                .hot()
                                .promotions
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Restart::NeedSpace) => wants_room = true,
                        Err(Restart::Retry) => {}
                    }
                }
            }
            Ok((value, wants_room))
        })
    }

    /// Applies a write to a write-locked leaf.
    pub(super) fn write_in_leaf<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        op: WriteOp<'_>,
    ) -> Attempt<Written> {
        let (value, kind) = match op {
            WriteOp::Put(v) => (v, RecordKind::Insert),
            WriteOp::Delete => (&[][..], RecordKind::Tombstone),
        };
        self.put_buffered(path, page, key, value, kind)
    }

    /// Puts one record into the leaf's buffered node: creates a mini-page, grows it, turns it
    /// into a full-page mirror (writes only) or splits the leaf as needed.
    pub(super) fn put_buffered<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        value: &[u8],
        kind: RecordKind,
    ) -> Attempt<Written> {
        let mut shed = false;
        loop {
            let addr = match page.location() {
                Location::Disk(disk) => {
                    return self.create_mini(path, page, disk, key, value, kind)
                }
                Location::Mini(addr) => addr,
            };
            if self.pool.is_copy_on_access(addr) {
                self.copy_to_tail(page);
            }
            let Some(bytes) = page.mini_mut() else {
                return Ok(Err(Restart::Retry));
            };
            let mut node = NodeMut::from_bytes(bytes);
            let (is_mirror, size, prefix_ok) = {
                let r = node.as_ref();
                (
                    r.kind() == NodeKind::Leaf,
                    r.size(),
                    key.starts_with(r.prefix()),
                )
            };
            if !prefix_ok {
                // The leaf's range widened (a neighbour was removed) past the prefix this
                // node was built with: rebuild it with the current bounds.
                if !kind.is_dirty() {
                    return Ok(Ok(Written::Done));
                }
                if is_mirror {
                    let mut records = node_records(node.as_ref());
                    apply(&mut records, key, write_op(value, kind));
                    return self.rebuild_leaf(path, page, key, records);
                }
                match self.to_mirror(path, page)? {
                    Ok(()) => continue,
                    Err(r) => return Ok(Err(r)),
                }
            }
            if is_mirror {
                let result = match kind {
                    RecordKind::Insert | RecordKind::Upsert => {
                        node.upsert(key, value, RecordKind::Insert).map(|_| ())
                    }
                    RecordKind::Tombstone => {
                        if let Search::Found(i) = node.as_ref().search(key) {
                            node.remove_at(i);
                        }
                        Ok(())
                    }
                    // A mirror already holds every record: nothing to cache.
                    RecordKind::Cache | RecordKind::Phantom => return Ok(Ok(Written::Done)),
                };
                match result {
                    Ok(()) => {
                        let flags = node.as_ref().flags();
                        node.set_flags(flags | FLAG_DIRTY);
                        if node.as_ref().is_empty() {
                            return Ok(Ok(Written::Emptied));
                        }
                        return Ok(Ok(Written::Done));
                    }
                    Err(node::NoSpace) => {
                        let mut records = node_records(node.as_ref());
                        apply(&mut records, key, write_op(value, kind));
                        return self.rebuild_leaf(path, page, key, records);
                    }
                }
            }
            // A mini-page: a removal of a key already known absent changes nothing.
            if kind == RecordKind::Tombstone
                && matches!(node.as_ref().get(key), Some((_, k, _)) if !k.exists())
            {
                return Ok(Ok(Written::Done));
            }
            if node.upsert(key, value, kind).is_ok() {
                return Ok(Ok(Written::Done));
            }
            // Full: grow to the smallest size class holding a quarter more (and the new
            // record) up to the merge threshold, else merge into a mirror. Classes four per
            // doubling keep mini-pages fuller than doubling did (`pool::size`); growing by a
            // quarter rather than a half cut a 2-thread load's page reads and writes per
            // insert by 5 % (0.0476/0.0545 -> 0.0450/0.0522) at no cost in throughput.
            let need = needed(node.as_ref(), key, value);
            let threshold = self.config.merge_threshold_bytes();
            let grown = match crate::pool::block_size_for((size + size / 4).max(need)) {
                Some(g) if g <= threshold => Some(g),
                // Short of a quarter more, the last class under the threshold still
                // takes this record: use it before turning into a mirror.
                _ => {
                    crate::pool::largest_class_within(threshold).filter(|&g| g > size && need <= g)
                }
            }
            .unwrap_or(usize::MAX);
            if grown <= threshold {
                match self.grow(page, grown)? {
                    Ok(()) => continue,
                    Err(r) => return Ok(Err(r)),
                }
            }
            if !kind.is_dirty() {
                // A cached answer never turns a mini-page into a full-page mirror: that would
                // fill memory with the leaf's cold records. Shed the mini-page's own cold clean
                // records instead (as copy-on-access does), once; without room, skip caching.
                if shed {
                    return Ok(Ok(Written::Done));
                }
                shed = true;
                if !self.shed_cold(page) {
                    return Ok(Ok(Written::Done));
                }
                continue;
            }
            match self.to_mirror(path, page)? {
                Ok(()) => continue,
                Err(r) => return Ok(Err(r)),
            }
        }
    }

    /// A new mini-page for a leaf that has none, holding one record.
    fn create_mini<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        disk: u64,
        key: &[u8],
        value: &[u8],
        kind: RecordKind,
    ) -> Attempt<Written> {
        if kind == RecordKind::Tombstone && disk == NO_PAGE {
            return Ok(Ok(Written::Done));
        }
        let size = crate::pool::block_size_for(MINI_OVERHEAD + key.len() + value.len())
            .map_or(self.page_size, |s| s.min(self.page_size));
        let Some(mut block) = self.pool.alloc(size, page.page_id()) else {
            return Ok(Err(Restart::NeedSpace));
        };
        let (low, high) = path.bounds();
        let mut node = NodeMut::init(
            block.bytes_mut(),
            NodeKind::Mini,
            low.as_deref(),
            high.as_deref(),
        );
        node.set_disk_page((disk != NO_PAGE).then_some(disk));
        if node.upsert(key, value, kind).is_err() {
            // The size above covers one record with any prefix; keep the tree unchanged.
            debug_assert!(false, "a fresh mini-page did not fit its record");
            return Ok(Err(Restart::Retry));
        }
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        Ok(Ok(Written::Done))
    }

    /// Moves the mini-page into a block of `size` bytes.
    fn grow<'p>(&'p self, page: &mut WriteGuard<'p>, size: usize) -> Attempt<()> {
        let Some(mut block) = self.pool.alloc(size, page.page_id()) else {
            return Ok(Err(Restart::NeedSpace));
        };
        let Some(bytes) = page.mini() else {
            return Ok(Err(Restart::Retry));
        };
        if node::copy_filtered(
            NodeRef::from_bytes(bytes),
            block.bytes_mut(),
            |_, _| true,
            false,
        )
        .is_err()
        {
            return Ok(Err(Restart::Retry));
        }
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        self.counters.mini_grows.fetch_add(1, Ordering::Relaxed);
        Ok(Ok(()))
    }

    /// Rewrites the mini-page without its clean records whose reference bit is clear,
    /// clearing the others' bits. False if it had none to drop or no memory was free.
    fn shed_cold<'p>(&'p self, page: &mut WriteGuard<'p>) -> bool {
        let Some(bytes) = page.mini() else {
            return false;
        };
        let node = NodeRef::from_bytes(bytes);
        let cold = (0..node.len()).any(|i| !node.record_kind(i).is_dirty() && !node.ref_bit(i));
        if !cold {
            return false;
        }
        let Some(mut block) = self.pool.alloc(node.size(), page.page_id()) else {
            return false;
        };
        let keep = |kind: RecordKind, referenced: bool| kind.is_dirty() || referenced;
        if node::copy_filtered(node, block.bytes_mut(), keep, true).is_err() {
            return false;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        true
    }

    /// Merges the mini-page with its disk leaf into a full-page mirror (paper §5.5), or
    /// splits when the merged records need more than a page.
    fn to_mirror<'p>(&'p self, path: &Path<'_>, page: &mut WriteGuard<'p>) -> Attempt<()> {
        let Some(bytes) = page.mini() else {
            return Ok(Err(Restart::Retry));
        };
        let mini = NodeRef::from_bytes(bytes);
        let disk = mini.disk_page();
        let records = match disk {
            Some(p) => with_page_buf(self.page_size, |buf| -> Result<Vec<Record>> {
                self.read_page(p, buf)?;
                Ok(node::merge_sorted(self.check_leaf(p, buf)?, mini))
            })?,
            None => live_records(mini),
        };
        let dirty = mini.dirty_count() > 0;
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        let (low, high) = path.bounds();
        let groups = node::split_records(
            &records,
            self.page_size,
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
        );
        if groups.len() > 1 {
            // The merged records need several leaves. After the split the pending write may
            // belong to a new sibling, so the operation restarts from the root.
            let key = records[0].key.clone();
            return Ok(
                match self.split_into(path, page, &key, &records, groups, disk)? {
                    Ok(_) => Err(Restart::Retry),
                    Err(r) => Err(r),
                },
            );
        }
        let Some(mut block) = self.pool.alloc(self.page_size, page.page_id()) else {
            return Ok(Err(Restart::NeedSpace));
        };
        let built = node::build(
            block.bytes_mut(),
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
            &records,
        );
        if built.is_err() {
            return Ok(Err(Restart::Retry));
        }
        let mut node = NodeMut::from_bytes(block.bytes_mut());
        node.set_disk_page(disk);
        node.set_flags(if dirty || disk.is_none() {
            FLAG_DIRTY
        } else {
            0
        });
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        Ok(Ok(()))
    }

    /// Rebuilds a mirror from `records` with the leaf's current bounds, splitting if they do
    /// not fit one page.
    fn rebuild_leaf<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        records: Vec<Record>,
    ) -> Attempt<Written> {
        let disk = page.mini().and_then(|b| NodeRef::from_bytes(b).disk_page());
        let (low, high) = path.bounds();
        let groups = node::split_records(
            &records,
            self.page_size,
            NodeKind::Leaf,
            low.as_deref(),
            high.as_deref(),
        );
        self.split_into(path, page, key, &records, groups, disk)
    }

    /// Installs `records`, cut into `groups`, as this leaf (the first group) and new leaves
    /// (the others), all full-page mirrors, and publishes the new separators.
    fn split_into<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        records: &[Record],
        groups: Vec<(std::ops::Range<usize>, Option<Vec<u8>>)>,
        disk: Option<u64>,
    ) -> Attempt<Written> {
        let smo = if groups.len() > 1 {
            match self.try_smo() {
                Some(g) => Some(g),
                None => return Ok(Err(Restart::Retry)),
            }
        } else {
            None
        };
        // Allocate everything first so a full buffer leaves the tree unchanged.
        let Some(first) = self.pool.alloc(self.page_size, page.page_id()) else {
            return Ok(Err(Restart::NeedSpace));
        };
        let mut blocks = vec![first];
        let mut new_pages: Vec<WriteGuard<'_>> = Vec::new();
        for _ in 1..groups.len() {
            let Some(new_page) = self.pool.insert_page(Location::Disk(NO_PAGE)) else {
                for p in new_pages {
                    p.remove();
                }
                return Err(Error::too_many_leaves());
            };
            match self.pool.alloc(self.page_size, new_page.page_id()) {
                Some(b) => {
                    blocks.push(b);
                    new_pages.push(new_page);
                }
                None => {
                    new_page.remove();
                    for p in new_pages {
                        p.remove();
                    }
                    return Ok(Err(Restart::NeedSpace));
                }
            }
        }
        let (low, high) = path.bounds();
        let mut entries = Vec::with_capacity(groups.len());
        for (g, ((range, glow), block)) in groups.iter().zip(blocks.iter_mut()).enumerate() {
            let gl = if g == 0 {
                low.as_deref()
            } else {
                glow.as_deref()
            };
            let gh = match groups.get(g + 1) {
                Some((_, next)) => next.as_deref(),
                None => high.as_deref(),
            };
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
                return Ok(Err(Restart::Retry));
            }
            let mut node = NodeMut::from_bytes(block.bytes_mut());
            node.set_disk_page(if g == 0 { disk } else { None });
            node.set_flags(FLAG_DIRTY);
            let pid = if g == 0 {
                page.page_id()
            } else {
                new_pages[g - 1].page_id()
            };
            entries.push(Entry {
                key: gl.map(<[u8]>::to_vec).unwrap_or_default(),
                child: ChildRef::Leaf(pid),
            });
        }
        let mut blocks = blocks.into_iter();
        if let Some(old) = blocks.next().and_then(|b| page.set_mini(b)) {
            self.pool.dealloc(old);
        }
        for (new_page, block) in new_pages.iter_mut().zip(blocks) {
            new_page.set_mini(block);
        }
        if let Some(smo) = &smo {
            let published = self.publish(smo, key, page.page_id(), entries);
            debug_assert!(published);
            self.counters.splits.fetch_add(1, Ordering::Relaxed);
        }
        drop(new_pages);
        drop(smo);
        Ok(Ok(Written::Done))
    }

    /// Moves a mini-page touched in the copy-on-access region to the tail, dropping cold clean
    /// records (paper §4.1, §5.5). Best effort: without memory it stays where it is.
    ///
    /// A clean full-page mirror keeps only its referenced records, as a mini-page of cached
    /// answers: read-only traffic would otherwise keep moving whole pages for the few hot
    /// records in each (after a load, most of the cache is such pages), crowding out the hot
    /// records of other leaves. One with no referenced record is dropped. A dirty mirror
    /// moves whole: its changes are only in memory.
    pub(crate) fn copy_to_tail<'p>(&'p self, page: &mut WriteGuard<'p>) {
        let Some(bytes) = page.mini() else { return };
        let node = NodeRef::from_bytes(bytes);
        let mirror = node.kind() == NodeKind::Leaf;
        if let Some(disk) = node
            .disk_page()
            .filter(|_| mirror && node.flags() & FLAG_DIRTY == 0)
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
        let size = if mirror {
            node.size()
        } else {
            let need = node::filtered_len(node, keep);
            crate::pool::block_size_for(need).map_or(node.size(), |s| s.min(node.size()))
        };
        let Some(mut block) = self.pool.alloc(size, page.page_id()) else {
            return;
        };
        if node::copy_filtered(node, block.bytes_mut(), keep, true).is_err() {
            return;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        self.counters.copied_to_tail.fetch_add(1, Ordering::Relaxed);
    }

    /// Replaces the clean mirror of `page` (a copy of disk page `disk`) with a mini-page of
    /// `size` bytes holding its referenced records, or with nothing if none is referenced.
    fn shrink_mirror<'p>(&'p self, page: &mut WriteGuard<'p>, disk: u64, size: usize) {
        let Some(bytes) = page.mini() else { return };
        let node = NodeRef::from_bytes(bytes);
        if (0..node.len()).all(|i| !node.ref_bit(i)) {
            if let Some(old) = page.set_location_disk(disk) {
                self.pool.dealloc(old);
            }
            self.counters.mirrors_shrunk.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(mut block) = self.pool.alloc(size, page.page_id()) else {
            return;
        };
        if node::mini_from_mirror(node, block.bytes_mut()).is_err() {
            return;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool.dealloc(old);
        }
        self.counters.mirrors_shrunk.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes an emptied leaf from the tree (unless it is the only one or the structure lock
    /// is busy: an empty leaf is harmless and is retried on the next removal).
    pub(super) fn remove_empty_leaf<'p>(&'p self, key: &[u8], page: WriteGuard<'p>) {
        let Some(smo) = self.try_smo() else { return };
        let pid = page.page_id();
        if !self.publish(&smo, key, pid, Vec::new()) {
            return;
        }
        let mut page = page;
        let disk = page.mini().and_then(|b| NodeRef::from_bytes(b).disk_page());
        if let Some(old) = page.set_location_disk(NO_PAGE) {
            self.pool.dealloc(old);
        }
        if let Some(d) = disk {
            self.pages.supersede(self, d);
        }
        self.pages.forget_leaf(pid);
        page.remove();
        self.counters.leaves_removed.fetch_add(1, Ordering::Relaxed);
    }
}

/// The write a record kind stands for.
fn write_op(value: &[u8], kind: RecordKind) -> WriteOp<'_> {
    if kind.exists() {
        WriteOp::Put(value)
    } else {
        WriteOp::Delete
    }
}

/// Bytes `node` needs to hold its content plus a record of `key` and `value`.
fn needed(node: NodeRef<'_>, key: &[u8], value: &[u8]) -> usize {
    node.used_bytes() + 8 + key.len().saturating_sub(node.prefix().len()) + value.len()
}
