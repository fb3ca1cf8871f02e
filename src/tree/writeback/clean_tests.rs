//! Tests of `clean.rs`: a pass writes back every buffered leaf with one read per mini-page,
//! stops when writes resume and goes on from there, and the idle writer thread starts only
//! once writes pause.

use std::time::{Duration, Instant};

use crate::node::{NodeKind, NodeRef, RecordKind};
use crate::pool::Location;
use crate::tree::writeback::checkpoint::BATCH;
use crate::tree::writeback::evict::needs_write_back;
use crate::tree::writeback::page_batch::PageBatch;
use crate::{Config, Durability, Tree};

fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

fn value(i: u32, round: u8) -> Vec<u8> {
    vec![round ^ (i as u8); 60]
}

const N: u32 = 20_000;

fn config(dir: &std::path::Path, idle: Option<Duration>) -> Config {
    Config::new(dir)
        .cache_size(8 << 20)
        .durability(Durability::None)
        .idle_write_back(idle)
}

/// Records `0..N` on disk, then a tree reopened with `idle` whose every seventh record is
/// updated: mini-pages of dirty records over leaves that have a disk page.
fn updated_tree(dir: &std::path::Path, idle: Option<Duration>) -> Tree {
    let tree = Tree::open(config(dir, None)).expect("open");
    for i in 0..N {
        tree.insert(key(i), value(i, 1)).expect("insert");
    }
    tree.close().expect("close");
    let tree = Tree::open(config(dir, idle)).expect("reopen");
    for i in (0..N).step_by(7) {
        tree.insert(key(i), value(i, 2)).expect("update");
    }
    tree
}

/// (mini-pages over a disk page needing a write-back, all cached nodes needing one).
fn dirty(tree: &Tree) -> (usize, usize) {
    let (mut minis, mut all) = (0, 0);
    for (pid, location) in tree.shared().pool().page_entries() {
        if !matches!(location, Location::Mini(_)) {
            continue;
        }
        let page = tree.shared().pool().read(pid);
        let Some(bytes) = page.mini() else { continue };
        let node = NodeRef::from_bytes(bytes);
        if needs_write_back(node) {
            all += 1;
            if node.kind() == NodeKind::Mini && node.disk_page().is_some() {
                minis += 1;
            }
        }
    }
    (minis, all)
}

fn check_values(tree: &Tree) {
    for i in 0..N {
        let round = if i % 7 == 0 { 2 } else { 1 };
        assert_eq!(
            tree.get(key(i)).expect("get"),
            Some(value(i, round)),
            "key {i}"
        );
    }
}

#[test]
fn a_pass_writes_back_every_leaf_reading_each_page_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = updated_tree(dir.path(), None);
    let (minis, all) = dirty(&tree);
    assert!(minis > 2 * BATCH, "only {minis} dirty mini-pages");
    let before = tree.stats();
    let mut from = 0;
    assert!(tree
        .shared()
        .write_back_idle(&mut from, &|| true)
        .expect("pass"));
    let after = tree.stats();
    assert_eq!(dirty(&tree), (0, 0));
    assert_eq!(
        after.pages_read - before.pages_read,
        minis as u64,
        "one read per mini-page"
    );
    assert_eq!(after.write_backs - before.write_backs, all as u64);
    assert_eq!(after.pages_written - before.pages_written, all as u64);
    // The updates stay cached, now as clean records.
    let key0 = crate::tree::keyspace::stored_key(&key(0));
    let guard = crate::sync::pin();
    let shared = tree.shared();
    let (_, page) =
        shared
            .index()
            .read_leaf(shared.pool(), &guard, crate::tree::index::Seek::Key(&key0));
    let node = NodeRef::from_bytes(page.mini().expect("cached"));
    if node.kind() == NodeKind::Mini {
        assert_eq!(node.record_kind(0), RecordKind::Cache);
    }
    drop(page);
    check_values(&tree);
    tree.close().expect("close");
    check_values(&Tree::open(config(dir.path(), None)).expect("reopen"));
}

