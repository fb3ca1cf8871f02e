//! Model-checked interleavings of tree operations (shuttle): an insert racing a leaf split,
//! a get racing eviction, an evictor's run racing writes, two writers racing the growth of
//! one mini-page, a page move racing a checkpoint's snapshot, batches racing scans, merges
//! racing a checkpoint (reads racing writes: `shuttle_reads.rs`). Each scenario ends with
//! the structural checker and a comparison of the whole tree with what the threads
//! acknowledged. Trees have 4 KiB pages and small
//! caches, so that a few hundred records split leaves and fill the cache.

use std::collections::BTreeMap;

use crate::config::IoBackend;
use crate::sync::{thread, Arc};
use crate::tree::writeback::PageBatch;
use crate::{Config, Tree};

pub(in crate::tree) type Kv = (Vec<u8>, Vec<u8>);

/// A value that names its key and version, so a read can tell a torn or misplaced value.
pub(in crate::tree) fn val(key: &[u8], version: u8, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(key.len() + 1));
    v.push(version);
    v.extend_from_slice(key);
    while v.len() < len {
        v.push(version ^ (v.len() as u8));
    }
    v
}

/// Every record, ascending, and checks descending gives the same.
fn contents(tree: &Tree) -> Vec<Kv> {
    let up: Vec<Kv> = tree.iter().map(|r| r.expect("iter")).collect();
    let mut down: Vec<Kv> = tree.iter().rev().map(|r| r.expect("rev iter")).collect();
    down.reverse();
    assert_eq!(up, down, "ascending and descending scans differ");
    up
}

/// Checks the structure and that the tree holds exactly `expected`.
pub(in crate::tree) fn check_final(tree: &Tree, expected: &BTreeMap<Vec<u8>, Vec<u8>>) {
    if let Err(e) = tree.shared().check_structure() {
        panic!("structure: {e}");
    }
    let want: Vec<Kv> = expected
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(contents(tree), want);
    for (k, v) in expected {
        assert_eq!(tree.get(k).expect("get").as_ref(), Some(v));
    }
}

/// A file-backed tree with the smallest cache, on the portable backend (`io_uring` rings are
/// per OS thread, and shuttle runs every model thread on one).
fn tiny_file_tree(dir: &std::path::Path) -> Tree {
    Tree::open(
        Config::new(dir)
            .page_size(4096)
            .cache_size(64 << 10)
            .io_backend(IoBackend::Pread)
            .promotion_percent(50),
    )
    .expect("open")
}

/// Adds leaves of filler records (keys from `z`, after every scenario's) until the tree
/// has more than its cache holds whole, so that reads that miss cache their record in a
/// mini-page rather than the whole leaf (`whole_leaves.rs`). Returns what it wrote.
fn fill_past_whole_leaves(tree: &Tree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut filler = BTreeMap::new();
    for i in 0..=u16::MAX {
        if !tree.shared().caches_whole_leaves() {
            return filler;
        }
        let k = [&b"z"[..], &i.to_be_bytes()].concat();
        let v = val(&k, 0, 1500);
        tree.insert(&k, &v).expect("filler");
        filler.insert(k, v);
    }
    panic!("the tree never outgrew its cache");
}

