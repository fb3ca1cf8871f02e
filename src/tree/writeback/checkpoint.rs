//! A checkpoint's passes over the buffered leaves: each dirty leaf it chooses is written back
//! (to a new page, `evict.rs`) and its cached node kept, marked clean.
//!
//! **Which leaves.** A full checkpoint (every checkpoint of a tree that does not log writes
//! or holds large values) writes every dirty leaf, and replay starts at the LSN it took. A
//! fuzzy one keeps replay's start, `from`, and writes only the dirty leaves that
//! `PageTracker::may_stay_dirty` refuses: those without a page, those whose bounds changed
//! since it was written, and those that may lack a write logged before `from`. Every other
//! dirty leaf is listed with its page and that page's image LSN, and replay from `from`
//! applies what it lacks. So a checkpoint writes what stayed dirty for longer than the log
//! it keeps, not the whole cache, and checkpoints can run as often as freeing superseded
//! pages needs (`Shared::wants_checkpoint`). Without a dirty leaf left, replay starts at
//! the checkpoint's own LSN.
//!
//! **Moving the start** (`Plan::toward`). A checkpoint may also go toward a later start: it
//! writes up to a budget of the dirty leaves that start refuses, and starts replay there if
//! it left none of them. Fuzzy checkpoints do so once the log outgrew
//! `checkpoint_log_bytes` (`persist/open.rs`), and `Tree::checkpoint`, `close` and drop do so
//! toward each round's own LSN, round after round: either way a round writes a share of
//! the leaves, and the pages it supersedes are free for the next.
//!
//! Trees with large values stay on full checkpoints: an extent only a dirty leaf references
//! would be in no checkpoint's table (`blob/extents.rs`), and would be freed.
//!
//! Leaves are written in batches, and no leaf stays locked while its page is read or
//! written. A pass first looks at leaves under read locks until `BATCH` of them need a
//! write-back, and reads the disk pages of those that are mini-pages with one `read_batch`
//! (a page read ahead is used only if the leaf's write token, see below, is unchanged once
//! the leaf is locked; otherwise its merge reads the page again). It then builds the
//! leaves, each under its own write lock, which it releases once the leaf's image and a copy
//! of its node are taken. It writes the batch with one
//! `write_batch`, then locks each leaf again to record the move:
//! - if the leaf was split or removed meanwhile (the image was built with its old bounds),
//!   or someone else wrote it (an eviction or a write-back: that page is newer than ours),
//!   the page is freed and the leaf left as it is. The tracker's write token of the leaf
//!   (`PageTracker::write_token`) says so: all three change it under the leaf's lock;
//! - otherwise the leaf now lives in the new page. Its node is marked clean if it is byte
//!   for byte the node the image was built from; if a write changed it meanwhile, it stays
//!   dirty and learns its new page (the image holds every record it had when built, and
//!   merging them again later is harmless), except for the merge operands the image
//!   folded: those are taken off the front of the key's pending list (a later write to the
//!   key either appended to that list or replaced it), so none is folded twice.
//!
//! Either way the leaf's image on disk is at least as new as the moment it was built,
//! after the checkpoint's LSN was taken, which is all a checkpoint needs of it.
//!
//! Holding the leaf locks through the write instead stalled writers for a whole batched
//! write each time they met a staged leaf: under Zipf YCSB-A with 2 threads, the rounds
//! with a checkpoint ran at 0.5-0.6 of the others.

use super::evict::{needs_write_back, Action, AfterWrite};
use super::page_batch::{Image, PageBatch};
use crate::error::Result;
use crate::node::{NodeKind, NodeMut, NodeRef, RecordKind, Search};
use crate::pool::{Location, PageId, WriteGuard};
use crate::tree::index::SmoGuard;
use crate::tree::storage::{Inspections, PageTracker};
use crate::tree::{Attempt, Shared, Step, FLAG_DIRTY};
use crate::wal::Lsn;

/// Leaves a pass reads with one `read_batch` and writes with one `write_batch`: enough for
/// the device to work on many at once.
pub(in crate::tree) const BATCH: usize = 32;

