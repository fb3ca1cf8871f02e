//! Which disk pages hold what: the newest page of each leaf, the pages the last checkpoint
//! references (never freed before the next checkpoint is durable), and a write token per leaf
//! that tells a checkpoint whether a leaf changed while it was not locked.
//!
//! Each leaf page carries its image LSN (`Journal::image_lsn` when the image was built under
//! the leaf's lock): the page holds exactly the logged writes to its key range below that
//! LSN. A checkpoint records it per leaf, and replay skips a leaf's records below it, so a
//! write the page already holds is not applied twice (merges are not idempotent).
//!
//! It also keeps what checkpoints saw of the leaves (`Inspections`), from which the next one
//! tells which dirty leaves it may leave unwritten (`may_stay_dirty`).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::pool::PageId;
use crate::sync::{
    AtomicUsize, Mutex, MutexGuard, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use crate::wal::Lsn;

/// One leaf as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotLeaf {
    /// Its exact low bound (empty for the first leaf).
    pub(crate) low: Vec<u8>,
    /// Its page id in the pool.
    pub(crate) pid: PageId,
    /// Its disk page.
    pub(crate) page: u64,
    /// Its page's image LSN.
    pub(crate) lsn: Lsn,
}

/// Which disk pages are in use by what, so that freed pages are reused without ever
/// overwriting what the last checkpoint needs.
#[derive(Default)]
pub(crate) struct PageTracker {
    inner: Mutex<Tracked>,
    /// Held by a checkpoint and by an idle write-back pass: never both at once. Holds what
    /// checkpoints saw of the leaves.
    checkpointing: Mutex<Inspections>,
    /// Taken for writing with `checkpointing` (`one_at_a_time`), and shared by evictors'
    /// batched write-backs (`write_backs_beside`), which may run together but never beside
    /// a checkpoint.
    gate: RwLock<()>,
    /// `Tracked::deferred.len()` and `Tracked::checkpointed.len()`, published under `inner`
    /// whenever they change, for `superseded_past`: every write asks it
    /// (`Shared::wants_checkpoint`), and taking `inner` there put two writer threads and the
    /// evictors on one mutex per write.
    deferred_len: AtomicUsize,
    checkpointed_len: AtomicUsize,
}

/// `PageTracker::one_at_a_time`'s guard: what checkpoints saw of the leaves, with every
/// other batched write-back kept out.
pub(crate) struct OneAtATime<'a> {
    _gate: RwLockWriteGuard<'a, ()>,
    seen: MutexGuard<'a, Inspections>,
}

impl std::ops::Deref for OneAtATime<'_> {
    type Target = Inspections;
    fn deref(&self) -> &Inspections {
        &self.seen
    }
}

impl std::ops::DerefMut for OneAtATime<'_> {
    fn deref_mut(&mut self) -> &mut Inspections {
        &mut self.seen
    }
}

/// What checkpoints saw of the leaves: for each, the LSN of the last checkpoint that found
/// it with nothing to write back (not cached, or cached clean), having taken that LSN
/// before looking. Every write such a leaf got since was applied after the look, so logged
/// at or after that LSN.
#[derive(Debug, Default)]
pub(crate) struct Inspections {
    /// Per page id: that LSN plus one (0: never seen so).
    clean_at: Vec<Lsn>,
    /// The LSNs checkpoints took, ascending, from the oldest the log still holds.
    taken: VecDeque<Lsn>,
    /// Where fuzzy checkpoints are moving replay's start to, a round at a time.
    moving_to: Option<Lsn>,
    /// The log's end when the open's replay finished: the image LSN of every page written
    /// back during replay (`Journal::image_lsn` is the log's end), which holds only the
    /// records replayed before it was built. Such a page is exact for a leaf left clean
    /// since, not for one dirtied again by later records.
    replayed_to: Option<Lsn>,
}

impl Inspections {
    /// What an open that replays the log from `lsn` knows: every write the leaves of the
    /// checkpoint it loaded (page ids below `leaves`) lack is in the log from `lsn` on.
    pub(crate) fn at_open(lsn: Lsn, leaves: usize) -> Inspections {
        Inspections {
            clean_at: vec![lsn + 1; leaves],
            taken: VecDeque::from([lsn]),
            moving_to: None,
            replayed_to: None,
        }
    }

    /// The open's replay ended with the log at `end` (see `replayed_to`).
    pub(crate) fn replayed_to(&mut self, end: Lsn) {
        self.replayed_to = Some(end);
    }