/// One leaf nearly full; two threads insert records that each may trigger its split, a third
/// reads the records that were there before.
fn insert_races_split() {
    let tree = Arc::new(
        Tree::open(Config::in_memory().page_size(4096).cache_size(256 << 10)).expect("open"),
    );
    let mut expected = BTreeMap::new();
    for i in 0..11u8 {
        let k = vec![b'k', i * 2];
        let v = val(&k, 0, 300);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    assert_eq!(tree.stats().splits, 0, "setup already split");
    let writers: Vec<_> = (0..2u8)
        .map(|t| {
            let tree = tree.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                for j in 0..2u8 {
                    let k = vec![b'k', 1 + 2 * (2 * j + t)];
                    let v = val(&k, t + 1, 400);
                    tree.insert(&k, &v).expect("insert");
                    assert_eq!(
                        tree.get(&k).expect("get"),
                        Some(v.clone()),
                        "read own write"
                    );
                    mine.push((k, v));
                }
                mine
            })
        })
        .collect();
    let reader = {
        let (tree, before) = (tree.clone(), expected.clone());
        thread::spawn(move || {
            for (k, v) in before.iter().step_by(3) {
                assert_eq!(tree.get(k).expect("get").as_ref(), Some(v), "lost {k:?}");
            }
        })
    };
    for w in writers {
        expected.extend(w.join().expect("writer"));
    }
    reader.join().expect("reader");
    assert!(tree.stats().splits > 0, "no split happened");
    check_final(&tree, &expected);
}

#[test]
fn shuttle_insert_races_leaf_split() {
    shuttle::check_random(insert_races_split, 1000);
    shuttle::check_pct(insert_races_split, 1000, 3);
}

/// Leaves on disk behind a tiny cache; one thread reads every key while another writes
/// (creating mini-pages) and evicts.
fn get_races_eviction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Arc::new(tiny_file_tree(dir.path()));
    let mut expected = BTreeMap::new();
    for i in 0..24u8 {
        let k = vec![b'g', i];
        let v = val(&k, 0, 500);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    tree.shared().evict_all();
    let reader = {
        let (tree, before) = (tree.clone(), expected.clone());
        thread::spawn(move || {
            for (k, v) in before.iter().step_by(5) {
                assert_eq!(tree.get(k).expect("get").as_ref(), Some(v), "lost {k:?}");
            }
        })
    };
    let writer = {
        let tree = tree.clone();
        thread::spawn(move || {
            let k = vec![b'g', 7];
            let v = val(&k, 1, 40);
            tree.insert(&k, &v).expect("insert");
            tree.shared().make_room().expect("evict");
            tree.shared().make_room().expect("evict");
            (k, v)
        })
    };
    let (k, v) = writer.join().expect("writer");
    reader.join().expect("reader");
    expected.insert(k, v);
    assert!(tree.stats().evictions > 0);
    check_final(&tree, &expected);
}

#[test]
fn shuttle_get_races_eviction() {
    shuttle::check_random(get_races_eviction, 300);
    shuttle::check_pct(get_races_eviction, 300, 3);
}

/// Leaves on disk behind a tiny cache; one thread updates keys (dirty mini-pages) while an
/// evictor's runs write them back in batches and evict them, and a third thread reads.
fn evictor_run_races_writes_and_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Arc::new(tiny_file_tree(dir.path()));
    let mut expected = BTreeMap::new();
    for i in 0..24u8 {
        let k = vec![b'e', i];
        let v = val(&k, 0, 500);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    tree.shared().evict_all();
    let updated: Vec<(Vec<u8>, Vec<u8>)> = [3u8, 11, 19]
        .iter()
        .map(|&i| {
            let k = vec![b'e', i];
            let v = val(&k, 1, 40);
            (k, v)
        })
        .collect();
    let writer = {
        let (tree, updated) = (tree.clone(), updated.clone());
        thread::spawn(move || {
            for (k, v) in &updated {
                tree.insert(k, v).expect("update");
            }
        })
    };
    let evictor = {
        let tree = tree.clone();
        thread::spawn(move || {
            let mut batch = PageBatch::default();
            tree.shared()
                .make_room_batch(&mut batch)
                .expect("evict a run");
            tree.shared()
                .make_room_batch(&mut batch)
                .expect("evict a run");
        })
    };
    let reader = {
        let (tree, before) = (tree.clone(), expected.clone());
        thread::spawn(move || {
            for (k, v) in before.iter().skip(1).step_by(4) {
                assert_eq!(tree.get(k).expect("get").as_ref(), Some(v), "lost {k:?}");
            }
        })
    };
    writer.join().expect("writer");
    evictor.join().expect("evictor");
    reader.join().expect("reader");
    expected.extend(updated);
    check_final(&tree, &expected);
}