/// A round of a full checkpoint, or of a move of replay's start, writes at most this share
/// (1/n) of the pages the last checkpoint references: the data file then grows by about
/// 1/n of the leaves per round.
pub(in crate::tree) const SUPERSEDED_SHARE: usize = 8;
/// A checkpoint is wanted once the pages superseded since the last one reach this share
/// (1/n) of the pages it references (`Shared::wants_checkpoint`): they stay allocated until
/// a checkpoint no longer references them, so the data file grows by about that much
/// between checkpoints, plus what is superseded while one runs.
pub(in crate::tree) const WANTED_SHARE: usize = 16;
/// ... and each share at least this many pages (4 MiB of 4 KiB pages), so that small trees
/// do not checkpoint all the time.
pub(in crate::tree) const SUPERSEDED_LEAST: usize = 1024;

/// Which dirty leaves a checkpoint writes, and what it sees of the others (module docs).
pub(in crate::tree) struct Plan<'a> {
    /// The LSN the checkpoint took.
    lsn: Lsn,
    /// Where replay starts if a dirty leaf is left unwritten; `None` for a full checkpoint.
    from: Option<Lsn>,
    /// Where replay should start instead, once no dirty leaf that may lack a write logged
    /// before it is left (between `from` and `lsn`).
    toward: Lsn,
    /// What checkpoints saw of the leaves; the first pass adds what it sees.
    seen: &'a mut Inspections,
    /// How many more of the leaves `toward` refuses, but `from` allows, the first pass
    /// writes.
    budget: usize,
    /// Whether the second pass left a dirty leaf unwritten.
    left_dirty: bool,
    /// Whether one of those may lack a write logged before `toward`.
    held_back: bool,
}

impl<'a> Plan<'a> {
    /// A checkpoint that took `lsn` and may leave dirty the leaves that lack only writes
    /// logged at or after `from` (at most `lsn`); `None` writes every dirty leaf.
    pub(in crate::tree) fn new(lsn: Lsn, from: Option<Lsn>, seen: &'a mut Inspections) -> Plan<'a> {
        seen.took(lsn);
        let from = from.map(|f| f.min(lsn));
        Plan {
            lsn,
            from,
            toward: from.unwrap_or(lsn),
            seen,
            budget: 0,
            left_dirty: false,
            held_back: false,
        }
    }

    /// Moves replay's start toward `toward` (between `from` and the checkpoint's LSN):
    /// writes up to `budget` of the dirty leaves that may lack a write logged before it,
    /// and starts replay there if none of them is left. A round of a full checkpoint goes
    /// toward its own LSN; a fuzzy checkpoint whose log outgrew its limit, toward a later
    /// checkpoint's (`persist/open.rs`).
    pub(in crate::tree) fn toward(self, toward: Lsn, budget: usize) -> Plan<'a> {
        let toward = match self.from {
            Some(from) => toward.clamp(from, self.lsn),
            None => self.lsn,
        };
        Plan {
            toward,
            budget,
            ..self
        }
    }

    /// Where replay must start for this checkpoint.
    pub(in crate::tree) fn replay_from(&self) -> Lsn {
        match self.from {
            Some(from) if self.held_back => from,
            Some(_) if self.left_dirty => self.toward,
            _ => self.lsn,
        }
    }

    /// Whether the pass (`second`: the one under the structure lock) writes dirty leaf
    /// `pid`, which `PageTracker::is_fresh` did not rule out.
    fn wants(&mut self, pages: &PageTracker, pid: PageId, second: bool) -> bool {
        let Some(from) = self.from else { return true };
        if !pages.may_stay_dirty(pid, from, self.seen) {
            return true;
        }
        let moved = self.toward == from || pages.may_stay_dirty(pid, self.toward, self.seen);
        if !moved && !second && self.budget > 0 {
            self.budget -= 1;
            return true;
        }
        if second {
            self.left_dirty = true;
            self.held_back |= !moved;
        }
        false
    }
}

/// A leaf that needed a write-back when `dirty_chunk` looked.
pub(in crate::tree) struct Candidate {
    pid: PageId,
    /// Its mini-page's disk page and the leaf's write token then: the page to read ahead.
    read: Option<(u64, u64)>,
}

/// A leaf built in the batch, waiting for its page to be written (not locked).
pub(in crate::tree) struct Staged {
    pid: PageId,
    /// Its page before.
    old: Option<u64>,
    /// The page the batch writes it to.
    new: u64,
    /// The tracker's write token of the leaf when it was built.
    token: u64,
    /// Its image LSN (`PageTracker`).
    lsn: Lsn,
    /// The cached node the image was built from.
    node: Vec<u8>,
}