    /// A checkpoint took `lsn` and is about to look at the leaves. Checkpoints that fail
    /// release no log, so one retried with nothing logged meanwhile takes the same LSN
    /// again: it is kept once, and the list grows only as the log does.
    pub(crate) fn took(&mut self, lsn: Lsn) {
        if self.taken.back() != Some(&lsn) {
            self.taken.push_back(lsn);
        }
    }

    /// Leaf `pid` had nothing to write back when the checkpoint that took `lsn` looked.
    pub(crate) fn saw_clean(&mut self, pid: PageId, lsn: Lsn) {
        let at = pid as usize;
        if self.clean_at.len() <= at {
            self.clean_at.resize(at + 1, 0);
        }
        self.clean_at[at] = lsn + 1;
    }

    /// Whether leaf `pid` was seen with nothing to write back by a checkpoint that took an
    /// LSN at or after `lsn`.
    fn clean_since(&self, pid: PageId, lsn: Lsn) -> bool {
        self.clean_at.get(pid as usize).is_some_and(|&at| at > lsn)
    }

    /// The oldest LSN a checkpoint took at or after `from` (`None` if there is none).
    fn oldest_taken_since(&self, from: Lsn) -> Option<Lsn> {
        self.taken.iter().copied().find(|&l| l >= from)
    }

    /// Where replay's start moves to, for a checkpoint that took `lsn` and must keep less
    /// log: the start a move in progress goes to, else the oldest LSN a checkpoint took at
    /// or after `earliest`, else `lsn`. It stays the goal until a checkpoint starts replay
    /// there or later, so that the leaves to write for it only ever get fewer.
    pub(crate) fn move_start(&mut self, earliest: Lsn, lsn: Lsn) -> Lsn {
        let to = self
            .moving_to
            .or_else(|| self.oldest_taken_since(earliest))
            .unwrap_or(lsn);
        self.moving_to = Some(to);
        to
    }

    /// The log below `lsn` is gone: those LSNs can start no replay.
    pub(crate) fn released_before(&mut self, lsn: Lsn) {
        while self.taken.front().is_some_and(|&l| l < lsn) {
            self.taken.pop_front();
        }
        if self.moving_to.is_some_and(|to| to <= lsn) {
            self.moving_to = None;
        }
    }
}

#[derive(Default)]
struct Tracked {
    /// The newest written page of each leaf, with its image LSN.
    leaf_pages: HashMap<PageId, (u64, Lsn)>,
    /// For each leaf id, its last change: the `changes` count then, and whether it was a
    /// write of its page (not a split or a removal). Kept for removed ids, which are reused.
    last_change: HashMap<PageId, (u64, bool)>,
    /// Leaf writes, splits and removals so far.
    changes: u64,
    /// `changes` when the running (or last) checkpoint took its LSN.
    checkpoint_started: u64,
    /// Pages the last durable checkpoint references.
    checkpointed: HashSet<u64>,
    /// Pages the checkpoint being written references.
    in_progress: HashSet<u64>,
    /// Superseded pages that one of the above still references.
    deferred: Vec<u64>,
    /// Page ids of leaves unlinked from the tree whose entries are still to be freed.
    orphans: Vec<PageId>,
}

impl Tracked {
    /// Records that leaf `pid` was written (`write`) or split or removed.
    fn changed(&mut self, pid: PageId, write: bool) {
        self.changes += 1;
        let now = self.changes;
        self.last_change.insert(pid, (now, write));
    }
}

impl PageTracker {
    /// The pages of a tree just loaded from a checkpoint that names `leaves` (page id,
    /// page, image LSN).
    pub(crate) fn from_checkpoint(leaves: &[(PageId, u64, Lsn)]) -> PageTracker {
        let tracker = PageTracker::default();
        {
            let mut t = tracker.inner.lock();
            t.leaf_pages = leaves
                .iter()
                .map(|&(pid, p, lsn)| (pid, (p, lsn)))
                .collect();
            t.checkpointed = leaves.iter().map(|&(_, p, _)| p).collect();
            tracker.publish(&t);
        }
        tracker
    }

    /// The tracker of a tree that opens replaying its log from `lsn` (`Inspections::at_open`).
    pub(crate) fn replaying_from(self, lsn: Lsn, leaves: usize) -> PageTracker {
        *self.checkpointing.lock() = Inspections::at_open(lsn, leaves);
        self
    }

