//! Model-checked interleavings of reads with writes (shuttle): scans racing a split and a
//! leaf removal, lock-free reads racing writers to their leaf, reads racing a split of
//! another leaf, lookups caching whole leaves racing writes and eviction. Each scenario
//! ends as those of `shuttle.rs` do, whose helpers it shares.

use std::collections::BTreeMap;

use super::shuttle::{apply, check_final, leaves_on_disk, spawn_writer, val, Change, Kv};
use crate::sync::{thread, Arc};
use crate::{Config, Tree};

/// Structure changes that readers saw and walked past, over every schedule of
/// `splits_elsewhere_restart_no_reader` (shuttle counts nothing across runs).
static RECHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Three leaves; the middle one holds only keys a thread removes (the leaf is unlinked),
/// another thread splits the last leaf, and a third scans both ways: every stable key once,
/// in order, and nothing that was never written.
fn scan_races_split_and_merge() {
    let tree = Arc::new(
        Tree::open(Config::in_memory().page_size(4096).cache_size(256 << 10)).expect("open"),
    );
    let mut stable = BTreeMap::new();
    let mut churn = Vec::new();
    for (prefix, n) in [(b'a', 3u8), (b'm', 3), (b'z', 3)] {
        for i in 0..n {
            let k = vec![prefix, i];
            let v = val(&k, 0, 1100);
            tree.insert(&k, &v).expect("insert");
            if prefix == b'm' {
                churn.push(k);
            } else {
                stable.insert(k, v);
            }
        }
    }
    // The layout is deterministic: a leaf of churn keys only before [z0 ..] (ascending
    // inserts split packed: [a0 a1 a2] [m0 m1 m2] [z0 ..]); the removals empty it.
    let leaves = tree.shared().index().leaves();
    assert!(
        leaves
            .windows(2)
            .any(|w| w[0].0.starts_with(&[0, b'm']) && w[1].0 == [0, b'z']),
        "setup did not give the last churn keys a leaf of their own: {leaves:?}"
    );
    let splits_before = tree.stats().splits;
    let remover = {
        let (tree, churn) = (tree.clone(), churn.clone());
        thread::spawn(move || {
            for k in &churn {
                tree.remove(k).expect("remove");
            }
            // An emptied leaf is unlinked only if the structure lock is free at that moment
            // (by design); another removal in it retries.
            for _ in 0..100 {
                if tree.stats().leaves_removed > 0 {
                    break;
                }
                tree.remove(&churn[churn.len() - 1]).expect("remove");
                thread::yield_now();
            }
        })
    };
    let splitter = {
        let tree = tree.clone();
        thread::spawn(move || {
            let mut added = Vec::new();
            for i in 0..2u8 {
                let k = vec![b'z', 10 + i];
                let v = val(&k, 1, 1100);
                tree.insert(&k, &v).expect("insert");
                added.push((k, v));
            }
            added
        })
    };
    let scanner = {
        let (tree, stable, churn) = (tree.clone(), stable.clone(), churn.clone());
        thread::spawn(move || {
            for rev in [false, true] {
                let mut got: Vec<Kv> = if rev {
                    tree.iter().rev().map(|r| r.expect("scan")).collect()
                } else {
                    tree.iter().map(|r| r.expect("scan")).collect()
                };
                if rev {
                    got.reverse();
                }
                for w in got.windows(2) {
                    assert!(w[0].0 < w[1].0, "rev {rev}: keys out of order or repeated");
                }
                for (k, v) in &stable {
                    assert!(
                        got.iter().any(|(gk, gv)| gk == k && gv == v),
                        "rev {rev}: scan missed stable key {k:?}"
                    );
                }
                for (k, v) in &got {
                    let known =
                        stable.contains_key(k) || churn.contains(k) || (k[0] == b'z' && k[1] >= 10);
                    assert!(known, "rev {rev}: scan invented {k:?}");
                    assert_eq!(v[1..=k.len()], k[..], "rev {rev}: torn value for {k:?}");
                }
            }
        })
    };
    remover.join().expect("remover");
    stable.extend(splitter.join().expect("splitter"));
    scanner.join().expect("scanner");
    let s = tree.stats();
    assert!(s.splits > splits_before, "no split: {s:?}");
    assert!(s.leaves_removed > 0, "no leaf removed: {s:?}");
    check_final(&tree, &stable);
}

#[test]
fn shuttle_scan_races_split_and_merge() {
    shuttle::check_random(scan_races_split_and_merge, 1000);
    shuttle::check_pct(scan_races_split_and_merge, 1000, 3);
}

/// One leaf whose records a writer overwrites in place while a reader looks them up and
/// scans them without locks (`optimistic.rs`): every value read is one the writer wrote
/// whole, and a scan sees each key once, in order.
fn optimistic_reads_race_writers() {
    let tree = Arc::new(
        Tree::open(Config::in_memory().page_size(4096).cache_size(256 << 10)).expect("open"),
    );
    let keys: Vec<Vec<u8>> = (0..6u8).map(|i| vec![b'o', i]).collect();
    for k in &keys {
        tree.insert(k, val(k, 0, 60)).expect("insert");
    }
    let writer = {
        let (tree, keys) = (tree.clone(), keys.clone());
        thread::spawn(move || {
            for version in 1..3u8 {
                for k in keys.iter().step_by(2) {
                    tree.insert(k, val(k, version, 60 + usize::from(version)))
                        .expect("insert");
                }
            }
        })
    };
    let reader = {
        let (tree, keys) = (tree.clone(), keys.clone());
        thread::spawn(move || {
            let whole =
                |k: &[u8], v: &[u8]| (0..3u8).any(|ver| v == val(k, ver, 60 + usize::from(ver)));
            for k in keys.iter().take(3) {
                let v = tree.get(k).expect("get").expect("present");
                assert!(whole(k, &v), "torn value for {k:?}: {v:?}");
            }
            let seen: Vec<Kv> = tree.iter().map(|r| r.expect("scan")).collect();
            assert_eq!(
                seen.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
                keys,
                "a scan lost, repeated or reordered keys"
            );
            for (k, v) in &seen {
                assert!(whole(k, v), "torn value in a scan for {k:?}");
            }
        })
    };
    writer.join().expect("writer");
    reader.join().expect("reader");
    let expected: BTreeMap<_, _> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.clone(),
                if i % 2 == 0 {
                    val(k, 2, 62)
                } else {
                    val(k, 0, 60)
                },
            )
        })
        .collect();
    check_final(&tree, &expected);
}