#[test]
fn shuttle_evictor_run_races_writes_and_reads() {
    shuttle::check_random(evictor_run_races_writes_and_reads, 300);
    shuttle::check_pct(evictor_run_races_writes_and_reads, 300, 3);
}

/// A leaf on disk with no mini-page; two writers put records into it, so its mini-page is
/// created, grown and possibly merged while the other writes; a reader looks on.
fn writers_race_mini_page_growth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Arc::new(tiny_file_tree(dir.path()));
    let mut expected = BTreeMap::new();
    for i in 0..6u8 {
        let k = vec![b'w', i * 10];
        let v = val(&k, 0, 200);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    // The reader's miss must not turn the leaf into a mirror.
    expected.extend(fill_past_whole_leaves(&tree));
    tree.shared().evict_all();
    let grows_before = tree.stats().mini_grows;
    let writers: Vec<_> = (0..2u8)
        .map(|t| {
            let tree = tree.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                for j in 0..3u8 {
                    let k = vec![b'w', 1 + j * 10 + t];
                    let v = val(&k, t + 1, 20 + 30 * usize::from(j));
                    tree.insert(&k, &v).expect("insert");
                    mine.push((k, v));
                }
                // Overwrite one pre-existing record each: an update buffered over the leaf.
                let k = vec![b'w', 20 + t * 10];
                let v = val(&k, t + 1, 60);
                tree.insert(&k, &v).expect("update");
                mine.push((k, v));
                mine
            })
        })
        .collect();
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            let k = vec![b'w', 50];
            assert_eq!(
                tree.get(&k).expect("get"),
                Some(val(&k, 0, 200)),
                "untouched record"
            );
        })
    };
    for w in writers {
        expected.extend(w.join().expect("writer"));
    }
    reader.join().expect("reader");
    assert!(
        tree.stats().mini_grows > grows_before,
        "the mini-page never grew"
    );
    check_final(&tree, &expected);
}

#[test]
fn shuttle_two_writers_race_mini_page_growth() {
    shuttle::check_random(writers_race_mini_page_growth, 500);
    shuttle::check_pct(writers_race_mini_page_growth, 500, 3);
}

/// A write-back moving a leaf to a new page races a checkpoint's snapshot of the leaf map:
/// the snapshot must never name a page the write-back freed (after a crash, that page could
/// hold another leaf's records).
fn page_move_races_snapshot() {
    use crate::tree::storage::PageTracker;
    let tracker = Arc::new(PageTracker::from_checkpoint(&[(7, 100, 0)]));
    // The last durable checkpoint names page 100; the leaf was written to 200 since.
    assert!(
        !tracker.moved(7, Some(100), 200, 1),
        "a checkpointed page was freed at once"
    );
    let mover = {
        let tracker = tracker.clone();
        thread::spawn(move || tracker.moved(7, Some(200), 300, 2))
    };
    let snapshot = tracker
        .begin_snapshot(vec![(Vec::new(), 7)])
        .expect("the leaf has a page");
    let freed_200 = mover.join().expect("mover");
    let named = snapshot[0].page;
    assert!(
        !(freed_200 && named == 200),
        "the snapshot names page 200, which the write-back freed"
    );
    // The image LSN travels with its page.
    assert_eq!(snapshot[0].lsn, if named == 200 { 1 } else { 2 });
    // Once the checkpoint is durable, what it no longer names is freed, and only that.
    let freed = tracker.finish_checkpoint(true);
    assert!(
        !freed.contains(&named),
        "freed {freed:?}, snapshot names {named}"
    );
}

#[test]
fn shuttle_page_move_races_snapshot() {
    shuttle::check_random(page_move_races_snapshot, 1000);
    shuttle::check_pct(page_move_races_snapshot, 1000, 3);
}

