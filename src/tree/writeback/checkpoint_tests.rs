//! Tests of `checkpoint.rs`: passes against busy leaves, leaves changed while their batch is
//! written, and the second pass's skip (with crashes: `checkpoint_crash_tests.rs`).

use std::time::{Duration, Instant};

use super::{PageBatch, Staged};
use crate::node::{NodeKind, NodeRef};
use crate::pool::{Location, PageId};
use crate::sync::{self, Arc};
use crate::tree::index::Seek;
use crate::tree::persist::crash;
use crate::tree::{Step, FLAG_DIRTY};
use crate::{Config, Durability, Tree};

pub(super) fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

pub(super) fn value(i: u32, round: u8) -> Vec<u8> {
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
        .durability(Durability::Buffered)
        .idle_write_back(None);
    let tree = Tree::open(config.clone()).expect("open");
    let n = 20_000;
    for i in 0..n {
        tree.insert(key(i), value(i, 1)).expect("insert");
    }
    let minis: Vec<_> = tree
        .shared()
        .pool()
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
        let pool = tree.shared().pool();
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
    if let Err(e) = tree.shared().check_structure() {
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
pub(super) fn tree_on(
    store: &Arc<crate::store::FaultStore>,
    fs: &Arc<crate::wal::memfs::MemFs>,
) -> Tree {
    crash::open_with(config(), store.clone(), fs.clone()).expect("open")
}

/// `tree_on` with records `0..n` inserted at version 1.
fn loaded_tree_on(
    store: &Arc<crate::store::FaultStore>,
    fs: &Arc<crate::wal::memfs::MemFs>,
    n: u32,
) -> Tree {
    let tree = tree_on(store, fs);
    for i in 0..n {
        tree.insert(key(i), value(i, 1)).expect("insert");
    }
    tree
}

/// `Sync` writes, a 4 MiB cache, evictions only in the writers (`crash::quiet_config`).
pub(super) use crate::tree::persist::quiet_config as config;

/// Reopens from the disks' crash images.
pub(super) fn recovered(store: &crate::store::FaultStore, fs: &crate::wal::memfs::MemFs) -> Tree {
    recovered_with(config(), store, fs)
}

/// `recovered` with another configuration.
pub(super) fn recovered_with(
    config: Config,
    store: &crate::store::FaultStore,
    fs: &crate::wal::memfs::MemFs,
) -> Tree {
    let tree = crash::open_with(
        config,
        Arc::new(store.crash_image()),
        Arc::new(fs.crash_image()),
    )
    .expect("reopen");
    if let Err(e) = tree.shared().check_structure() {
        panic!("structure after recovery: {e}");
    }
    tree
}

fn leaf_of(tree: &Tree, key: &[u8]) -> PageId {
    let guard = sync::pin();
    let key = crate::tree::keyspace::stored_key(key);
    tree.shared()
        .index()
        .descend(&guard, Seek::Key(&key))
        .leaf()
}

/// Whether leaf `pid`'s cached node has changes that are not on disk, and its page.
pub(super) fn node_state(tree: &Tree, pid: PageId) -> (bool, Option<u64>) {
    let page = tree.shared().pool().read(pid);
    let node = NodeRef::from_bytes(page.mini().expect("cached"));
    let dirty = if node.kind() == NodeKind::Leaf {
        node.flags() & FLAG_DIRTY != 0
    } else {
        node.dirty_count() > 0
    };
    (dirty, node.disk_page())
}

fn stage(tree: &Tree, pid: PageId, batch: &mut PageBatch) -> Staged {
    match tree.shared().stage_leaf(pid, None, batch).expect("stage") {
        Step::Done(Some(staged)) => staged,
        Step::Done(None) => panic!("a dirty leaf is staged"),
        Step::Restart(_) => panic!("staging restarted"),
    }
}

/// The leaf's page as the tracker has it.
fn tracked_page(tree: &Tree, pid: PageId) -> Option<u64> {
    tree.shared().storage().pages().leaf_page(pid)
}

/// A staged leaf is unlocked while its batch is written. Afterwards: one nobody touched
/// is clean in its new page; one written meanwhile stays dirty but lives in the new page
/// (which holds what it had when staged); one split meanwhile, or written back by
/// someone else meanwhile, keeps its other page and the staged one is dropped. Every
/// write is still there after a crash and after a reopen.
#[test]
fn leaves_changed_while_their_batch_is_written_are_not_marked_clean() {
    let (store, fs) = crash::disks();
    let n = 2_000;
    let tree = loaded_tree_on(&store, &fs, n);
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
    tree.shared()
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
    tree.shared()
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
    let n = 2_000;
    let tree = loaded_tree_on(&store, &fs, n);
    tree.checkpoint().expect("checkpoint");
    for i in 0..n {
        tree.insert(key(i), value(i, 2)).expect("update");
    }
    let mut before_second = 0;
    tree.shared()
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
    tree.shared()
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