impl Shared {
    /// One pass of a checkpoint: writes back every leaf with a buffered node. Without `smo`
    /// (the first pass) a leaf whose write-back needs the busy structure lock is left for
    /// the next pass; with it (the second pass) every leaf must be written.
    ///
    /// # Errors
    /// `Io` or `Corruption` from reading or writing a leaf; leaves not yet written stay
    /// dirty, and no page allocated for them stays allocated.
    pub(in crate::tree) fn checkpoint_pass(
        &self,
        smo: Option<&SmoGuard<'_>>,
        plan: &mut Plan<'_>,
    ) -> Result<()> {
        let mut staged = Vec::with_capacity(BATCH);
        let mut batch = PageBatch::default();
        let result = self.checkpoint_leaves(smo, plan, &mut staged, &mut batch);
        if result.is_err() {
            self.abandon(&mut staged, &mut batch);
        }
        result
    }

    /// The loop of `checkpoint_pass`; on error the caller abandons what is staged.
    fn checkpoint_leaves(
        &self,
        smo: Option<&SmoGuard<'_>>,
        plan: &mut Plan<'_>,
        staged: &mut Vec<Staged>,
        batch: &mut PageBatch,
    ) -> Result<()> {
        let mut leaves = self.buffered_leaves(0);
        let pages = self.storage().pages();
        let mut wanted = |pid: PageId, dirty: bool| {
            if !dirty {
                if smo.is_none() {
                    plan.seen.saw_clean(pid, plan.lsn);
                }
                return false;
            }
            // Written since the LSN was taken, with its current bounds (which cannot change
            // while the structure lock is held): its page already covers every write this
            // checkpoint must hold. What was written since stays dirty.
            if smo.is_some() && pages.is_fresh(pid) {
                return false;
            }
            plan.wants(pages, pid, smo.is_some())
        };
        loop {
            let chunk = self.dirty_chunk(&mut leaves, &mut wanted);
            if chunk.is_empty() {
                return self.write_staged(staged, batch);
            }
            self.stage_chunk(&chunk, smo, staged, batch)?;
            if staged.len() >= BATCH {
                self.write_staged(staged, batch)?;
            }
        }
    }

    /// Every page id in use so far, from `from` on and wrapping around (`dirty_chunk` skips
    /// those without a cached node). Lazy: a pass over a large tree allocates nothing for it.
    pub(in crate::tree) fn buffered_leaves(&self, from: PageId) -> impl Iterator<Item = PageId> {
        let limit = self.pool().page_id_limit();
        let from = from.min(limit);
        (from..limit).chain(0..from)
    }

    /// Takes leaves from `leaves` until `BATCH` of them are `wanted` (or none are left).
    /// Each is looked at under a read lock only, and `wanted(pid, dirty)` is asked about
    /// it, `dirty` saying whether it needs a write-back (a leaf not cached does not); what
    /// it finds is a hint that `stage_chunk` checks again under the write lock. A leaf that
    /// needs no write-back is never taken.
    pub(in crate::tree) fn dirty_chunk(
        &self,
        leaves: &mut impl Iterator<Item = PageId>,
        mut wanted: impl FnMut(PageId, bool) -> bool,
    ) -> Vec<Candidate> {
        let mut chunk = Vec::with_capacity(BATCH);
        for pid in leaves {
            let page = self.pool().read(pid);
            let node = page.mini().map(NodeRef::from_bytes);
            let dirty = node.is_some_and(needs_write_back);
            if !wanted(pid, dirty) {
                continue;
            }
            let Some(node) = node.filter(|_| dirty) else {
                continue;
            };
            // A mini-page's merge starts from its leaf's page: read it ahead. Stable while
            // the leaf is locked (read-locked will do: changing it takes the write lock).
            let read = match (node.kind(), node.disk_page()) {
                (NodeKind::Mini, Some(disk)) => {
                    Some((disk, self.storage().pages().write_token(pid)))
                }
                _ => None,
            };
            chunk.push(Candidate { pid, read });
            if chunk.len() == BATCH {
                break;
            }
        }
        chunk
    }