#[test]
fn shuttle_optimistic_reads_race_writers() {
    shuttle::check_random(optimistic_reads_race_writers, 300);
    shuttle::check_pct(optimistic_reads_race_writers, 300, 3);
}

/// A writer splits the last leaf while a reader looks up and scans the first (locked and
/// lock-free paths alike): the reader may have to walk the index again, but never lets go of
/// its leaf (`Index::settle`), since no change took a key from it.
fn splits_elsewhere_restart_no_reader() {
    let tree = Arc::new(
        Tree::open(Config::in_memory().page_size(4096).cache_size(256 << 10)).expect("open"),
    );
    let mut expected = BTreeMap::new();
    for i in 0..24u8 {
        let k = vec![b'k', i * 2];
        let v = val(&k, 0, 300);
        tree.insert(&k, &v).expect("insert");
        expected.insert(k, v);
    }
    let index = tree.shared().index();
    let leaves = index.leaves();
    assert!(leaves.len() >= 2, "setup made one leaf");
    // The index holds stored keys (behind the default keyspace's prefix).
    let first_high = crate::tree::keyspace::user_key(&leaves[1].0).to_vec();
    let first: Vec<Kv> = expected
        .range(..first_high.clone())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(
        first.len() > 1,
        "the first leaf holds {} records",
        first.len()
    );
    let splits = tree.stats().splits;
    let writer = {
        let tree = tree.clone();
        thread::spawn(move || {
            // 14 values of 300 bytes overflow a 4 KiB leaf: the last leaf splits.
            (0..14u8)
                .map(|j| {
                    let k = vec![b'z', j];
                    let v = val(&k, 1, 300);
                    tree.insert(&k, &v).expect("insert");
                    (k, v)
                })
                .collect::<Vec<_>>()
        })
    };
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            for (k, v) in first.iter().step_by(2) {
                assert_eq!(tree.get(k).expect("get").as_ref(), Some(v), "lost {k:?}");
            }
            let seen: Vec<Kv> = tree.range(..first_high).map(|r| r.expect("scan")).collect();
            assert_eq!(seen, first, "a scan of the first leaf went wrong");
        })
    };
    expected.extend(writer.join().expect("writer"));
    reader.join().expect("reader");
    assert!(tree.stats().splits > splits, "the writer split nothing");
    let (rechecks, restarts) = index.settles();
    assert_eq!(restarts, 0, "a split of another leaf restarted a reader");
    RECHECKS.fetch_add(rechecks, std::sync::atomic::Ordering::Relaxed);
    check_final(&tree, &expected);
}

#[test]
fn shuttle_splits_elsewhere_restart_no_reader() {
    shuttle::check_random(splits_elsewhere_restart_no_reader, 500);
    shuttle::check_pct(splits_elsewhere_restart_no_reader, 500, 3);
    assert!(
        RECHECKS.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule split a leaf while a read was in flight"
    );
}

/// Leaves on disk behind a cache that holds them all: each lookup that misses caches its
/// whole leaf as a mirror (merged with the mini-page a racing write may have made), while a
/// writer updates, inserts and removes in the same leaves and an evictor evicts.
fn lookups_cache_whole_leaves_racing_writes_and_eviction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tree, mut expected) = leaves_on_disk(dir.path(), 500);
    let changes: Vec<Change> = vec![
        (vec![b'c', 8], Some(val(&[b'c', 8], 1, 40))),
        (vec![b'c', 9], Some(val(&[b'c', 9], 1, 600))),
        (vec![b'c', 32], None),
        (vec![b'c', 41], Some(val(&[b'c', 41], 1, 80))),
    ];
    let writer = spawn_writer(&tree, &changes);
    let evictor = {
        let tree = tree.clone();
        thread::spawn(move || {
            tree.shared().make_room().expect("evict");
            tree.shared().make_room().expect("evict");
        })
    };
    let reader = {
        let (tree, before) = (tree.clone(), expected.clone());
        thread::spawn(move || {
            // Keys none of the writes touch.
            for (k, v) in before.iter().step_by(5) {
                assert_eq!(tree.get(k).expect("get").as_ref(), Some(v), "lost {k:?}");
            }
        })
    };
    writer.join().expect("writer");
    evictor.join().expect("evictor");
    reader.join().expect("reader");
    apply(&mut expected, changes);
    check_final(&tree, &expected);
    assert!(tree.stats().leaves_cached > 0, "no lookup cached its leaf");
}

#[test]
fn shuttle_lookups_cache_whole_leaves_racing_writes_and_eviction() {
    shuttle::check_random(lookups_cache_whole_leaves_racing_writes_and_eviction, 300);
    shuttle::check_pct(
        lookups_cache_whole_leaves_racing_writes_and_eviction,
        300,
        3,
    );
}
