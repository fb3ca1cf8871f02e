//! Range scans: double-ended iterators that copy out one leaf at a time.
//!
//! An iterator holds no lock between calls: it remembers the next bound on each end, finds
//! the leaf for it from the root, read-locks it, copies out the records in range (the
//! mini-page merged over the disk leaf: newest wins, tombstones hide) into one reused buffer
//! (`copied.rs`), and unlocks. Moving
//! to the next leaf uses the exact bound from the inner nodes, so a concurrent split or
//! removal never makes it skip or repeat a key. Leaves with nothing to return are passed in
//! a loop, never by recursion.

use std::ops::Bound;

use super::blob::BlobPin;
use super::copied::Copied;
use super::inner::{Path, Seek};
use super::keyspace::{Entered, Space};
use super::leaf::{node_records, with_page_buf};
use super::stats::Event;
use super::{Shared, FLAG_DAMAGED, FLAG_DIRTY, NO_PAGE};
use crate::error::Result;
use crate::node::{self, NodeKind, NodeMut, NodeRef, RecordKind};
use crate::pool::{Location, ReadGuard};
use crate::sync;

/// Most chance, in percent, that a scan keeps a leaf it read from disk as a mirror: scans
/// were measured (YCSB-E) with the promotion default at 50 %, and a whole page for every
/// scanned leaf was not, so raising the default for lookups did not raise this.
const SCAN_MIRROR_MAX_PERCENT: u8 = 50;

/// A key and its value, as a scan yields them.
pub(crate) type KeyValue = (Vec<u8>, Vec<u8>);

/// Iterator over a key range; see [`Tree::range`](crate::Tree::range).
///
/// Yields `Result<(key, value)>`: an I/O or corruption error while reading a leaf is
/// returned once, after which the iterator ends.
///
/// An iterator sees every [`Batch`](crate::Batch) committed before it was created whole,
/// and none committed after. For that, while it lives, each later batch keeps the old
/// values of its keys in memory: drop iterators you are done with rather than keep them
/// idle.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// for i in 0u8..10 {
///     tree.insert([i], [i])?;
/// }
/// // Keys 3..7 in descending order, stopping after two.
/// let last_two: Vec<_> = tree.range([3u8]..[7u8]).rev().take(2).collect::<Result<_, _>>()?;
/// assert_eq!(last_two, [(vec![6], vec![6]), (vec![5], vec![5])]);
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Range<'t> {
    tree: &'t Shared,
    /// The keyspace scanned.
    space: &'t Space,
    /// The gate passed for every leaf: the keyspace's, when the handle that made this
    /// iterator may outlive the tree (a `Keyspace`).
    gate: Option<&'t Space>,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    /// Where the front continues (initially `lower`).
    front: Bound<Vec<u8>>,
    /// Where the back continues (initially `upper`).
    back: Bound<Vec<u8>>,
    front_buf: Copied,
    back_buf: Copied,
    /// Keep the extents the buffers' references name from reuse until they are yielded
    /// (taken before a leaf is copied, when the tree stores values out of line).
    front_pin: Option<BlobPin>,
    back_pin: Option<BlobPin>,
    /// What it yields for values stored out of line.
    values: Values,
    /// The last key yielded from the front (stored form), once one was.
    front_last: Option<Vec<u8>>,
    /// The last key yielded from the back (stored form), once one was.
    back_last: Option<Vec<u8>>,
    front_done: bool,
    back_done: bool,
    finished: bool,
    /// The last batch number when the scan started: later batches are kept out of what it
    /// yields (`rewind.rs`).
    start: super::rewind::ScanStart,
}

/// What a scan yields for a value stored out of line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    /// The value, read from the blob file.
    Read,
    /// Its reference, as the leaf stores it (for a caller that uses the keys only).
    Stored,
}

/// Whether `key` is at or past the end bound `end` (going up).
fn past_end(end: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match end {
        Bound::Included(e) => key > e.as_slice(),
        Bound::Excluded(e) => key >= e.as_slice(),
        Bound::Unbounded => false,
    }
}

/// Whether every key below `low` is outside a range that starts at `start` (going down).
fn at_or_below_start(start: &Bound<Vec<u8>>, low: &[u8]) -> bool {
    match start {
        Bound::Included(s) | Bound::Excluded(s) => low <= s.as_slice(),
        Bound::Unbounded => false,
    }
}