    /// Stages the leaves of `chunk` in `batch` for `write_staged`, having read their pages
    /// with one `read_batch`.
    pub(in crate::tree) fn stage_chunk(
        &self,
        chunk: &[Candidate],
        smo: Option<&SmoGuard<'_>>,
        staged: &mut Vec<Staged>,
        batch: &mut PageBatch,
    ) -> Result<()> {
        self.read_ahead(chunk, batch);
        for c in chunk {
            match self.stage_leaf(c.pid, smo, batch)? {
                Step::Done(Some(s)) => staged.push(s),
                Step::Restart(_) if smo.is_some() => {
                    // Write-back under the structure lock allocates no memory and never
                    // waits.
                    return Err(self
                        .storage()
                        .corruption(None, "checkpoint could not write a leaf"));
                }
                // Clean, or (in the first pass) left to the second.
                Step::Done(None) | Step::Restart(_) => {}
            }
        }
        // Images no merge took: their leaves changed since they were read.
        batch.recycle_images();
        Ok(())
    }

    /// Reads the pages of the chunk's mini-pages with one `read_batch` into `batch.images`.
    /// On failure it reads nothing ahead: each merge then reads its own page and reports
    /// the error with the page it concerns.
    fn read_ahead(&self, chunk: &[Candidate], batch: &mut PageBatch) {
        let Some(store) = self.storage().store() else {
            return;
        };
        let reads: Vec<(PageId, u64, u64)> = chunk
            .iter()
            .filter_map(|c| c.read.map(|(disk, token)| (c.pid, disk, token)))
            .collect();
        if reads.is_empty() {
            return;
        }
        let pages: Vec<u64> = reads.iter().map(|r| r.1).collect();
        let mut bufs: Vec<_> = (0..pages.len())
            .map(|_| batch.spare_buf(self.page_size()))
            .collect();
        if store.read_batch(&pages, &mut bufs).is_err() {
            batch.give_spare(bufs);
            return;
        }
        batch.set_images(
            reads
                .into_iter()
                .zip(bufs)
                .map(|((pid, disk, token), buf)| Image::new(pid, disk, token, buf)),
        );
    }

    /// Writes back leaf `pid` under its lock: `Some` if it was built into `batch`, to be
    /// finished by `write_staged` (the lock is released on return).
    fn stage_leaf(
        &self,
        pid: PageId,
        smo: Option<&SmoGuard<'_>>,
        batch: &mut PageBatch,
    ) -> Attempt<Option<Staged>> {
        let mut page = self.pool().write(pid);
        // Stable while the leaf is locked: whoever writes, splits or removes the leaf
        // changes it under the leaf's lock.
        let token = self.storage().pages().write_token(pid);
        let lsn = self.journal().image_lsn();
        batch.keep_images_if(pid, token);
        Ok(match self.checkpoint_leaf(&mut page, smo, batch)? {
            Step::Done(Some((old, new))) => Step::Done(Some(Staged {
                pid,
                old,
                new,
                token,
                lsn,
                node: page.mini().map(<[u8]>::to_vec).unwrap_or_default(),
            })),
            Step::Done(None) => Step::Done(None),
            Step::Restart(r) => Step::Restart(r),
        })
    }