/// Two batches over keys in three leaves race each other, a split and two scans (one each
/// way): every scan must see each batch whole or not at all, and the batches in one order.
fn batches_race_scans() {
    let tree = Arc::new(
        Tree::open(Config::in_memory().page_size(4096).cache_size(256 << 10)).expect("open"),
    );
    let mut expected = BTreeMap::new();
    // 36 records of 300 bytes: three leaves or more; the watched keys sit far apart.
    for i in 0..36u8 {
        let k = vec![b'k', i * 4];
        let v = val(&k, 0, 300);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    let watched: [Vec<u8>; 3] = [vec![b'k', 0], vec![b'k', 18 * 4], vec![b'k', 35 * 4]];
    let batch_of = |tree: &Tree, keys: &[&Vec<u8>], version: u8| {
        let mut b = tree.batch();
        for k in keys {
            b.insert(&tree.default_keyspace(), k, val(k, version, 300));
        }
        b.commit().expect("batch");
    };
    let first = {
        let (tree, w) = (tree.clone(), watched.clone());
        thread::spawn(move || batch_of(&tree, &[&w[0], &w[1], &w[2]], 1))
    };
    let second = {
        let (tree, w) = (tree.clone(), watched.clone());
        thread::spawn(move || {
            // Crowds the middle leaf toward a split first.
            for j in 0..3u8 {
                let k = vec![b'k', 18 * 4 + 1 + j];
                tree.insert(&k, val(&k, 0, 300)).expect("insert");
            }
            batch_of(&tree, &[&w[0], &w[2]], 2);
        })
    };
    // The versions of the watched keys a scan may see: before both, after either, after both
    // in either order.
    let allowed = [[0, 0, 0], [1, 1, 1], [2, 0, 2], [2, 1, 2]];
    let seen = |rows: &[Kv]| -> [u8; 3] {
        let mut out = [u8::MAX; 3];
        for (i, w) in watched.iter().enumerate() {
            let row = rows
                .iter()
                .find(|(k, _)| k == w)
                .expect("watched key present");
            out[i] = row.1[0];
        }
        out
    };
    let up: Vec<Kv> = tree.iter().map(|r| r.expect("iter")).collect();
    let mut down: Vec<Kv> = tree.iter().rev().map(|r| r.expect("rev iter")).collect();
    down.reverse();
    for (what, rows) in [("forward", &up), ("backward", &down)] {
        let got = seen(rows);
        assert!(allowed.contains(&got), "{what} scan saw {got:?}");
    }
    first.join().expect("first");
    second.join().expect("second");
    let end = seen(&contents(&tree));
    assert!(end == [1, 1, 1] || end == [2, 1, 2], "final {end:?}");
    for j in 0..3u8 {
        let k = vec![b'k', 18 * 4 + 1 + j];
        expected.insert(k.clone(), val(&k, 0, 300));
    }
    for (i, w) in watched.iter().enumerate() {
        expected.insert(w.clone(), val(w, end[i], 300));
    }
    check_final(&tree, &expected);
}

#[test]
fn shuttle_batches_race_scans() {
    shuttle::check_random(batches_race_scans, 500);
    shuttle::check_pct(batches_race_scans, 500, 3);
}

/// The u64 add merge operator.
fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    (!operand.is_empty()).then(|| (n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

/// Blind merges into counters of a leaf on disk race a checkpoint (which builds the leaf's
/// image, lets go of it, and installs the page only if nobody wrote the leaf meanwhile) and
/// a reader. Every read must be a count some prefix of the merges gives; at the end each
/// counter holds every merge exactly once, before and after a reopen.
fn merges_race_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || {
        Config::new(dir.path())
            .page_size(4096)
            .cache_size(64 << 10)
            .io_backend(IoBackend::Pread)
            .durability(crate::Durability::Sync)
            .merge_operator(add)
    };
    let tree = Arc::new(Tree::open(config()).expect("open"));
    let keys: Vec<Vec<u8>> = (0..3u8).map(|i| vec![b'c', i]).collect();
    for k in &keys {
        tree.insert(k, 10u64.to_le_bytes()).expect("insert");
    }
    tree.shared().evict_all();
    let merger = {
        let (tree, keys) = (tree.clone(), keys.clone());
        thread::spawn(move || {
            for round in 0..2 {
                for k in &keys {
                    tree.merge(k, 1u64.to_le_bytes()).expect("merge");
                }
                if round == 0 {
                    let mut b = tree.batch();
                    b.merge(&tree.default_keyspace(), &keys[0], 100u64.to_le_bytes());
                    b.merge(&tree.default_keyspace(), &keys[2], 100u64.to_le_bytes());
                    b.commit().expect("batch");
                }
            }
        })
    };
    let checkpointer = {
        let tree = tree.clone();
        thread::spawn(move || tree.checkpoint().expect("checkpoint"))
    };
    let reader = {
        let (tree, k) = (tree.clone(), keys[0].clone());
        thread::spawn(move || {
            let v = tree.get(&k).expect("get").expect("present");
            let n = u64::from_le_bytes(v.try_into().expect("8 bytes"));
            assert!([10, 11, 111, 112].contains(&n), "read {n}");
        })
    };
    merger.join().expect("merger");
    checkpointer.join().expect("checkpointer");
    reader.join().expect("reader");
    let expected: BTreeMap<Vec<u8>, Vec<u8>> = keys
        .iter()
        .zip([112u64, 12, 112])
        .map(|(k, n)| (k.clone(), n.to_le_bytes().to_vec()))
        .collect();
    check_final(&tree, &expected);
    // The threads are done with their handles: this drop closes the tree.
    drop(tree);
    let tree = Tree::open(config()).expect("reopen");
    check_final(&tree, &expected);
}

#[test]
fn shuttle_merges_race_checkpoint() {
    shuttle::check_random(merges_race_checkpoint, 300);
    shuttle::check_pct(merges_race_checkpoint, 300, 3);
}

/// What a writer does to one key: its new value, or `None` to remove it.
pub(in crate::tree) type Change = (Vec<u8>, Option<Vec<u8>>);

/// A file-backed tree of 24 records of `value_len` bytes, all on disk only, behind a cache
/// that can hold every leaf whole (a lookup that misses then caches its leaf as a mirror),
/// and what it holds.
pub(in crate::tree) fn leaves_on_disk(
    dir: &std::path::Path,
    value_len: usize,
) -> (Arc<Tree>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let config = Config::new(dir)
        .page_size(4096)
        .cache_size(64 << 10)
        .io_backend(IoBackend::Pread)
        .promotion_percent(100);
    let tree = Arc::new(Tree::open(config).expect("open"));
    let mut expected = BTreeMap::new();
    for i in 0..24u8 {
        let k = vec![b'c', i * 2];
        let v = val(&k, 0, value_len);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    tree.shared().evict_all();
    assert!(
        tree.shared().caches_whole_leaves(),
        "setup outgrew the cache"
    );
    (tree, expected)
}

/// A thread that makes `changes` to `tree` in order.
pub(in crate::tree) fn spawn_writer(
    tree: &Arc<Tree>,
    changes: &[Change],
) -> thread::JoinHandle<()> {
    let (tree, changes) = (tree.clone(), changes.to_vec());
    thread::spawn(move || {
        for (k, v) in &changes {
            match v {
                Some(v) => tree.insert(k, v).expect("insert"),
                None => tree.remove(k).expect("remove"),
            }
        }
    })
}

/// Makes `changes` to the model of the tree.
pub(in crate::tree) fn apply(expected: &mut BTreeMap<Vec<u8>, Vec<u8>>, changes: Vec<Change>) {
    for (k, v) in changes {
        match v {
            Some(v) => expected.insert(k, v),
            None => expected.remove(&k),
        };
    }
}