#[test]
fn a_pass_stopped_by_a_write_goes_on_where_it_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = updated_tree(dir.path(), None);
    let (_, all) = dirty(&tree);
    assert!(all > 2 * BATCH, "only {all} dirty leaves");
    // Idle for one batch, then a write arrives.
    let calls = std::cell::Cell::new(0);
    let idle = || {
        calls.set(calls.get() + 1);
        calls.get() == 1
    };
    let mut from = 0;
    assert!(!tree
        .shared()
        .write_back_idle(&mut from, &idle)
        .expect("pass"));
    assert_eq!(dirty(&tree).1, all - BATCH, "one batch written");
    assert!(from > 0, "the next pass does not go on from the stop");
    // The leaves before `from` are all written, the ones from it on are not.
    let first_dirty = tree
        .shared()
        .buffered_leaves(0)
        .find(|&pid| {
            let page = tree.shared().pool().read(pid);
            page.mini()
                .is_some_and(|b| needs_write_back(NodeRef::from_bytes(b)))
        })
        .expect("dirty leaf");
    assert!(
        first_dirty >= from,
        "leaf {first_dirty} before {from} left dirty"
    );
    assert!(tree
        .shared()
        .write_back_idle(&mut from, &|| true)
        .expect("pass"));
    assert_eq!(dirty(&tree), (0, 0));
    assert_eq!(from, 0);
    check_values(&tree);
}

/// Polls until `done` or `limit` passes; true if `done`.
fn wait_for(limit: Duration, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

#[test]
fn the_idle_writer_cleans_once_writes_pause_and_not_when_turned_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = updated_tree(dir.path(), Some(Duration::from_millis(20)));
    assert!(
        wait_for(Duration::from_secs(20), || dirty(&tree) == (0, 0)),
        "leaves still dirty: {:?}",
        dirty(&tree)
    );
    assert!(tree.stats().write_backs > 0);
    // A write after the pass is written back after the next pause.
    tree.insert(key(3), value(3, 2)).expect("update");
    assert!(wait_for(Duration::from_secs(20), || dirty(&tree) == (0, 0)));
    tree.insert(key(3), value(3, 1)).expect("restore");
    check_values(&tree);
    tree.close().expect("close");

    let tree = updated_tree(dir.path(), None);
    let (_, all) = dirty(&tree);
    let before = tree.stats().write_backs;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        dirty(&tree).1,
        all,
        "turned off, yet leaves were written back"
    );
    assert_eq!(tree.stats().write_backs, before);
}

#[test]
fn an_evictors_batch_writes_its_leaves_together_and_evicts_them_without_another_write() {
    use crate::tree::persist::crash;
    let (store, fs) = crash::disks();
    let config = crash::quiet_config().durability(Durability::None);
    let tree = crash::open_with(config.clone(), store.clone(), fs.clone()).expect("open");
    for i in 0..N {
        tree.insert(key(i), value(i, 1)).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    tree.shared().evict_all();
    // Every seventh record updated: a dirty mini-page over each leaf's disk page.
    for i in (0..N).step_by(7) {
        tree.insert(key(i), value(i, 2)).expect("update");
    }
    let (minis, all) = dirty(&tree);
    assert!(minis > 2 * BATCH, "only {minis} dirty mini-pages");
    assert_eq!(minis, all);

    let (before, (alone, batched)) = (tree.stats(), store.pages_written());
    // The first runs at the head may hold only dead blocks (mini-pages that grew).
    let mut batch = PageBatch::default();
    while tree.stats().evictions - before.evictions < BATCH as u64 {
        tree.shared()
            .make_room_batch(&mut batch)
            .expect("evict a batch");
    }
    let after = tree.stats();
    let evicted = after.evictions - before.evictions;
    // Each evicted leaf was written once, in a batch, and read once, ahead of it.
    assert_eq!(after.write_backs - before.write_backs, evicted);
    assert_eq!(after.pages_read - before.pages_read, evicted);
    assert_eq!(
        store.pages_written(),
        (alone, batched + evicted),
        "(one at a time, batched)"
    );
    assert_eq!(dirty(&tree).1, all - evicted as usize);
    check_values(&tree);
    tree.close().expect("close");
    let tree = crash::open_with(config, store, fs).expect("reopen");
    check_values(&tree);
}
