//! A batch commit's plan for each leaf it holds (pass 2 of `commit.rs`): how its writes
//! reach the leaf's node, decided and built without changing anything a reader sees, and
//! then applied (pass 3) once nothing can fail any more.

use std::borrow::Cow;

use super::commit::{Change, Write};
use crate::error::Result;
use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind, Search};
use crate::pool::{Location, NewBlock, WriteGuard};
use crate::tree::cache::{apply, node_records, MINI_OVERHEAD};
use crate::tree::index::Path;
use crate::tree::stats::Event;
use crate::tree::{Attempt, Restart, Shared, Step, FLAG_DAMAGED, FLAG_DIRTY, NO_PAGE};

/// A batch write as it goes into one leaf's node: the record put there (a merge resolved
/// against that node, `Shared::resolve_merge`).
pub(super) struct Rec<'w> {
    key: &'w [u8],
    value: Cow<'w, [u8]>,
    kind: RecordKind,
}

/// Bytes a record takes in a node besides its key suffix and value.
const RECORD_META: usize = 8;

/// How the batch's writes reach one leaf.
pub(super) enum Plan<'g, 'w> {
    /// Nothing to write (removals from a leaf never written).
    Nothing,
    /// These records into the current node, which has room.
    InPlace(Vec<Rec<'w>>),
    /// This node replaces the current one; the writes are in it.
    Replace(NewBlock<'g>),
}

impl Shared {
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
    pub(super) fn plan_leaf<'p, 'w>(
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
    pub(super) fn apply_plan<'p>(&'p self, page: &mut WriteGuard<'p>, plan: Plan<'p, '_>) -> bool {
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