impl<'t> Range<'t> {
    /// An iterator over the keys of `space` in `range`.
    pub(crate) fn new<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(
        tree: &'t Shared,
        space: &'t Space,
        gated: bool,
        range: R,
    ) -> Range<'t> {
        let (lower, upper) = space.bounds(&range);
        let empty = match (&lower, &upper) {
            (Bound::Included(l), Bound::Included(u)) => l > u,
            (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
            | (Bound::Excluded(l), Bound::Included(u)) => l >= u,
            _ => false,
        };
        Range {
            tree,
            space,
            gate: gated.then_some(space),
            front: lower.clone(),
            back: upper.clone(),
            lower,
            upper,
            front_buf: Copied::default(),
            back_buf: Copied::default(),
            front_pin: None,
            back_pin: None,
            values: Values::Read,
            front_last: None,
            back_last: None,
            front_done: empty,
            back_done: empty,
            finished: empty,
            start: tree.rewind().begin_scan(),
        }
    }

    /// Copies out the next leaf (going up) that has records in range.
    fn fill_front(&mut self) -> Result<()> {
        while self.front_buf.is_empty() && !self.front_done {
            let _in = self.enter()?;
            let guard = sync::pin();
            let seek = match &self.front {
                Bound::Unbounded => Seek::First,
                Bound::Included(k) | Bound::Excluded(k) => Seek::Key(k),
            };
            self.front_pin = self.tree.blob_pin();
            let (path, page) = self.tree.index().read_leaf(self.tree.pool(), &guard, seek);
            let mut high = Vec::new();
            let has_high = path.high_into(&mut high);
            self.front_buf.clear();
            self.tree
                .collect_leaf(&path, page, &self.front, &self.upper, &mut self.front_buf)?;
            self.tree.journal().check()?;
            if self.tree.rewind().batched_since(self.start) {
                // This leaf's part of the range: from the front to its high bound.
                let end = if has_high && !past_end(&self.upper, &high) {
                    Bound::Excluded(high.clone())
                } else {
                    self.upper.clone()
                };
                let mut items = self.front_buf.take_all();
                self.tree
                    .rewind()
                    .rewind(self.start, &mut items, &self.front, &end);
                self.front_buf.extend(items);
            }
            // Making the leaf a full-page mirror may have taken room.
            self.tree.nudge_evictors();
            if !has_high || past_end(&self.upper, &high) {
                self.front_done = true;
            } else {
                self.front = Bound::Included(high);
            }
        }
        Ok(())
    }

    /// Copies out the next leaf (going down) that has records in range.
    fn fill_back(&mut self) -> Result<()> {
        while self.back_buf.is_empty() && !self.back_done {
            let _in = self.enter()?;
            let guard = sync::pin();
            let seek = match &self.back {
                Bound::Unbounded => Seek::Last,
                Bound::Included(k) => Seek::Key(k),
                Bound::Excluded(k) => Seek::Before(k),
            };
            self.back_pin = self.tree.blob_pin();
            let (path, page) = self.tree.index().read_leaf(self.tree.pool(), &guard, seek);
            let mut low = Vec::new();
            let has_low = path.low_into(&mut low);
            self.back_buf.clear();
            self.tree
                .collect_leaf(&path, page, &self.lower, &self.back, &mut self.back_buf)?;
            self.tree.journal().check()?;
            if self.tree.rewind().batched_since(self.start) {
                // This leaf's part of the range: from its low bound to the back.
                let start = if has_low && !at_or_below_start(&self.lower, &low) {
                    Bound::Included(low.clone())
                } else {
                    self.lower.clone()
                };
                let mut items = self.back_buf.take_all();
                self.tree
                    .rewind()
                    .rewind(self.start, &mut items, &start, &self.back);
                self.back_buf.extend(items);
            }
            self.tree.nudge_evictors();
            if !has_low || at_or_below_start(&self.lower, &low) {
                self.back_done = true;
            } else {
                self.back = Bound::Excluded(low);
            }
        }
        Ok(())
    }

    /// This iterator, yielding the stored form of values kept out of line instead of
    /// reading them: for a caller that uses the keys only (a keyspace drop).
    pub(crate) fn keys_only(mut self) -> Self {
        self.values = Values::Stored;
        self
    }

