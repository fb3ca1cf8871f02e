//! Applying an atomic batch: every leaf it writes locked at once, in key order, and changed
//! only once nothing can fail any more.
//!
//! A commit attempt runs in three passes, all under the locks:
//! 1. **Lock** the leaves in key order: each lock is taken blocking, after every lower
//!    leaf's, and single-leaf operations never wait for a second leaf, so no cycle can form.
//! 2. **Plan** each leaf: the writes go into its node in place when the node has room for
//!    all of them (counted as if every record were new); else a bigger node is built, off
//!    to the side, with the writes in it (a mini-page grown, or the whole leaf as a
//!    full-page mirror). Nothing visible changes in this pass. A leaf that needs a change
//!    of structure first (its records outgrow a page, or its node's prefix no longer covers
//!    the leaf's range) gets it here, content unchanged (a split of its current records at
//!    separators chosen so the batch's records fit too); the attempt then restarts. A full
//!    buffer drops what was built and restarts after eviction.
//! 3. **Apply**: take a ticket in the batch sequence (`rewind.rs`), save the old values if a
//!    scan may need them, write every node, append the one log record, publish the undo,
//!    release.

use std::borrow::Cow;
use std::ops::Range;

use super::rewind::Undo;
use crate::error::{Error, Result};
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind, Search};
use crate::pool::{Location, NewBlock, WriteGuard};
use crate::sync;
use crate::tree::blob::Stored;
use crate::tree::blob::REF_LEN;
use crate::tree::cache::{apply, node_records, MINI_OVERHEAD};
use crate::tree::index::Path;
use crate::tree::keyspace::user_key;
use crate::tree::stats::Event;
use crate::tree::{Attempt, Restart, Shared, Step, FLAG_DAMAGED, FLAG_DIRTY, NO_PAGE};

/// One write of a batch: the stored key (keyspace prefix included) and what it does.
pub(crate) type Write = (Vec<u8>, Change);

/// What a batch does to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Sets the value.
    Put(Vec<u8>),
    /// Removes the key.
    Delete,
    /// Merges the operands of this encoded list (`merge.rs`) into the value.
    Merge(Vec<u8>),
}

impl Change {
    /// Bytes of its value (or operand list).
    pub(crate) fn len(&self) -> usize {
        match self {
            Change::Put(v) | Change::Merge(v) => v.len(),
            Change::Delete => 0,
        }
    }

    /// How the log's batch record holds it.
    fn logged(&self) -> crate::wal::BatchValue<'_> {
        match self {
            Change::Put(v) => crate::wal::BatchValue::Put(v),
            Change::Delete => crate::wal::BatchValue::Remove,
            Change::Merge(ops) => crate::wal::BatchValue::Merge(ops),
        }
    }
}

/// A batch write as it goes into one leaf's node: the record put there (a merge resolved
/// against that node, `Shared::resolve_merge`).
struct Rec<'w> {
    key: &'w [u8],
    value: Cow<'w, [u8]>,
    kind: RecordKind,
}

/// Bytes a record takes in a node besides its key suffix and value.
const RECORD_META: usize = 8;

/// One leaf a commit attempt holds.
struct Held<'g> {
    path: Path<'g>,
    page: WriteGuard<'g>,
    /// Its writes (indices into the sorted writes).
    writes: Range<usize>,
}

/// What one commit attempt came to.
enum Attempted {
    /// Applied; the log record to wait for, if writes are logged.
    Done(Option<crate::wal::Appended>),
    /// Nothing applied: the buffer was full, with `unplanned` leaves still to plan.
    NeedSpace { unplanned: usize },
    /// Nothing applied (a leaf's structure changed): try again.
    Retry,
}