    /// Leaf `pid` now lives in `page`, an image built at `lsn`.
    pub(crate) fn written(&self, pid: PageId, page: u64, lsn: Lsn) {
        let mut t = self.inner.lock();
        t.leaf_pages.insert(pid, (page, lsn));
        t.changed(pid, true);
    }

    /// A checkpoint took its LSN: pages written before now may lack writes it must cover.
    pub(crate) fn start_checkpoint(&self) {
        let mut t = self.inner.lock();
        t.checkpoint_started = t.changes;
    }

    /// Leaf `pid`'s bounds changed (split, or replaced): its page, built with the old bounds,
    /// no longer suits a checkpoint.
    pub(crate) fn restructured(&self, pid: PageId) {
        self.inner.lock().changed(pid, false);
    }

    /// Whether leaf `pid`'s page was written since the running checkpoint took its LSN, with
    /// the bounds it has now (nothing split or removed it since): that page holds every
    /// write the checkpoint must cover.
    pub(crate) fn is_fresh(&self, pid: PageId) -> bool {
        let t = self.inner.lock();
        matches!(t.last_change.get(&pid), Some(&(at, true)) if at > t.checkpoint_started)
    }

    /// A count that changes whenever leaf `pid` is written, split or removed (a page number
    /// alone can come back: superseded pages are reused). Whoever changes it holds the
    /// leaf's lock, so it is stable under that lock.
    pub(crate) fn write_token(&self, pid: PageId) -> u64 {
        self.inner
            .lock()
            .last_change
            .get(&pid)
            .map_or(0, |&(at, _)| at)
    }