    /// Passes the keyspace's gate, if this iterator came from a `Keyspace`.
    fn enter(&self) -> Result<Option<Entered<'t>>> {
        self.gate.map(Space::enter).transpose()
    }

    /// Ends the iteration with `e` as its last item.
    fn fail(&mut self, e: crate::Error) -> Result<KeyValue> {
        self.finished = true;
        Err(e)
    }
}

impl Iterator for Range<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        if let Err(e) = self.fill_front() {
            return Some(self.fail(e));
        }
        let Some((k, v)) = self.front_buf.pop_front() else {
            self.finished = true;
            return None;
        };
        if self.back_last.as_ref().is_some_and(|b| k >= b.as_slice()) {
            self.finished = true;
            return None;
        }
        let item = match user(self.tree, self.space, k, v, self.values) {
            Ok(item) => item,
            Err(e) => return Some(self.fail(e)),
        };
        remember(&mut self.front_last, k);
        Some(Ok(item))
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        if let Err(e) = self.fill_back() {
            return Some(self.fail(e));
        }
        let Some((k, v)) = self.back_buf.pop_back() else {
            self.finished = true;
            return None;
        };
        if self.front_last.as_ref().is_some_and(|f| k <= f.as_slice()) {
            self.finished = true;
            return None;
        }
        let item = match user(self.tree, self.space, k, v, self.values) {
            Ok(item) => item,
            Err(e) => return Some(self.fail(e)),
        };
        remember(&mut self.back_last, k);
        Some(Ok(item))
    }
}

impl std::iter::FusedIterator for Range<'_> {}

impl Drop for Range<'_> {
    fn drop(&mut self) {
        self.tree.rewind().end_scan(self.start);
    }
}

/// A stored record as the caller sees it: owned, the key without the keyspace prefix.
/// The user's key and value of a stored record (a value stored out of line is read now:
/// the buffer's pin keeps its extent).
fn user(
    tree: &Shared,
    space: &Space,
    key: &[u8],
    value: &[u8],
    values: Values,
) -> Result<KeyValue> {
    let outline = tree.storage().blobs().decode(value);
    let value = match outline.filter(|_| values == Values::Read) {
        Some(r) => tree.read_blob(&r)?,
        None => value.to_vec(),
    };
    Ok((key[space.prefix().as_slice().len()..].to_vec(), value))
}

/// Keeps `key` as the last one yielded from one end, in the buffer kept from the last time.
fn remember(last: &mut Option<Vec<u8>>, key: &[u8]) {
    let buf = last.get_or_insert_with(Vec::new);
    buf.clear();
    buf.extend_from_slice(key);
}

/// Copies the present records of a full-page mirror between `start` and `end` into `out`.
fn copy_mirror(node: NodeRef<'_>, start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>, out: &mut Copied) {
    let from = match start {
        Bound::Unbounded => 0,
        Bound::Included(k) => node.lower_bound(k),
        Bound::Excluded(k) => node.upper_bound(k),
    };
    let mut key = Vec::new();
    for i in from..node.len() {
        node.key_into(i, &mut key);
        if past_end(end, &key) {
            break;
        }
        if node.record_kind(i).exists() {
            out.push(&key, node.value(i));
        }
    }
}

/// The records of a node between `start` and `end`, with their kinds, ascending.
fn node_slice(
    node: NodeRef<'_>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
) -> Vec<(Vec<u8>, Vec<u8>, RecordKind)> {
    let from = match start {
        Bound::Unbounded => 0,
        Bound::Included(k) => node.lower_bound(k),
        Bound::Excluded(k) => node.upper_bound(k),
    };
    let mut out = Vec::new();
    for i in from..node.len() {
        let mut key = Vec::new();
        node.key_into(i, &mut key);
        if past_end(end, &key) {
            break;
        }
        out.push((key, node.value(i).to_vec(), node.record_kind(i)));
    }
    out
}