    /// Writes back a write-locked leaf for a checkpoint. A leaf written to a new page is
    /// staged in `batch`, and its old and new pages are returned for `write_staged`; every
    /// other outcome is applied at once.
    fn checkpoint_leaf<'p>(
        &'p self,
        page: &mut WriteGuard<'p>,
        smo: Option<&SmoGuard<'_>>,
        batch: &mut PageBatch,
    ) -> Attempt<Option<(Option<u64>, u64)>> {
        let Some(bytes) = page.mini() else {
            return Ok(Step::Done(None));
        };
        let after = AfterWrite::Keep;
        let action = match self.write_back(page.page_id(), bytes, after, smo, Some(batch))? {
            Step::Done(a) => a,
            Step::Restart(r) => return Ok(Step::Restart(r)),
        };
        match action {
            Action::Staged { old, new } => return Ok(Step::Done(Some((old, new)))),
            Action::Detach(disk) => {
                if let Some(old) = page.set_location_disk(disk) {
                    self.pool().dealloc(old);
                }
            }
            Action::KeepClean(disk) => make_clean(page, disk),
            Action::Nothing => {}
        }
        Ok(Step::Done(None))
    }

    /// Writes the staged leaves with one `write_batch`, then records each move that still
    /// holds (see the module docs). On failure the pages are freed and the leaves stay
    /// dirty.
    pub(in crate::tree) fn write_staged(
        &self,
        staged: &mut Vec<Staged>,
        batch: &mut PageBatch,
    ) -> Result<()> {
        if staged.is_empty() {
            return Ok(());
        }
        let Some(store) = self.storage().store() else {
            // Nothing stages without a store.
            self.abandon(staged, batch);
            return Ok(());
        };
        debug_assert_eq!(batch.staged_len(), staged.len());
        if let Err(e) = batch.write_out(&**store, self.storage().blobs()) {
            self.abandon(staged, batch);
            return Err(e);
        }
        for s in staged.drain(..) {
            let mut page = self.pool().write(s.pid);
            let holds = !page.is_removed()
                && matches!(page.location(), Location::Mini(_))
                && self.storage().pages().write_token(s.pid) == s.token;
            if !holds {
                drop(page);
                // Never referenced: nothing can need it.
                self.storage().free(s.new);
                continue;
            }
            match self.moved(s.pid, s.old, s.new, AfterWrite::Keep, s.lsn) {
                Action::KeepClean(disk) => {
                    if page.mini() == Some(&s.node[..]) {
                        make_clean(&mut page, disk);
                    } else {
                        set_disk_page(&mut page, disk, &s.node);
                    }
                }
                // `moved` keeps the block for a checkpoint.
                _ => debug_assert!(false, "a checkpoint's leaf was not kept"),
            }
        }
        Ok(())
    }

    /// Gives up on the staged leaves: frees their new pages, leaving the leaves dirty for a
    /// later checkpoint or eviction.
    pub(in crate::tree) fn abandon(&self, staged: &mut Vec<Staged>, batch: &mut PageBatch) {
        batch.abandon(self.storage());
        staged.clear();
    }
}

/// The leaf now lives in page `disk`, but its cached node changed since the image there was
/// built from node `built`: it stays dirty, without the merge operands the image holds.
fn set_disk_page(page: &mut WriteGuard<'_>, disk: u64, built: &[u8]) {
    let Some(bytes) = page.mini_mut() else { return };
    let mut node = NodeMut::from_bytes(bytes);
    node.set_disk_page(Some(disk));
    if node.as_ref().kind() != NodeKind::Mini {
        // A mirror was rebuilt from every record, its operands folded.
        return;
    }
    let built = NodeRef::from_bytes(built);
    let mut key = Vec::new();
    for i in 0..built.len() {
        if built.record_kind(i) != RecordKind::Upsert {
            continue;
        }
        built.key_into(i, &mut key);
        let folded = built.value(i);
        let Search::Found(at) = node.as_ref().search(&key) else {
            continue;
        };
        if node.as_ref().record_kind(at) != RecordKind::Upsert {
            continue;
        }
        let pending = node.as_ref().value(at);
        if !pending.starts_with(folded) {
            debug_assert!(false, "a pending list only grows");
            continue;
        }
        if pending.len() == folded.len() {
            node.remove_at(at);
        } else {
            let newer = pending[folded.len()..].to_vec();
            let shrunk = node.upsert(&key, &newer, RecordKind::Upsert);
            debug_assert!(
                shrunk.is_ok(),
                "a shorter value fits where the longer one was"
            );
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
    // A mini-page: its dirty records are now in the leaf; keep them as cached answers, but
    // pending merges, folded into the leaf, have no answer to keep.
    for i in (0..node.as_ref().len()).rev() {
        match node.as_ref().record_kind(i) {
            RecordKind::Insert => node.set_record_kind(i, RecordKind::Cache),
            RecordKind::Upsert => node.remove_at(i),
            RecordKind::Tombstone => node.set_record_kind(i, RecordKind::Phantom),
            RecordKind::Cache | RecordKind::Phantom => {}
        }
    }
}

#[cfg(all(test, not(shuttle)))]
#[path = "checkpoint_tests.rs"]
mod tests;

#[cfg(all(test, not(shuttle)))]
#[path = "checkpoint_crash_tests.rs"]
mod crash_tests;

#[cfg(all(test, not(shuttle)))]
#[path = "fuzzy_tests.rs"]
mod fuzzy_tests;
