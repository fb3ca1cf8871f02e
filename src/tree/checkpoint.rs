//! A checkpoint's passes over the buffered leaves: each dirty leaf is written back (to a new
//! page, `evict.rs`) and its cached node kept, marked clean.
//!
//! Leaves are written in batches, and no leaf stays locked while its page is written. A
//! pass builds up to `BATCH` leaves, each under its own write lock, which it releases once
//! the leaf's image and a copy of its node are taken. It writes the batch with one
//! `write_batch`, then locks each leaf again to record the move:
//! - if the leaf was split or removed meanwhile (the image was built with its old bounds),
//!   or someone else wrote it (an eviction or a write-back: that page is newer than ours),
//!   the page is freed and the leaf left as it is. The tracker's write token of the leaf
//!   (`PageTracker::write_token`) says so: all three change it under the leaf's lock;
//! - otherwise the leaf now lives in the new page. Its node is marked clean if it is byte
//!   for byte the node the image was built from; if a write changed it meanwhile, it stays
//!   dirty and only learns its new page (the image holds every record it had when built,
//!   and merging them again later is harmless).
//!
//! Either way the leaf's image on disk is at least as new as the moment it was built,
//! after the checkpoint's LSN was taken, which is all a checkpoint needs of it.
//!
//! Holding the leaf locks through the write instead stalled writers for a whole batched
//! write each time they met a staged leaf: under Zipf YCSB-A with 2 threads, the rounds
//! with a checkpoint ran at 0.5-0.6 of the others.

use super::evict::{Action, PageBatch};
use super::{Attempt, Restart, Shared, FLAG_DIRTY};
use crate::error::{Error, Result};
use crate::node::{NodeKind, NodeMut, RecordKind};
use crate::pool::{Location, PageId, WriteGuard};
use crate::sync::MutexGuard;

/// Leaves a pass writes with one `write_batch`: enough for the device to work on many at
/// once.
const BATCH: usize = 32;

/// A leaf built in the batch, waiting for its page to be written (not locked).
struct Staged {
    pid: PageId,
    /// Its page before.
    old: Option<u64>,
    /// The page the batch writes it to.
    new: u64,
    /// The tracker's write token of the leaf when it was built.
    token: (Option<u64>, u64),
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
    pub(super) fn checkpoint_pass(&self, smo: Option<&MutexGuard<'_, ()>>) -> Result<()> {
        let mut staged = Vec::with_capacity(BATCH);
        let mut batch = PageBatch::default();
        let result = self.checkpoint_leaves(smo, &mut staged, &mut batch);
        if result.is_err() {
            self.abandon(&mut staged, &mut batch);
        }
        result
    }

    /// The loop of `checkpoint_pass`; on error the caller abandons what is staged.
    fn checkpoint_leaves(
        &self,
        smo: Option<&MutexGuard<'_, ()>>,
        staged: &mut Vec<Staged>,
        batch: &mut PageBatch,
    ) -> Result<()> {
        for (pid, location) in self.pool.page_entries() {
            if !matches!(location, Location::Mini(_)) {
                continue;
            }
            if smo.is_some() && self.pages.is_fresh(pid) {
                // Written since the LSN was taken, with its current bounds (which cannot
                // change while the structure lock is held): its page already covers every
                // write this checkpoint must hold. What was written since stays dirty.
                continue;
            }
            match self.stage_leaf(pid, smo, batch)? {
                Ok(Some(s)) => staged.push(s),
                Ok(None) => {}
                Err(Restart::NeedSpace) | Err(Restart::Retry) if smo.is_some() => {
                    // Write-back under the structure lock allocates no memory and never
                    // waits.
                    return Err(Error::corruption(
                        &self.data_path,
                        None,
                        "checkpoint could not write a leaf",
                    ));
                }
                // The first pass leaves it to the second.
                Err(_) => {}
            }
            if staged.len() >= BATCH {
                self.write_staged(staged, batch)?;
            }
        }
        self.write_staged(staged, batch)
    }

