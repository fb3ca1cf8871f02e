//! Model-checked scans over leaves cached whole (shuttle): a scan's lock-free refill copies
//! a full-page mirror and lends its records from the copy (`optimistic.rs`), while a writer
//! updates, inserts and removes records in the same leaves. Every scan must see each key
//! either as it was before the writer or as the writer left it, in order.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, RangeBounds};

use super::shuttle::{apply, check_final, leaves_on_disk, spawn_writer, val, Change, Kv};
use crate::sync::thread;

/// Checks that `seen`, a scan of `(start, end)` in key order, holds each key in range as
/// `before` had it or as `changes` left it, and nothing else.
fn check_scan(
    seen: &[Kv],
    before: &BTreeMap<Vec<u8>, Vec<u8>>,
    changes: &[Change],
    (start, end): (Bound<&Vec<u8>>, Bound<&Vec<u8>>),
) {
    for pair in seen.windows(2) {
        assert!(pair[0].0 < pair[1].0, "out of order: {pair:?}");
    }
    let in_range = |k: &Vec<u8>| (start, end).contains(k);
    let got: BTreeMap<&Vec<u8>, &Vec<u8>> = seen.iter().map(|(k, v)| (k, v)).collect();
    let keys: BTreeSet<&Vec<u8>> = before
        .keys()
        .chain(changes.iter().map(|(k, _)| k))
        .filter(|k| in_range(k))
        .collect();
    for k in got.keys() {
        assert!(keys.contains(k), "the scan made up {k:?}");
    }
    for k in keys {
        let old = before.get(k);
        let new = changes
            .iter()
            .find(|(c, _)| c == k)
            .map(|(_, v)| v.as_ref());
        let seen = got.get(k).copied();
        assert!(
            seen == old || Some(seen) == new,
            "{k:?}: saw {seen:?}, before {old:?}, after {new:?}"
        );
    }
}

/// Leaves on disk, cached whole by lookups; a reader scans from inside them, ascending and
/// descending, while a writer changes records in the same leaves.
fn scans_over_whole_leaves_race_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tree, mut expected) = leaves_on_disk(dir.path(), 300);
    for k in expected.keys() {
        tree.get(k).expect("get");
    }
    assert!(
        tree.stats().leaves_cached >= 2,
        "the lookups cached too few leaves whole"
    );
    let changes: Vec<Change> = vec![
        (vec![b'c', 10], Some(val(&[b'c', 10], 1, 40))),
        (vec![b'c', 11], Some(val(&[b'c', 11], 1, 300))),
        (vec![b'c', 30], None),
        (vec![b'c', 31], Some(val(&[b'c', 31], 1, 20))),
    ];
    let writer = spawn_writer(&tree, &changes);
    let reader = {
        let (tree, before, changes) = (tree.clone(), expected.clone(), changes.clone());
        thread::spawn(move || {
            let (from, to) = (vec![b'c', 7], vec![b'c', 40]);
            let up: Vec<Kv> = tree
                .range(from.clone()..)
                .map(|r| r.expect("scan"))
                .collect();
            check_scan(
                &up,
                &before,
                &changes,
                (Bound::Included(&from), Bound::Unbounded),
            );
            let mut down: Vec<Kv> = tree
                .range(..=to.clone())
                .rev()
                .map(|r| r.expect("scan"))
                .collect();
            down.reverse();
            check_scan(
                &down,
                &before,
                &changes,
                (Bound::Unbounded, Bound::Included(&to)),
            );
        })
    };
    writer.join().expect("writer");
    reader.join().expect("reader");
    apply(&mut expected, changes);
    check_final(&tree, &expected);
}

#[test]
fn shuttle_scans_over_whole_leaves_race_writes() {
    shuttle::check_random(scans_over_whole_leaves_race_writes, 300);
    shuttle::check_pct(scans_over_whole_leaves_race_writes, 300, 3);
}
