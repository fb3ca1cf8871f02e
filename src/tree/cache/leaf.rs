//! Leaf and mini-page writes (paper §5): buffered writes, growth
//! through the pool's size classes, conversion to a full-page mirror, leaf splits and
//! empty-leaf removal.
//!
//! Every function here runs with the leaf's lock held (taken in `tree/mod.rs`). A function
//! that needs memory it cannot get returns `Restart::NeedSpace` *before* changing anything,
//! so the caller can release the lock, evict, and try again with the tree unchanged.

use std::cell::RefCell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::Result;
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind, Search};
use crate::pool::{Location, WriteGuard};
use crate::store::PageBuf;
use crate::tree::index::Path;
use crate::tree::stats::Event;
use crate::tree::{Attempt, Restart, Shared, Step, WriteOp, FLAG_DIRTY, NO_PAGE};

/// Bytes a mini-page needs beyond its one record: header, two fence metas, fence stubs
/// (prefix + 2 bytes, of which the prefix also shortens the key), one record meta.
pub(in crate::tree) const MINI_OVERHEAD: usize = node::HEADER_SIZE + 16 + 2 + 8;

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

thread_local! {
    /// Scratch for a leaf's bounds, so reads check a page against them without allocating.
    static BOUNDS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Shared {
    /// `Storage::check_leaf_in` for page `disk` (read into `buf`) of the leaf `path` leads
    /// to, its bounds built in this thread's scratch: a read allocates nothing for it.
    pub(in crate::tree) fn check_leaf_of<'b>(
        &self,
        path: &Path<'_>,
        disk: u64,
        buf: &'b [u8],
    ) -> Result<NodeRef<'b>> {
        let check = |(low, high): &mut (Vec<u8>, Vec<u8>)| {
            let has_low = path.low_into(low);
            let has_high = path.high_into(high);
            self.storage().check_leaf_in(
                disk,
                buf,
                has_low.then_some(&low[..]),
                has_high.then_some(&high[..]),
            )
        };
        BOUNDS.with(|b| match b.try_borrow_mut() {
            Ok(mut bounds) => check(&mut bounds),
            Err(_) => check(&mut Default::default()),
        })
    }
}