    /// The newest written page of leaf `pid`.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn leaf_page(&self, pid: PageId) -> Option<u64> {
        self.inner.lock().leaf_pages.get(&pid).map(|&(p, _)| p)
    }

    /// Leaf `pid` is gone.
    pub(crate) fn forget_leaf(&self, pid: PageId) {
        let mut t = self.inner.lock();
        t.leaf_pages.remove(&pid);
        t.changed(pid, false);
    }

    /// Leaf `pid` now lives in `new` (an image built at `lsn`) instead of `old`, in one step
    /// under the tracker's lock:
    /// a checkpoint snapshot (`begin_snapshot`) sees the leaf either in `old`, still kept,
    /// or in `new`, never in a page already freed. Done in two steps, a snapshot taken
    /// between them referenced `old` after it was freed, and a write-back of another leaf
    /// reused it: after a crash the checkpoint named a page holding someone else's records.
    /// True if the caller may free `old` now.
    pub(crate) fn moved(&self, pid: PageId, old: Option<u64>, new: u64, lsn: Lsn) -> bool {
        let mut t = self.inner.lock();
        t.leaf_pages.insert(pid, (new, lsn));
        t.changed(pid, true);
        let Some(old) = old else { return false };
        if t.checkpointed.contains(&old) || t.in_progress.contains(&old) {
            t.deferred.push(old);
            self.publish(&t);
            return false;
        }
        true
    }

    /// `page` no longer holds a current leaf. True if the caller may free it now; false if
    /// a checkpoint references it, and it is freed after the next one (`finish_checkpoint`).
    pub(crate) fn supersede(&self, page: u64) -> bool {
        let mut t = self.inner.lock();
        if t.checkpointed.contains(&page) || t.in_progress.contains(&page) {
            t.deferred.push(page);
            self.publish(&t);
            return false;
        }
        true
    }

    /// Leaf `pid` was unlinked while its guard belonged to someone else: its entry is freed
    /// later (`take_orphans`).
    pub(crate) fn orphan(&self, pid: PageId) {
        self.inner.lock().orphans.push(pid);
    }

    /// The orphaned page ids, to free.
    pub(crate) fn take_orphans(&self) -> Vec<PageId> {
        std::mem::take(&mut self.inner.lock().orphans)
    }

    /// Keeps checkpoints (and idle write-back passes) to one at a time while it lives, and
    /// evictors' batches out. It holds what checkpoints saw of the leaves, which only a
    /// checkpoint changes.
    pub(crate) fn one_at_a_time(&self) -> OneAtATime<'_> {
        let gate = self.gate.write();
        OneAtATime {
            _gate: gate,
            seen: self.checkpointing.lock(),
        }
    }

    /// Lets an evictor's batched write-back run beside other evictors' while it lives, if
    /// no checkpoint or idle pass (`one_at_a_time`) runs now. Why a batch must not run
    /// beside a checkpoint: a page built before the checkpoint takes its LSN and written
    /// after would count as written since the LSN (`is_fresh`) while lacking writes logged
    /// before it.
    pub(crate) fn write_backs_beside(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.gate.try_read()
    }

    /// Whether dirty leaf `pid` may stay unwritten through a checkpoint whose log replay
    /// starts at `from`. It may if its page has its current bounds (no split or removal
    /// since it was written), and every write that page lacks was logged at or after
    /// `from`: either the page was built after that (its image LSN is at least `from`), or
    /// a checkpoint that took an LSN at or after `from` found the leaf with nothing to
    /// write back (`Inspections`).
    pub(crate) fn may_stay_dirty(&self, pid: PageId, from: Lsn, seen: &Inspections) -> bool {
        let t = self.inner.lock();
        let Some(&(_, lsn)) = t.leaf_pages.get(&pid) else {
            return false;
        };
        if matches!(t.last_change.get(&pid), Some(&(_, false))) {
            return false;
        }
        // Maybe written back during replay, and so missing what replay applied after it (a
        // page written after the open, before any new write, is refused too: harmless).
        if seen.replayed_to == Some(lsn) {
            return false;
        }
        lsn >= from || seen.clean_since(pid, from)
    }

    /// How many pages the last durable checkpoint references.
    pub(crate) fn checkpointed_pages(&self) -> usize {
        self.inner.lock().checkpointed.len()
    }

    /// Whether the superseded pages still kept for the last checkpoint reach `1/share` of
    /// the pages it references, and at least `least`: a new checkpoint would free them.
    /// Reads counts published under the lock without taking it: a count a moment old only
    /// moves the next checkpoint by a write (the checkpointer also polls).
    pub(crate) fn superseded_past(&self, share: usize, least: usize) -> bool {
        let deferred = self.deferred_len.load(Ordering::Relaxed);
        deferred >= least.max(self.checkpointed_len.load(Ordering::Relaxed) / share)
    }

    /// The checkpoint being written references `leaves` (low bound and page id, in key
    /// order): returns each with its page and image LSN, and keeps those pages until the
    /// checkpoint is finished. `Err(pid)` names a leaf that has no page.
    pub(crate) fn begin_snapshot(
        &self,
        leaves: Vec<(Vec<u8>, PageId)>,
    ) -> std::result::Result<Vec<SnapshotLeaf>, PageId> {
        let mut t = self.inner.lock();
        let mut snapshot = Vec::with_capacity(leaves.len());
        for (low, pid) in leaves {
            let Some(&(page, lsn)) = t.leaf_pages.get(&pid) else {
                return Err(pid);
            };
            snapshot.push(SnapshotLeaf {
                low,
                pid,
                page,
                lsn,
            });
        }
        t.in_progress = snapshot.iter().map(|l| l.page).collect();
        Ok(snapshot)
    }

    /// The checkpoint begun by `begin_snapshot` is durable (`done`) or failed. Returns the
    /// superseded pages that no checkpoint references any more, for the caller to free.
    pub(crate) fn finish_checkpoint(&self, done: bool) -> Vec<u64> {
        let mut t = self.inner.lock();
        let in_progress = std::mem::take(&mut t.in_progress);
        if !done {
            return Vec::new();
        }
        t.checkpointed = in_progress;
        let deferred = std::mem::take(&mut t.deferred);
        let (keep, free): (Vec<u64>, Vec<u64>) = deferred
            .into_iter()
            .partition(|p| t.checkpointed.contains(p));
        t.deferred = keep;
        self.publish(&t);
        free
    }

    /// Publishes the counts `superseded_past` reads; called with `inner` held after they
    /// change, so the last store is always the current count.
    fn publish(&self, t: &Tracked) {
        self.deferred_len.store(t.deferred.len(), Ordering::Relaxed);
        self.checkpointed_len
            .store(t.checkpointed.len(), Ordering::Relaxed);
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn evictors_batches_share_the_gate_a_checkpoint_holds_alone() {
        let t = PageTracker::default();
        let a = t.write_backs_beside().expect("a batch");
        let b = t
            .write_backs_beside()
            .expect("a second batch beside the first");
        drop((a, b));
        let seen = t.one_at_a_time();
        assert!(
            t.write_backs_beside().is_none(),
            "a batch beside a checkpoint"
        );
        drop(seen);
        assert!(t.write_backs_beside().is_some());
    }

    #[test]
    fn a_leaf_may_stay_dirty_only_on_evidence_its_writes_are_in_the_log() {
        // Leaves 0 and 1 came from a checkpoint whose replay starts at 50.
        let t = PageTracker::from_checkpoint(&[(0, 9, 0), (1, 8, 0)]).replaying_from(50, 2);
        let mut seen = t.one_at_a_time();
        t.written(0, 10, 100);
        assert!(t.may_stay_dirty(0, 100, &seen), "page built at the start");
        assert!(
            !t.may_stay_dirty(0, 101, &seen),
            "page older than the start"
        );
        assert!(t.may_stay_dirty(1, 50, &seen) && !t.may_stay_dirty(1, 51, &seen));
        // Leaf 2 was never written: it has no page to list.
        assert!(!t.may_stay_dirty(2, 0, &seen));
        seen.saw_clean(0, 200);
        assert!(t.may_stay_dirty(0, 200, &seen) && !t.may_stay_dirty(0, 201, &seen));
        // A split or removal since its page was written: the page has the old bounds.
        t.restructured(0);
        assert!(!t.may_stay_dirty(0, 0, &seen));
        t.written(0, 11, 300);
        assert!(t.may_stay_dirty(0, 300, &seen));
        t.forget_leaf(0);
        assert!(!t.may_stay_dirty(0, 0, &seen));
    }

    #[test]
    fn replay_starts_only_where_a_checkpoint_took_its_lsn_and_the_log_is_kept() {
        let mut seen = Inspections::at_open(50, 0);
        seen.took(80);
        seen.took(120);
        assert_eq!(seen.oldest_taken_since(0), Some(50));
        assert_eq!(seen.oldest_taken_since(51), Some(80));
        assert_eq!(seen.oldest_taken_since(121), None);
        seen.released_before(100);
        assert_eq!(seen.oldest_taken_since(0), Some(120));
        // Failed checkpoints retried on an idle log take the same LSN: kept once.
        for _ in 0..1000 {
            seen.took(150);
        }
        assert_eq!(Vec::from(seen.taken.clone()), vec![120, 150]);
    }

    #[test]
    fn a_move_of_the_start_keeps_its_goal_until_replay_starts_there() {
        let mut seen = Inspections::at_open(50, 0);
        seen.took(80);
        seen.took(120);
        assert_eq!(seen.move_start(60, 130), 80);
        // Later checkpoints, with a later window, keep going to 80.
        seen.took(130);
        assert_eq!(seen.move_start(125, 140), 80);
        // A checkpoint that moved replay short of it (none does, but a failed one
        // releases nothing) keeps the goal; one that reached it ends the move.
        seen.released_before(50);
        assert_eq!(seen.move_start(125, 140), 80);
        seen.released_before(80);
        assert_eq!(seen.move_start(125, 140), 130);
        seen.released_before(140);
        // Nothing taken in the window: the checkpoint's own LSN.
        assert_eq!(seen.move_start(150, 160), 160);
    }

    #[test]
    fn superseded_pages_are_counted_against_the_checkpointed_ones() {
        let leaves: Vec<(PageId, u64, Lsn)> = (0..80u32).map(|p| (p, u64::from(p), 0)).collect();
        let t = PageTracker::from_checkpoint(&leaves);
        assert!(!t.superseded_past(8, 0));
        for p in 0..10u32 {
            assert!(!t.supersede(u64::from(p)), "kept for the checkpoint");
        }
        assert!(t.superseded_past(8, 10) && !t.superseded_past(8, 11));
        assert!(!t.superseded_past(4, 0));
        // A leaf moved off a checkpointed page supersedes it too.
        assert!(!t.moved(10, Some(10), 500, 1), "kept for the checkpoint");
        assert!(t.superseded_past(8, 11) && !t.superseded_past(8, 12));
        // A page no checkpoint references is freed at once and not counted.
        assert!(t.moved(11, Some(600), 501, 1));
        assert!(!t.superseded_past(8, 12));
        // A checkpoint of 20 pages frees what it no longer references and keeps the page
        // superseded while it ran: 1 of 20.
        let pages: Vec<(Vec<u8>, PageId)> = (20..40u32).map(|p| (Vec::new(), p)).collect();
        t.begin_snapshot(pages).expect("every leaf has a page");
        assert!(!t.supersede(25), "kept for the checkpoint being written");
        assert_eq!(t.finish_checkpoint(true).len(), 11);
        assert!(t.superseded_past(20, 1) && !t.superseded_past(10, 1) && !t.superseded_past(20, 2));
    }
}
