//! A write the disk acknowledged and then lost: the leaf's page reads back as what the page
//! held before, an older page of another leaf, with its page number and checksum right.
//! Reads of the leaf (lookups, scans, the read of a compare-and-swap) answer `Corruption`
//! rather than for another range, and its write-back keeps the leaf's buffered writes as
//! a damaged leaf, as for a page that fails its checksum (`evict.rs`, `salvage`).

use crate::error::Error;
use crate::pool::{Location, PageId};
use crate::tree::persist::crash::{self, quiet_config as config};
use crate::Tree;

fn key(i: u32) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

fn value(i: u32, round: u8) -> Vec<u8> {
    let mut v = format!("v{i}-{round}-").into_bytes();
    v.resize(100, b'.');
    v
}

/// The disk page of evicted leaf `pid`.
fn page_of(tree: &Tree, pid: PageId) -> u64 {
    match tree.shared().pool().read(pid).location() {
        Location::Disk(p) => p,
        Location::Mini(_) => panic!("leaf {pid} is cached"),
    }
}

fn is_corruption<T>(r: &crate::Result<T>) -> bool {
    matches!(r, Err(Error::Corruption { .. }))
}

#[test]
fn a_leaf_page_lost_to_another_leafs_old_page_reads_as_corruption() {
    const N: u32 = 3_000;
    let (store, fs) = crash::disks();
    let tree = crash::open_with(config(), store.clone(), fs.clone()).expect("open");
    for i in 0..N {
        tree.insert(key(i), value(i, 0)).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    tree.shared().evict_all();
    let leaves = tree.shared().index().leaves();
    assert!(leaves.len() > 8, "{} leaves", leaves.len());
    // Leaf `n`'s keys (stored keys carry the default keyspace's prefix byte).
    let keys_of = |n: usize| -> Vec<u32> {
        let low = &leaves[n].0;
        let high = leaves.get(n + 1).map(|l| l.0.clone());
        let stored = |i: u32| [&[0u8][..], &key(i)].concat();
        (0..N)
            .filter(|&i| stored(i) >= *low && high.as_ref().is_none_or(|h| stored(i) < *h))
            .collect()
    };
    // Leaf `q` moves to a new page, and its old one is freed: it keeps `q`'s old image.
    let (p, q) = (leaves[2].1, leaves[6].1);
    let (p_keys, q_keys) = (keys_of(2), keys_of(6));
    let old = page_of(&tree, q);
    for &i in &q_keys {
        tree.insert(key(i), value(i, 1)).expect("update q");
    }
    tree.shared().evict_all();
    assert_ne!(page_of(&tree, q), old);
    tree.checkpoint().expect("checkpoint");
    tree.checkpoint().expect("checkpoint");
    // Leaf `p`'s next page is that freed page (the last freed is taken first), and the
    // write of `p`'s image to it is lost.
    let fresh = p_keys[0];
    tree.insert(key(fresh), value(fresh, 2)).expect("update p");
    store.lose_nth_write(1);
    tree.shared().evict_all();
    assert_eq!(
        page_of(&tree, p),
        old,
        "the test needs p to reuse q's old page"
    );

    // Leaf `p` reads as what that page holds: `q`'s keys, not its own.
    for &i in &p_keys {
        let got = tree.get(key(i));
        assert!(is_corruption(&got), "get of p's key {i}: {got:?}");
    }
    let got = tree.get_many(&[key(p_keys[1]), key(q_keys[1])]);
    assert!(is_corruption(&got[0]), "get_many: {got:?}");
    assert_eq!(got[1].as_ref().expect("q"), &Some(value(q_keys[1], 1)));
    let (cas, old) = (p_keys[2], value(p_keys[2], 0));
    let got = tree.compare_and_swap(key(cas), Some(&old), Some(b"new"));
    assert!(is_corruption(&got), "compare-and-swap: {got:?}");
    let scan: crate::Result<Vec<_>> = tree.iter().collect();
    assert!(is_corruption(&scan), "scan: {:?}", scan.map(|r| r.len()));
    // Every other leaf answers as before.
    for &i in &q_keys {
        assert_eq!(tree.get(key(i)).expect("q"), Some(value(i, 1)));
    }
    let last = *keys_of(leaves.len() - 1).last().expect("keys");
    assert_eq!(tree.get(key(last)).expect("last"), Some(value(last, 0)));

    // A write to `p` is kept: its write-back takes the page for damaged and writes the
    // leaf's buffered records as a damaged leaf.
    let other = p_keys[3];
    tree.insert(key(other), value(other, 3))
        .expect("write to p");
    tree.shared().evict_all();
    assert_eq!(
        tree.get(key(other)).expect("written"),
        Some(value(other, 3))
    );
    let got = tree.get(key(p_keys[4]));
    assert!(is_corruption(&got), "a lost key of p: {got:?}");
    assert_eq!(tree.get(key(last)).expect("last"), Some(value(last, 0)));
    tree.checkpoint().expect("checkpoints go on");
    if let Err(e) = tree.shared().check_structure() {
        panic!("structure: {e}");
    }
}