/// Newest-wins merge of a leaf's records (`base`, all present) with a mini-page's (`over`):
/// a mini-page record replaces the leaf's record with the same key, and hides it when it is
/// a tombstone or phantom; pending merges (Upsert records) go to `fold` with the leaf's value.
fn overlay(
    base: Vec<(Vec<u8>, Vec<u8>, RecordKind)>,
    over: Vec<(Vec<u8>, Vec<u8>, RecordKind)>,
    fold: impl Fn(&[u8], Option<&[u8]>, &[u8]) -> Result<Option<Vec<u8>>>,
) -> Result<Vec<KeyValue>> {
    let mut out = Vec::with_capacity(base.len() + over.len());
    let mut base = base.into_iter().peekable();
    for (key, value, kind) in over {
        while let Some((k, v, _)) = base.next_if(|b| b.0 < key) {
            out.push((k, v));
        }
        let below = base.next_if(|b| b.0 == key);
        if kind == RecordKind::Upsert {
            if let Some(v) = fold(&key, below.as_ref().map(|b| &b.1[..]), &value)? {
                out.push((key, v));
            }
        } else if kind.exists() {
            out.push((key, value));
        }
    }
    out.extend(base.map(|(k, v, _)| (k, v)));
    Ok(out)
}

impl Shared {
    /// Copies out a read-locked leaf's records between `start` and `end`, ascending, into
    /// `out`.
    fn collect_leaf(
        &self,
        path: &Path<'_>,
        page: ReadGuard<'_>,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
        out: &mut Copied,
    ) -> Result<()> {
        let (over, disk) = match page.mini() {
            Some(bytes) => {
                let node = NodeRef::from_bytes(bytes);
                if node.kind() == NodeKind::Leaf {
                    self.counters().count(Event::CacheHit);
                    copy_mirror(node, start, end, out);
                    return Ok(());
                }
                (node_slice(node, start, end), node.disk_page())
            }
            None => match page.location() {
                Location::Disk(p) => (Vec::new(), Some(p)),
                Location::Mini(_) => (Vec::new(), None),
            },
        };
        let Some(disk) = disk.filter(|p| *p != NO_PAGE) else {
            out.extend(overlay(Vec::new(), over, |k, b, ops| self.fold(k, b, ops))?);
            return Ok(());
        };
        self.counters().count(Event::CacheMiss);
        with_page_buf(self.page_size(), |buf| {
            self.storage().read_page(disk, buf)?;
            let leaf = self.storage().check_leaf(disk, buf)?;
            if leaf.flags() & FLAG_DAMAGED != 0 {
                return Err(self
                    .storage()
                    .corruption(Some(disk), "the scan crosses a damaged leaf"));
            }
            out.extend(overlay(node_slice(leaf, start, end), over, |k, b, ops| {
                self.fold(k, b, ops)
            })?);
            if self.config().promotion_percent.min(SCAN_MIRROR_MAX_PERCENT)
                > super::leaf::percent_roll()
            {
                if let Ok(mut w) = page.try_upgrade() {
                    self.mirror_scanned(path, &mut w, leaf, disk);
                }
            }
            Ok(())
        })
    }

    /// Keeps a scanned leaf in memory as a full-page mirror so the next scan needs no I/O
    /// (paper §5.3). Best effort and never evicts: a scan does not write to disk.
    fn mirror_scanned<'p>(
        &'p self,
        path: &Path<'_>,
        page: &mut crate::pool::WriteGuard<'p>,
        leaf: NodeRef<'_>,
        disk: u64,
    ) {
        let (records, dirty) = match page.mini() {
            Some(b) => {
                let mini = NodeRef::from_bytes(b);
                let fold = &mut |k: &[u8], b: Option<&[u8]>, ops: &[u8]| self.fold(k, b, ops);
                let Ok(records) = node::merge_sorted(leaf, mini, fold) else {
                    return;
                };
                (records, mini.dirty_count() > 0)
            }
            None => (node_records(leaf), false),
        };
        let (low, high) = path.bounds();
        if self
            .leaf_groups(&records, low.as_deref(), high.as_deref(), false)
            .len()
            != 1
        {
            return;
        }
        let Some(mut block) = self.pool().alloc(self.page_size(), page.page_id()) else {
            return;
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
            return;
        }
        let mut node = NodeMut::from_bytes(block.bytes_mut());
        node.set_disk_page(Some(disk));
        node.set_flags(if dirty { FLAG_DIRTY } else { 0 });
        if let Some(old) = page.set_mini(block) {
            self.pool().dealloc(old);
        }
        self.counters().count(Event::ScanMirror);
    }
}