    /// Writes back leaf `pid` under its lock: `Some` if it was built into `batch`, to be
    /// finished by `write_staged` (the lock is released on return).
    fn stage_leaf(
        &self,
        pid: PageId,
        smo: Option<&MutexGuard<'_, ()>>,
        batch: &mut PageBatch,
    ) -> Attempt<Option<Staged>> {
        let mut page = self.pool.write(pid);
        // Stable while the leaf is locked: whoever writes, splits or removes the leaf
        // changes it under the leaf's lock.
        let token = self.pages.write_token(pid);
        Ok(match self.checkpoint_leaf(&mut page, smo, batch)? {
            Ok(Some((old, new))) => Ok(Some(Staged {
                pid,
                old,
                new,
                token,
                node: page.mini().map(<[u8]>::to_vec).unwrap_or_default(),
            })),
            Ok(None) => Ok(None),
            Err(r) => Err(r),
        })
    }

    /// Writes back a write-locked leaf for a checkpoint. A leaf written to a new page is
    /// staged in `batch`, and its old and new pages are returned for `write_staged`; every
    /// other outcome is applied at once.
    fn checkpoint_leaf<'p>(
        &'p self,
        page: &mut WriteGuard<'p>,
        smo: Option<&MutexGuard<'_, ()>>,
        batch: &mut PageBatch,
    ) -> Attempt<Option<(Option<u64>, u64)>> {
        let Some(bytes) = page.mini() else {
            return Ok(Ok(None));
        };
        let after = super::evict::AfterWrite::Keep;
        let action = match self.write_back(page.page_id(), bytes, after, smo, Some(batch))? {
            Ok(a) => a,
            Err(r) => return Ok(Err(r)),
        };
        match action {
            Action::Staged { old, new } => return Ok(Ok(Some((old, new)))),
            Action::Detach(disk) => {
                if let Some(old) = page.set_location_disk(disk) {
                    self.pool.dealloc(old);
                }
            }
            Action::KeepClean(disk) => make_clean(page, disk),
            Action::Nothing => {}
        }
        Ok(Ok(None))
    }

    /// Writes the staged leaves with one `write_batch`, then records each move that still
    /// holds (see the module docs). On failure the pages are freed and the leaves stay
    /// dirty.
    fn write_staged(&self, staged: &mut Vec<Staged>, batch: &mut PageBatch) -> Result<()> {
        if staged.is_empty() {
            return Ok(());
        }
        let Some(store) = &self.store else {
            // Nothing stages without a store.
            staged.clear();
            batch.pages.clear();
            return Ok(());
        };
        let n = batch.pages.len();
        debug_assert_eq!(n, staged.len());
        if let Err(e) = store.write_batch(&batch.pages, &mut batch.bufs[..n]) {
            self.abandon(staged, batch);
            return Err(e);
        }
        batch.pages.clear();
        for s in staged.drain(..) {
            let mut page = self.pool.write(s.pid);
            let holds = !page.is_removed()
                && matches!(page.location(), Location::Mini(_))
                && self.pages.write_token(s.pid) == s.token;
            if !holds {
                drop(page);
                // Never referenced: nothing can need it.
                let _ = store.free(s.new);
                continue;
            }
            match self.moved(s.pid, s.old, s.new, super::evict::AfterWrite::Keep) {
                Action::KeepClean(disk) => {
                    if page.mini() == Some(&s.node[..]) {
                        make_clean(&mut page, disk);
                    } else {
                        set_disk_page(&mut page, disk);
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
    fn abandon(&self, staged: &mut Vec<Staged>, batch: &mut PageBatch) {
        if let Some(store) = &self.store {
            for &p in &batch.pages {
                let _ = store.free(p);
            }
        }
        batch.pages.clear();
        staged.clear();
    }
}

/// The leaf now lives in page `disk`, but its cached node changed since the image there was
/// built: it stays dirty.
fn set_disk_page(page: &mut WriteGuard<'_>, disk: u64) {
    if let Some(bytes) = page.mini_mut() {
        NodeMut::from_bytes(bytes).set_disk_page(Some(disk));
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

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::inner::{Path, Seek};
    use super::super::{crash, FLAG_DIRTY};
    use super::{PageBatch, Staged};
    use crate::node::{NodeKind, NodeRef};
    use crate::pool::{Location, PageId};
    use crate::sync::{self, Arc};
    use crate::{Config, Durability, Tree};

    fn key(i: u32) -> Vec<u8> {
        format!("k{i:06}").into_bytes()
    }

    fn value(i: u32, round: u8) -> Vec<u8> {
        vec![round ^ (i as u8); 100]
    }

    /// A pass waiting for a leaf locked by someone else holds no other leaf: the other
    /// thread can take the leaf staged just before while the pass is stuck. Were the pass to
    /// wait while holding it, two threads each holding a leaf and wanting the other's would
    /// deadlock.
    #[test]
    fn a_pass_waiting_for_a_busy_leaf_holds_no_other_leaf() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::new(dir.path())
            .cache_size(64 << 20)
            .durability(Durability::Buffered);
        let tree = Tree::open(config.clone()).expect("open");
        let n = 20_000;
        for i in 0..n {
            tree.insert(key(i), value(i, 1)).expect("insert");
        }
        let minis: Vec<_> = tree
            .shared
            .pool
            .page_entries()
            .into_iter()
            .filter(|(_, loc)| matches!(loc, Location::Mini(_)))
            .map(|(pid, _)| pid)
            .collect();
        assert!(
            minis.len() > 4 * super::BATCH,
            "only {} leaves",
            minis.len()
        );
        // Mid-batch: the leaf before the busy one is staged in a batch that is not full.
        let mut at = minis.len() / 2;
        if at % super::BATCH == 0 {
            at += 1;
        }
        let (busy, before) = (minis[at], minis[at - 1]);
        let checkpoints = tree.stats().checkpoints;
        std::thread::scope(|s| {
            let pool = &tree.shared.pool;
            let (tx, rx) = std::sync::mpsc::channel();
            let helper = s.spawn(move || {
                // A read lock: the pass lists the leaves under read locks, which this one
                // lets through, but cannot write the leaf back until it is gone.
                let held = pool.read(busy);
                tx.send(()).expect("send");
                // Give the pass time to reach the busy leaf, then take the one before it.
                std::thread::sleep(Duration::from_millis(200));
                let deadline = Instant::now() + Duration::from_secs(5);
                let got = loop {
                    if let Some(g) = pool.try_write(before) {
                        break Some(g);
                    }
                    if Instant::now() > deadline {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                };
                let took_it = got.is_some();
                drop(got);
                drop(held);
                took_it
            });
            rx.recv().expect("helper holds the leaf");
            tree.checkpoint().expect("checkpoint");
            assert!(
                helper.join().expect("helper"),
                "the pass kept the leaf before the busy one locked while it waited"
            );
        });
        assert_eq!(tree.stats().checkpoints, checkpoints + 1);
        if let Err(e) = tree.shared.check_structure() {
            panic!("{e}");
        }
        // Everything the checkpoint wrote reads back after a reopen.
        for i in (0..n).step_by(3) {
            tree.insert(key(i), value(i, 2)).expect("update");
        }
        tree.close().expect("close");
        let tree = Tree::open(config).expect("reopen");
        for i in 0..n {
            let round = if i % 3 == 0 { 2 } else { 1 };
            assert_eq!(
                tree.get(key(i)).expect("get"),
                Some(value(i, round)),
                "key {i}"
            );
        }
    }

    /// A tree on crash-image disks (`crash.rs`) whose cache holds every leaf, with no
    /// evictor threads.
    fn tree_on(store: &Arc<crate::store::FaultStore>, fs: &Arc<crate::wal::memfs::MemFs>) -> Tree {
        let config = Config::new(crash::DIR)
            .cache_size(4 << 20)
            .durability(Durability::Sync)
            // `MemFs` copies a segment's bytes on every sync: keep them small.
            .log_segment_size(64 << 10)
            .evictor_threads(0);
        crash::open_with(config, store.clone(), fs.clone()).expect("open")
    }

    /// Reopens from the disks' crash images.
    fn recovered(store: &crate::store::FaultStore, fs: &crate::wal::memfs::MemFs) -> Tree {
        let config = Config::new(crash::DIR)
            .cache_size(4 << 20)
            .durability(Durability::Sync)
            // `MemFs` copies a segment's bytes on every sync: keep them small.
            .log_segment_size(64 << 10)
            .evictor_threads(0);
        let tree = crash::open_with(
            config,
            Arc::new(store.crash_image()),
            Arc::new(fs.crash_image()),
        )
        .expect("reopen");
        if let Err(e) = tree.shared.check_structure() {
            panic!("structure after recovery: {e}");
        }
        tree
    }

    fn leaf_of(tree: &Tree, key: &[u8]) -> PageId {
        let guard = sync::pin();
        Path::descend(tree.shared.root_ref(&guard), Seek::Key(key)).leaf()
    }

    /// Whether leaf `pid`'s cached node has changes that are not on disk, and its page.
    fn node_state(tree: &Tree, pid: PageId) -> (bool, Option<u64>) {
        let page = tree.shared.pool.read(pid);
        let node = NodeRef::from_bytes(page.mini().expect("cached"));
        let dirty = if node.kind() == NodeKind::Leaf {
            node.flags() & FLAG_DIRTY != 0
        } else {
            node.dirty_count() > 0
        };
        (dirty, node.disk_page())
    }

    fn stage(tree: &Tree, pid: PageId, batch: &mut PageBatch) -> Staged {
        match tree.shared.stage_leaf(pid, None, batch).expect("stage") {
            Ok(Some(staged)) => staged,
            Ok(None) => panic!("a dirty leaf is staged"),
            Err(_) => panic!("staging restarted"),
        }
    }

    /// The leaf's page as the tracker has it.
    fn tracked_page(tree: &Tree, pid: PageId) -> Option<u64> {
        tree.shared.pages.write_token(pid).0
    }

    /// A staged leaf is unlocked while its batch is written. Afterwards: one nobody touched
    /// is clean in its new page; one written meanwhile stays dirty but lives in the new page
    /// (which holds what it had when staged); one split meanwhile, or written back by
    /// someone else meanwhile, keeps its other page and the staged one is dropped. Every
    /// write is still there after a crash and after a reopen.
    #[test]
    fn leaves_changed_while_their_batch_is_written_are_not_marked_clean() {
        let (store, fs) = crash::disks();
        let tree = tree_on(&store, &fs);
        let n = 2_000;
        for i in 0..n {
            tree.insert(key(i), value(i, 1)).expect("insert");
        }
        let (a, b, c) = (key(100), key(900), key(1_500));
        let (pa, pb, pc) = (leaf_of(&tree, &a), leaf_of(&tree, &b), leaf_of(&tree, &c));
        assert!(pa != pb && pb != pc && pa != pc, "keys share a leaf");

        let mut batch = PageBatch::default();
        let mut staged = vec![
            stage(&tree, pa, &mut batch),
            stage(&tree, pb, &mut batch),
            stage(&tree, pc, &mut batch),
        ];
        let new: Vec<u64> = staged.iter().map(|s| s.new).collect();
        // While the batch would be in flight: write to b's leaf, split c's.
        tree.insert(&b, value(900, 7)).expect("update");
        let wide = vec![0x5a; 400];
        let splits = tree.stats().splits;
        for j in 0..40u32 {
            let mut k = c.clone();
            k.extend_from_slice(format!("-{j:03}").as_bytes());
            tree.insert(k, &wide).expect("split");
        }
        assert!(tree.stats().splits > splits, "no split");
        tree.shared
            .write_staged(&mut staged, &mut batch)
            .expect("write");

        assert_eq!(
            node_state(&tree, pa),
            (false, Some(new[0])),
            "untouched leaf"
        );
        assert_eq!(tracked_page(&tree, pa), Some(new[0]));
        assert_eq!(
            node_state(&tree, pb),
            (true, Some(new[1])),
            "leaf written meanwhile"
        );
        assert_eq!(tracked_page(&tree, pb), Some(new[1]));
        assert_ne!(
            tracked_page(&tree, pc),
            Some(new[2]),
            "leaf split meanwhile"
        );
        assert!(node_state(&tree, pc).0, "the split leaf stays dirty");

        // Written back by someone else (here a checkpoint) while staged: the staged page
        // is dropped, the newer one stays.
        tree.insert(&a, value(100, 8)).expect("update");
        let mut staged = vec![stage(&tree, pa, &mut batch)];
        let dropped = staged[0].new;
        tree.checkpoint().expect("checkpoint");
        let kept = tracked_page(&tree, pa);
        tree.shared
            .write_staged(&mut staged, &mut batch)
            .expect("write");
        assert_ne!(kept, Some(dropped));
        assert_eq!(tracked_page(&tree, pa), kept);
        assert_eq!(node_state(&tree, pa), (false, kept));

        let check = |t: &Tree| {
            for i in 0..n {
                let round = match i {
                    100 => 8,
                    900 => 7,
                    _ => 1,
                };
                assert_eq!(
                    t.get(key(i)).expect("get"),
                    Some(value(i, round)),
                    "key {i}"
                );
            }
            let mut k = c.clone();
            k.extend_from_slice(b"-039");
            assert_eq!(t.get(&k).expect("get"), Some(wide.clone()));
        };
        check(&recovered(&store, &fs));
        check(&tree);
        // Closing checkpoints: what a node marked clean lacks would be lost here.
        drop(tree);
        check(&tree_on(&store, &fs));
    }

    /// The second pass writes only leaves not written since the checkpoint took its LSN:
    /// a leaf written by the first pass and updated since is left dirty (its page already
    /// holds what the checkpoint needs), a leaf split since is written again. After a crash
    /// the log replays the rest on top.
    #[test]
    fn the_second_pass_writes_only_leaves_not_written_since_the_lsn() {
        let (store, fs) = crash::disks();
        let tree = tree_on(&store, &fs);
        let n = 2_000;
        for i in 0..n {
            tree.insert(key(i), value(i, 1)).expect("insert");
        }
        tree.checkpoint().expect("checkpoint");
        for i in 0..n {
            tree.insert(key(i), value(i, 2)).expect("update");
        }
        let mut before_second = 0;
        tree.shared
            .checkpoint_between(|| {
                for i in 0..n {
                    tree.insert(key(i), value(i, 3)).expect("update");
                }
                before_second = tree.stats().pages_written;
            })
            .expect("checkpoint");
        assert_eq!(
            tree.stats().pages_written,
            before_second,
            "the second pass rewrote leaves the first had written"
        );

        // A split after the first pass: the split leaves are written by the second.
        let wide = vec![0x5a; 400];
        let mut before_second = 0;
        tree.shared
            .checkpoint_between(|| {
                for j in 0..40u32 {
                    tree.insert(format!("k000500-{j:03}"), &wide)
                        .expect("split");
                }
                for i in (0..n).step_by(2) {
                    tree.insert(key(i), value(i, 4)).expect("update");
                }
                before_second = tree.stats().pages_written;
            })
            .expect("checkpoint");
        assert!(
            tree.stats().pages_written > before_second,
            "the second pass skipped the split leaves"
        );
        for i in (0..n).step_by(3) {
            tree.insert(key(i), value(i, 5)).expect("update");
        }

        let check = |t: &Tree| {
            for i in 0..n {
                let round = if i % 3 == 0 {
                    5
                } else if i % 2 == 0 {
                    4
                } else {
                    3
                };
                assert_eq!(
                    t.get(key(i)).expect("get"),
                    Some(value(i, round)),
                    "key {i}"
                );
            }
            for j in 0..40u32 {
                let k = format!("k000500-{j:03}");
                assert_eq!(t.get(&k).expect("get"), Some(wide.clone()), "{k}");
            }
        };
        check(&recovered(&store, &fs));
        check(&tree);
        // Closing checkpoints: what a node marked clean lacks would be lost here.
        drop(tree);
        check(&tree_on(&store, &fs));
    }
}