/// A uniform number in 0..100 from a per-thread generator.
pub(in crate::tree) fn percent_roll() -> u8 {
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
pub(in crate::tree) fn node_records(node: NodeRef<'_>) -> Vec<Record> {
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

/// The records a mini-page decides on its own: its present records, as inserts. Pending
/// merges (Upsert records) are left out: they need the value below them (`live_folded`
/// folds them over none where there is no page below).
pub(crate) fn live_records(node: NodeRef<'_>) -> Vec<Record> {
    node_records(node)
        .into_iter()
        .filter(|r| r.kind.exists() && r.kind != RecordKind::Upsert)
        .map(|r| Record {
            kind: RecordKind::Insert,
            ..r
        })
        .collect()
}

/// Sets `key` to `value` (`None`: removes it) in sorted records.
pub(in crate::tree) fn apply(records: &mut Vec<Record>, key: &[u8], value: Option<&[u8]>) {
    let at = records.binary_search_by(|r| r.key.as_slice().cmp(key));
    match (value, at) {
        (Some(v), Ok(i)) => {
            records[i].value = node::Bytes::from_slice(v);
            records[i].kind = RecordKind::Insert;
        }
        (Some(v), Err(i)) => records.insert(
            i,
            Record {
                key: node::Bytes::from_slice(key),
                value: node::Bytes::from_slice(v),
                kind: RecordKind::Insert,
            },
        ),
        (None, Ok(i)) => {
            records.remove(i);
        }
        (None, Err(_)) => {}
    }
}

/// What a buffered write left behind.
pub(crate) enum Written {
    Done,
    /// The leaf (a mirror) has no records left.
    Emptied,
}

impl Shared {
    /// What a merge of the operand list `ops` into `key` writes to the leaf's node as it
    /// is now: the operands appended to the key's pending ones (an Upsert record), or, where
    /// the node decides the key's value, or the list would outgrow a value, the folded value
    /// (an Insert, or a Tombstone when the operator removes the key).
    pub(in crate::tree) fn resolve_merge(
        &self,
        path: &Path<'_>,
        page: &WriteGuard<'_>,
        key: &[u8],
        ops: &[u8],
    ) -> Result<(Vec<u8>, RecordKind)> {
        let folded = |value: Option<Vec<u8>>| match value {
            Some(v) => (v, RecordKind::Insert),
            None => (Vec::new(), RecordKind::Tombstone),
        };
        let (pending, disk) = match page.mini().map(NodeRef::from_bytes) {
            Some(node) => match node.get(key) {
                Some((_, RecordKind::Upsert, list)) => ([list, ops].concat(), node.disk_page()),
                Some((_, kind, value)) => {
                    let base = kind.exists().then_some(value);
                    return Ok(folded(self.fold(key, base, ops)?));
                }
                None if node.kind() == NodeKind::Leaf => {
                    return Ok(folded(self.fold(key, None, ops)?))
                }
                None => (ops.to_vec(), node.disk_page()),
            },
            None => match page.location() {
                Location::Disk(p) => (ops.to_vec(), Some(p)),
                Location::Mini(_) => (ops.to_vec(), None),
            },
        };
        let Some(disk) = disk.filter(|p| *p != NO_PAGE) else {
            return Ok(folded(self.fold(key, None, &pending)?));
        };
        if self.limits().check_stored(key, &pending).is_ok() {
            return Ok((pending, RecordKind::Upsert));
        }
        // Too many pending operands for one record: fold them over the page's value.
        let base = self.disk_value(path, Some(disk), key)?;
        Ok(folded(self.fold(key, base.as_deref(), &pending)?))
    }

    /// Applies a write to a write-locked leaf.
    pub(in crate::tree) fn write_in_leaf<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        op: WriteOp<'_>,
    ) -> Attempt<Written> {
        let (value, kind) = match op {
            WriteOp::Put(v) => (v, RecordKind::Insert),
            WriteOp::Delete => (&[][..], RecordKind::Tombstone),
            WriteOp::Merge(ops) => (ops, RecordKind::Upsert),
        };
        self.put_buffered(path, page, key, value, kind)
    }

    /// Puts one record into the leaf's buffered node: creates a mini-page, grows it, turns it
    /// into a full-page mirror (writes only) or splits the leaf as needed. An Upsert record
    /// stands for a merge of the operand list `value`, resolved against the node each time
    /// round (`resolve_merge`), so a node rebuilt on the way folds the operands just once.
    pub(in crate::tree) fn put_buffered<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        key: &[u8],
        value: &[u8],
        kind: RecordKind,
    ) -> Attempt<Written> {
        let mut shed = false;
        let merge = (kind == RecordKind::Upsert).then_some(value);
        loop {
            let resolved;
            let (value, kind) = match merge {
                Some(ops) => {
                    resolved = self.resolve_merge(path, page, key, ops)?;
                    (&resolved.0[..], resolved.1)
                }
                None => (value, kind),
            };
            let addr = match page.location() {
                Location::Disk(disk) => {
                    return Ok(self.create_mini(path, page, disk, key, value, kind))
                }
                Location::Mini(addr) => addr,
            };
            if self.pool().is_copy_on_access(addr) {
                self.copy_to_tail(page);
            }
            let Some(bytes) = page.mini_mut() else {
                return Ok(Step::Restart(Restart::Retry));
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
                    return Ok(Step::Done(Written::Done));
                }
                if is_mirror {
                    let mut records = node_records(node.as_ref());
                    apply(&mut records, key, new_value(value, kind));
                    return self.rebuild_leaf(path, page, key, &records);
                }
                match self.to_mirror(path, page)? {
                    Step::Done(()) => continue,
                    Step::Restart(r) => return Ok(Step::Restart(r)),
                }
            }
            if is_mirror {
                // A merge into a mirror was folded (`resolve_merge`): it knows every value.
                debug_assert_ne!(kind, RecordKind::Upsert, "a mirror holds no pending merge");
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
                    RecordKind::Cache | RecordKind::Phantom => {
                        return Ok(Step::Done(Written::Done))
                    }
                };
                if result.is_err() {
                    // A mirror in a block smaller than a page (`mirror_size`, or a split
                    // while whole leaves are cached) grows by a quarter, as a mini-page
                    // does: one copy, where a rebuild decodes and re-encodes every record.
                    let page_size = self.page_size();
                    let need = needed(node.as_ref(), key, value);
                    if size < page_size && need <= page_size {
                        let grown = crate::pool::block_size_for((size + size / 4).max(need))
                            .map_or(page_size, |g| g.min(page_size));
                        match self.grow(page, grown) {
                            Step::Done(()) => continue,
                            Step::Restart(r) => return Ok(Step::Restart(r)),
                        }
                    }
                    let mut records = node_records(node.as_ref());
                    apply(&mut records, key, new_value(value, kind));
                    return self.rebuild_leaf(path, page, key, &records);
                }
                let flags = node.as_ref().flags();
                node.set_flags(flags | FLAG_DIRTY);
                if node.as_ref().is_empty() {
                    return Ok(Step::Done(Written::Emptied));
                }
                return Ok(Step::Done(Written::Done));
            }
            // A mini-page: a removal of a key already known absent changes nothing.
            if kind == RecordKind::Tombstone
                && matches!(node.as_ref().get(key), Some((_, k, _)) if !k.exists())
            {
                return Ok(Step::Done(Written::Done));
            }
            if node.upsert(key, value, kind).is_ok() {
                return Ok(Step::Done(Written::Done));
            }
            // Full: grow to the smallest size class holding a quarter more (and the new
            // record) up to the merge threshold, else merge into a mirror. Classes four per
            // doubling keep mini-pages fuller than doubling did (`pool::size`); growing by a
            // quarter rather than a half cut a 2-thread load's page reads and writes per
            // insert by 5 % (0.0476/0.0545 -> 0.0450/0.0522) at no cost in throughput.
            let need = needed(node.as_ref(), key, value);
            let threshold = self.config().merge_threshold_bytes();
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
                match self.grow(page, grown) {
                    Step::Done(()) => continue,
                    Step::Restart(r) => return Ok(Step::Restart(r)),
                }
            }
            if !kind.is_dirty() {
                // A cached answer never turns a mini-page into a full-page mirror: that would
                // fill memory with the leaf's cold records. Shed the mini-page's own cold clean
                // records instead (as copy-on-access does), once; without room, skip caching.
                if shed {
                    return Ok(Step::Done(Written::Done));
                }
                shed = true;
                if !self.shed_cold(page) {
                    return Ok(Step::Done(Written::Done));
                }
                continue;
            }
            if let Step::Restart(r) = self.to_mirror(path, page)? {
                return Ok(Step::Restart(r));
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
    ) -> Step<Written> {
        if kind == RecordKind::Tombstone && disk == NO_PAGE {
            return Step::Done(Written::Done);
        }
        let size = crate::pool::block_size_for(MINI_OVERHEAD + key.len() + value.len())
            .map_or(self.page_size(), |s| s.min(self.page_size()));
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return Step::Restart(Restart::NeedSpace);
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
            return Step::Restart(Restart::Retry);
        }
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        Step::Done(Written::Done)
    }

    /// Moves the mini-page into a block of `size` bytes.
    fn grow<'p>(&'p self, page: &mut WriteGuard<'p>, size: usize) -> Step<()> {
        let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
            return Step::Restart(Restart::NeedSpace);
        };
        let Some(bytes) = page.mini() else {
            return Step::Restart(Restart::Retry);
        };
        if node::copy_filtered(
            NodeRef::from_bytes(bytes),
            block.bytes_mut(),
            |_, _| true,
            false,
        )
        .is_err()
        {
            return Step::Restart(Restart::Retry);
        }
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        self.counters().count(Event::MiniGrow);
        Step::Done(())
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
        let Some(mut block) = self.pool().alloc(node.size(), page.page_id()) else {
            return false;
        };
        let keep = |kind: RecordKind, referenced: bool| kind.is_dirty() || referenced;
        if node::copy_filtered(node, block.bytes_mut(), keep, true).is_err() {
            return false;
        }
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        true
    }
}

/// The value a resolved record stands for (`None`: absent).
fn new_value(value: &[u8], kind: RecordKind) -> Option<&[u8]> {
    kind.exists().then_some(value)
}

/// Bytes `node` needs to hold its content plus a record of `key` and `value`.
fn needed(node: NodeRef<'_>, key: &[u8], value: &[u8]) -> usize {
    node.used_bytes() + 8 + key.len().saturating_sub(node.prefix().len()) + value.len()
}