/// How the batch's writes reach one leaf.
enum Plan<'g, 'w> {
    /// Nothing to write (removals from a leaf never written).
    Nothing,
    /// These records into the current node, which has room.
    InPlace(Vec<Rec<'w>>),
    /// This node replaces the current one; the writes are in it.
    Replace(NewBlock<'g>),
}

impl Shared {
    /// Applies `writes` (stored keys, any order; a key's writes apply in order, so a put
    /// or removal replaces the ones before it and a merge folds over them) atomically:
    /// readers see all of them or none, and the log holds them as one record. Waits for
    /// durability like a single write.
    ///
    /// # Errors
    /// `BatchTooLarge` past [`Limits::max_batch_len`](crate::Limits::max_batch_len); `Io`
    /// or `Corruption` from a leaf the batch must read, or from the log; the merge
    /// operator's errors (`Shared::fold`). Nothing is applied on any error but a failure of
    /// the log itself, after which the tree refuses every call until reopened (as for a
    /// single write).
    pub(crate) fn commit_batch(&self, mut writes: Vec<Write>) -> Result<()> {
        let merges = writes
            .iter()
            .filter(|(_, c)| matches!(c, Change::Merge(_)))
            .count() as u64;
        // A stable sort keeps a key's writes in order.
        writes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut sorted: Vec<Write> = Vec::with_capacity(writes.len());
        for (key, change) in writes {
            match sorted.last_mut() {
                Some(last) if last.0 == key => {
                    let before = std::mem::replace(&mut last.1, Change::Delete);
                    last.1 = self.combine(&key, before, change)?;
                }
                _ => sorted.push((key, change)),
            }
        }
        let mut writes = sorted;
        if writes.is_empty() {
            return Ok(());
        }
        let len: u64 = writes
            .iter()
            .map(|(k, c)| crate::wal::batch_write_len(k.len(), self.stored_len(k, c)))
            .sum();
        let limit = self.limits().max_batch_len;
        if len > limit as u64 {
            return Err(Error::BatchTooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit,
            });
        }
        self.journal().check()?;
        let extents = self.store_batch_values(&mut writes)?;
        let result = self.commit_stored(&writes, len, merges);
        for &start in &extents {
            // Even a failed commit may have applied them (a log that refused its record).
            self.storage().blobs().applied(start);
        }
        result
    }

    /// The bytes a batch write's value takes in the log: a value stored out of line takes
    /// its reference's.
    pub(crate) fn stored_len(&self, key: &[u8], change: &Change) -> usize {
        match change {
            Change::Put(v)
                if self
                    .storage()
                    .blobs()
                    .must_store(v, self.limits().inline_value_len(user_key(key))) =>
            {
                REF_LEN
            }
            c => c.len(),
        }
    }

    /// Writes the batch's values that go out of line to their extents, and puts their
    /// references in their place; returns the extents. On error none stays allocated.
    fn store_batch_values(&self, writes: &mut [Write]) -> Result<Vec<u64>> {
        let mut extents = Vec::new();
        for (key, change) in writes.iter_mut() {
            let Change::Put(value) = change else { continue };
            let outline = match self.store_value(user_key(key), value) {
                Ok(Stored::Inline(_)) => continue,
                Ok(Stored::Outline(r, bytes)) => (r.start, bytes),
                Err(e) => {
                    for &start in &extents {
                        self.storage().blobs().discard(start);
                    }
                    return Err(e);
                }
            };
            extents.push(outline.0);
            *value = outline.1.to_vec();
        }
        Ok(extents)
    }

    /// `commit_batch` once the writes hold what their leaves store (`len` bytes logged).
    fn commit_stored(&self, writes: &[Write], len: u64, merges: u64) -> Result<()> {
        // The log record's body, when writes are logged.
        let mut body = Vec::new();
        if self.journal().logs_writes() {
            body.reserve(len as usize);
            for (key, change) in writes {
                crate::wal::encode_batch_write(&mut body, key, change.logged());
            }
        }
        let mut spins = 0u32;
        loop {
            match self.try_commit(writes, &body)? {
                Attempted::Done(appended) => {
                    if merges > 0 {
                        self.counters().upserts(merges);
                    }
                    if let Some(appended) = appended {
                        self.journal().commit(appended)?;
                    }
                    return Ok(());
                }
                Attempted::NeedSpace { unplanned } => {
                    // Room for the block that was missing and for the leaves not planned
                    // yet, each of which may need one: without it, a large batch would
                    // restart once per block.
                    for _ in 0..=unplanned.min(256) {
                        self.make_room_here()?;
                    }
                }
                Attempted::Retry => self.restart(Restart::Retry, &mut spins)?,
            }
        }
    }

    /// One key's write `before` followed by `after`, as one write.
    fn combine(&self, key: &[u8], before: Change, after: Change) -> Result<Change> {
        let folded = |value: Option<Vec<u8>>| value.map_or(Change::Delete, Change::Put);
        Ok(match (before, after) {
            (_, after @ (Change::Put(_) | Change::Delete)) => after,
            (Change::Merge(mut list), Change::Merge(more)) => {
                list.extend_from_slice(&more);
                Change::Merge(list)
            }
            // A batch holds its users' values: nothing to read out of line.
            (Change::Put(v), Change::Merge(ops)) => folded(self.fold_value(key, Some(&v), &ops)?),
            (Change::Delete, Change::Merge(ops)) => folded(self.fold(key, None, &ops)?),
        })
    }

    /// One attempt at a commit (see the module docs).
    fn try_commit(&self, writes: &[Write], body: &[u8]) -> Result<Attempted> {
        // Without a log, a checkpoint must not catch the batch half-applied (`rewind.rs`).
        let _unlogged = (!self.journal().logs_writes()).then(|| self.rewind().batch_applying());
        let guard = sync::pin();
        let Some(mut held) = self.lock_leaves(&guard, writes) else {
            return Ok(Attempted::Retry);
        };
        let mut plans = Vec::with_capacity(held.len());
        let mut retry = false;
        let count = held.len();
        for (i, h) in held.iter_mut().enumerate() {
            match self.plan_leaf(&h.path, &mut h.page, &writes[h.writes.clone()])? {
                Step::Done(plan) => plans.push(plan),
                // Keep preparing the other leaves: one restart serves them all.
                Step::Restart(Restart::Retry) => retry = true,
                Step::Restart(Restart::NeedSpace) => {
                    return Ok(Attempted::NeedSpace {
                        unplanned: count - i - 1,
                    });
                }
            }
        }
        if retry {
            return Ok(Attempted::Retry);
        }
        let ticket = self.rewind().ticket();
        let undo = if ticket.save_undo() {
            let mut undo: Undo = Vec::with_capacity(writes.len());
            for h in &held {
                for (key, _) in &writes[h.writes.clone()] {
                    undo.push((key.clone(), self.value_in_leaf(&h.path, &h.page, key)?));
                }
            }
            Some(undo)
        } else {
            None
        };
        // Nothing below fails before the log is asked.
        let mut emptied = Vec::new();
        for (i, (h, plan)) in held.iter_mut().zip(plans).enumerate() {
            if self.apply_plan(&mut h.page, plan) {
                emptied.push(i);
            }
        }
        self.counters().writes(writes.len() as u64);
        self.counters().count(Event::Batch);
        let appended = self.journal().append_batch(body);
        if let Some(undo) = undo {
            // Under the leaves' locks the old values' references are current.
            let blobs = self.storage().blobs();
            let outline = undo
                .iter()
                .any(|(_, old)| old.as_deref().is_some_and(|v| blobs.decode(v).is_some()));
            self.rewind()
                .publish(&ticket, undo, outline.then(|| blobs.pin()));
        }
        // Emptied mirrors leave the tree, as after a single removal.
        for i in emptied.into_iter().rev() {
            let h = held.swap_remove(i);
            let key = &writes[h.writes.start].0;
            self.remove_empty_leaf(key, h.page);
        }
        drop(held);
        Ok(Attempted::Done(appended?))
    }

    /// Write-locks the leaves that own `writes`, in key order. `None` when a leaf already
    /// held turned out to own more of the keys (a neighbour was removed): the caller starts
    /// again, so every leaf's writes lie within the bounds its path gives.
    fn lock_leaves<'g>(
        &'g self,
        guard: &'g sync::EpochGuard,
        writes: &[Write],
    ) -> Option<Vec<Held<'g>>> {
        let mut held: Vec<Held<'g>> = Vec::new();
        let mut i = 0;
        while i < writes.len() {
            let key = &writes[i].0;
            let (path, page) = match held.last() {
                None => self.index().write_leaf(self.pool(), guard, key),
                Some(last) => {
                    self.index()
                        .write_leaf_unless(self.pool(), guard, key, last.page.page_id())?
                }
            };
            let mut high = Vec::new();
            let end = if path.high_into(&mut high) {
                i + writes[i..].partition_point(|w| w.0 < high)
            } else {
                writes.len()
            };
            held.push(Held {
                path,
                page,
                writes: i..end,
            });
            i = end;
        }
        Some(held)
    }

    /// The records `writes` put into a locked leaf's node as it is now.
    fn records_for<'w>(
        &self,
        path: &Path<'_>,
        page: &WriteGuard<'_>,
        writes: &'w [Write],
    ) -> Result<Vec<Rec<'w>>> {
        writes
            .iter()
            .map(|(key, change)| {
                let (value, kind) = match change {
                    Change::Put(v) => (Cow::Borrowed(&v[..]), RecordKind::Insert),
                    Change::Delete => (Cow::Borrowed(&[][..]), RecordKind::Tombstone),
                    Change::Merge(ops) => {
                        let (v, kind) = self.resolve_merge(path, page, key, ops)?;
                        (Cow::Owned(v), kind)
                    }
                };
                Ok(Rec { key, value, kind })
            })
            .collect()
    }

    /// Decides how `writes` reach a locked leaf, building any replacement node (see the
    /// module docs). Changes nothing visible but a leaf's structure, content kept.
    fn plan_leaf<'p, 'w>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        writes: &'w [Write],
    ) -> Attempt<Plan<'p, 'w>> {
        let disk = match page.location() {
            Location::Disk(disk) => disk,
            Location::Mini(_) => {
                let Some(bytes) = page.mini() else {
                    return Ok(Step::Restart(Restart::Retry));
                };
                let node = NodeRef::from_bytes(bytes);
                let prefix_ok = writes.iter().all(|(k, _)| k.starts_with(node.prefix()));
                let recs = self.records_for(path, page, writes)?;
                return if node.kind() == NodeKind::Leaf {
                    self.plan_mirror(path, page, writes, recs, prefix_ok)
                } else {
                    self.plan_mini(path, page, writes, recs, prefix_ok)
                };
            }
        };
        let recs = self.records_for(path, page, writes)?;
        let writes_of = |r: &&Rec<'_>| disk != NO_PAGE || r.kind != RecordKind::Tombstone;
        if !recs.iter().any(|r| writes_of(&r)) {
            return Ok(Step::Done(Plan::Nothing));
        }
        // A new mini-page holding the writes, if they fit one.
        let need = MINI_OVERHEAD
            + recs
                .iter()
                .filter(writes_of)
                .map(|r| RECORD_META + r.key.len() + r.value.len())
                .sum::<usize>();
        let size = crate::pool::block_size_for(need).unwrap_or(usize::MAX);
        if size <= self.config().merge_threshold_bytes() && size <= self.page_size() {
            let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
                return Ok(Step::Restart(Restart::NeedSpace));
            };
            let (low, high) = path.bounds();
            let mut node = NodeMut::init(
                block.bytes_mut(),
                NodeKind::Mini,
                low.as_deref(),
                high.as_deref(),
            );
            node.set_disk_page((disk != NO_PAGE).then_some(disk));
            if upsert_all(&mut node, recs.iter().filter(writes_of)) {
                return Ok(Step::Done(Plan::Replace(block)));
            }
        }
        // Too many for a mini-page: the whole leaf as a mirror.
        let disk = (disk != NO_PAGE).then_some(disk);
        let records = self.leaf_records(&path.bounds(), None, disk)?;
        self.plan_rebuilt(path, page, writes, &records, disk, 0)
    }

    /// `plan_leaf` for a full-page mirror (`recs`: the writes as its records).
    fn plan_mirror<'p, 'w>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        writes: &'w [Write],
        recs: Vec<Rec<'w>>,
        prefix_ok: bool,
    ) -> Attempt<Plan<'p, 'w>> {
        let Some(bytes) = page.mini() else {
            return Ok(Step::Restart(Restart::Retry));
        };
        let node = NodeRef::from_bytes(bytes);
        if !prefix_ok {
            // The leaf's range widened past the prefix the mirror was built with: rebuild it
            // for the current bounds, records unchanged.
            let records = node_records(node);
            let key = writes[0].0.clone();
            return Ok(self.rebuild_leaf(path, page, &key, &records)?.then_retry());
        }
        let puts = recs
            .iter()
            .filter(|r| r.kind != RecordKind::Tombstone)
            .map(|r| (r.key, r.value.len()));
        if node.fits_all(puts) {
            return Ok(Step::Done(Plan::InPlace(recs)));
        }
        let (disk, damaged) = (node.disk_page(), node.flags() & FLAG_DAMAGED);
        let records = node_records(node);
        self.plan_rebuilt(path, page, writes, &records, disk, damaged)
    }

    /// `plan_leaf` for a mini-page (`recs`: the writes as its records).
    fn plan_mini<'p, 'w>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        writes: &'w [Write],
        recs: Vec<Rec<'w>>,
        prefix_ok: bool,
    ) -> Attempt<Plan<'p, 'w>> {
        if !prefix_ok {
            // As for a mirror; a mini-page is first merged into one (content unchanged).
            return Ok(self.to_mirror(path, page)?.then_retry());
        }
        let Some(bytes) = page.mini() else {
            return Ok(Step::Restart(Restart::Retry));
        };
        let node = NodeRef::from_bytes(bytes);
        let all = recs.iter().map(|r| (r.key, r.value.len()));
        if node.fits_all(all) {
            return Ok(Step::Done(Plan::InPlace(recs)));
        }
        // A bigger mini-page, up to the merge threshold.
        let add: usize = recs
            .iter()
            .map(|r| RECORD_META + r.key.len().saturating_sub(node.prefix().len()) + r.value.len())
            .sum();
        let size = crate::pool::block_size_for(node.used_bytes() + add).unwrap_or(usize::MAX);
        if size <= self.config().merge_threshold_bytes() {
            let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
                return Ok(Step::Restart(Restart::NeedSpace));
            };
            if node::copy_filtered(node, block.bytes_mut(), |_, _| true, false).is_ok()
                && upsert_all(&mut NodeMut::from_bytes(block.bytes_mut()), recs.iter())
            {
                return Ok(Step::Done(Plan::Replace(block)));
            }
        }
        // Past the threshold: the mini-page merged with its disk leaf, as a mirror.
        let disk = node.disk_page();
        let records = self.leaf_records(&path.bounds(), Some(node), disk)?;
        self.counters().count(Event::Merge);
        self.plan_rebuilt(path, page, writes, &records, disk, 0)
    }

    /// A full-page mirror of the leaf whose records are `records`, with `writes` applied
    /// (merges folded over them); or, when those do not fit a page, the leaf split first
    /// (records unchanged) and a restart.
    fn plan_rebuilt<'p, 'w>(
        &'p self,
        path: &Path<'_>,
        page: &mut WriteGuard<'p>,
        writes: &'w [Write],
        records: &[Record],
        disk: Option<u64>,
        damaged: u8,
    ) -> Attempt<Plan<'p, 'w>> {
        let mut after = records.to_vec();
        for (key, change) in writes {
            match change {
                Change::Put(v) => apply(&mut after, key, Some(v)),
                Change::Delete => apply(&mut after, key, None),
                Change::Merge(ops) => {
                    let at = after.binary_search_by(|r| r.key.as_slice().cmp(key));
                    let base = at.ok().map(|i| after[i].value.as_slice());
                    let value = self.fold(key, base, ops)?;
                    apply(&mut after, key, value.as_deref());
                }
            }
        }
        let (low, high) = path.bounds();
        let groups = self.leaf_groups(&after, low.as_deref(), high.as_deref(), false);
        if groups.len() == 1 {
            let bounds = (low.as_deref(), high.as_deref());
            let size = self.written_mirror_size(&after, bounds);
            let Some(mut block) = self.pool().alloc(size, page.page_id()) else {
                return Ok(Step::Restart(Restart::NeedSpace));
            };
            if node::build(
                block.bytes_mut(),
                NodeKind::Leaf,
                low.as_deref(),
                high.as_deref(),
                &after,
            )
            .is_err()
            {
                return Ok(Step::Restart(Restart::Retry));
            }
            let mut node = NodeMut::from_bytes(block.bytes_mut());
            node.set_disk_page(disk);
            node.set_flags(FLAG_DIRTY | damaged);
            return Ok(Step::Done(Plan::Replace(block)));
        }
        // Split the current records where every group of them, and of them with the batch
        // applied, fits a page: cut the union of both (the larger record of each key).
        let mut union = records.to_vec();
        for r in after {
            match union.binary_search_by(|u| u.key.as_slice().cmp(r.key.as_slice())) {
                Ok(i) if union[i].value.len() < r.value.len() => union[i] = r,
                Ok(_) => {}
                Err(i) => union.insert(i, r),
            }
        }
        let mut cuts = self.leaf_groups(&union, low.as_deref(), high.as_deref(), false);
        if cuts.len() == 1 {
            // Cannot happen (the union is no smaller than the records after the batch); cut
            // where those were cut rather than rebuild the leaf unsplit forever.
            cuts = groups;
        }
        let mut groups = Vec::with_capacity(cuts.len());
        let mut start = 0;
        for (g, (_, glow)) in cuts.iter().enumerate() {
            let end = match cuts.get(g + 1) {
                Some((_, Some(next))) => {
                    start + records[start..].partition_point(|r| r.key.as_slice() < next.as_slice())
                }
                _ => records.len(),
            };
            groups.push((start..end, glow.clone()));
            start = end;
        }
        let key = writes[0].0.clone();
        Ok(self
            .split_into(path, page, &key, records, &groups, disk)?
            .then_retry())
    }

    /// Carries out a plan; true if it left a mirror with no records.
    fn apply_plan<'p>(&'p self, page: &mut WriteGuard<'p>, plan: Plan<'p, '_>) -> bool {
        match plan {
            Plan::Nothing => false,
            Plan::Replace(block) => {
                if let Some(old) = page.set_mini(block) {
                    self.pool().dealloc(old);
                }
                page.mini()
                    .map(NodeRef::from_bytes)
                    .is_some_and(|n| n.kind() == NodeKind::Leaf && n.is_empty())
            }
            Plan::InPlace(recs) => {
                let Some(bytes) = page.mini_mut() else {
                    debug_assert!(false, "a planned leaf keeps its node under its lock");
                    return false;
                };
                let mut node = NodeMut::from_bytes(bytes);
                if node.as_ref().kind() == NodeKind::Leaf {
                    // A mirror's records: merges were folded (`resolve_merge`).
                    for r in &recs {
                        if r.kind == RecordKind::Tombstone {
                            if let Search::Found(i) = node.as_ref().search(r.key) {
                                node.remove_at(i);
                            }
                        } else {
                            debug_assert_eq!(r.kind, RecordKind::Insert, "a mirror takes values");
                            let done = node.upsert(r.key, &r.value, RecordKind::Insert);
                            debug_assert!(done.is_ok(), "the plan counted the room");
                        }
                    }
                    let flags = node.as_ref().flags();
                    node.set_flags(flags | FLAG_DIRTY);
                    node.as_ref().is_empty()
                } else {
                    let done = upsert_all(&mut node, recs.iter());
                    debug_assert!(done, "the plan counted the room");
                    false
                }
            }
        }
    }
}

/// Puts `recs` into a mini-page as dirty records; false if one did not fit.
fn upsert_all<'r, 'w: 'r>(
    node: &mut NodeMut<'_>,
    mut recs: impl Iterator<Item = &'r Rec<'w>>,
) -> bool {
    recs.all(|r| node.upsert(r.key, &r.value, r.kind).is_ok())
}
