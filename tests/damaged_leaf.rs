//! One damaged leaf page (DESIGN.md, "Bad input and faults"): the keys of that leaf answer
//! `Err(Corruption)` (or, once rewritten, their new values); every other key reads and
//! writes as before, and checkpoints and `close` go on, so the log is trimmed as usual.
//! The damage stays reported after reopen.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use bfkv::{Config, Durability, Error, Tree};

const KEYS: u32 = 4000;
const PAGE: usize = 4096;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    let mut v = format!("value-{i}-{round}-").into_bytes();
    v.resize(100, b'.');
    v
}

fn config(dir: &Path) -> Config {
    // A small cache: writes evict leaves all the time, the damaged one included.
    Config::new(dir)
        .durability(Durability::Sync)
        .cache_size(256 << 10)
        .log_segment_size(64 << 10)
}

/// Every key's answer: the keys that said `Corruption`, after checking the others against
/// `expect`.
fn read_all(tree: &Tree, expect: impl Fn(u32) -> Option<Vec<u8>>, what: &str) -> BTreeSet<u32> {
    let mut corrupt = BTreeSet::new();
    for i in 0..KEYS {
        match tree.get(key(i)) {
            Ok(v) => assert_eq!(v, expect(i), "{what}: key {i}"),
            Err(Error::Corruption { .. }) => {
                corrupt.insert(i);
            }
            Err(e) => panic!("{what}: key {i}: {e}"),
        }
    }
    corrupt
}

#[test]
fn one_damaged_leaf_answers_corruption_and_nothing_else_stops() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("db");
    {
        let tree = Tree::open(config(&dir)).expect("open");
        for i in 0..KEYS {
            tree.insert(key(i), value(i, 0)).expect("insert");
        }
        tree.close().expect("close");
    }
    let data = dir.join("data");
    let pristine = fs::read(&data).expect("read data");
    let pages = pristine.len() / PAGE;
    // Damage one page after another until one holds a leaf: some keys then say Corruption.
    let mut found = None;
    for page in (1..pages).rev() {
        if pristine[page * PAGE..(page + 1) * PAGE]
            .iter()
            .all(|&b| b == 0)
        {
            continue;
        }
        let mut bytes = pristine.clone();
        bytes[page * PAGE + PAGE / 2] ^= 0x10;
        fs::write(&data, &bytes).expect("damage");
        let tree = Tree::open(config(&dir)).expect("open with a damaged page");
        let corrupt = read_all(&tree, |i| Some(value(i, 0)), "damaged, before writes");
        drop(tree);
        if !corrupt.is_empty() {
            found = Some((page, bytes, corrupt));
            break;
        }
    }
    let (page, bytes, corrupt) = found.expect("no page of the data file held a leaf");
    fs::write(&data, &bytes).expect("damage");
    let lo = *corrupt.first().expect("corrupt keys");
    let hi = *corrupt.last().expect("corrupt keys");
    assert_eq!(
        corrupt.len() as u32,
        hi - lo + 1,
        "page {page}: the keys that say Corruption are not one leaf's range"
    );
    assert!(
        corrupt.len() < 200,
        "page {page}: {} keys lost",
        corrupt.len()
    );

    let tree = Tree::open(config(&dir)).expect("open");
    // Rewrite every other key (three rounds, so leaves are evicted and merged), and every
    // third key of the damaged leaf, counted from its first (so a leaf of a few keys has
    // some): those may work or say Corruption, never anything else.
    let mut rewritten = BTreeSet::new();
    for round in 1..=3 {
        for i in 0..KEYS {
            let damaged = corrupt.contains(&i);
            if damaged && (i - lo) % 3 != 0 {
                continue;
            }
            match tree.insert(key(i), value(i, round)) {
                Ok(()) if damaged => {
                    rewritten.insert(i);
                }
                Ok(()) => {}
                Err(Error::Corruption { .. }) if damaged => {}
                Err(e) => panic!("round {round}: insert {i}: {e}"),
            }
        }
        tree.checkpoint()
            .unwrap_or_else(|e| panic!("round {round}: checkpoint with a damaged leaf: {e}"));
    }
    let expect = |i: u32| Some(value(i, 3));
    let check = |tree: &Tree, what: &str| {
        let now = read_all(
            tree,
            |i| {
                if !corrupt.contains(&i) || rewritten.contains(&i) {
                    expect(i)
                } else {
                    Some(value(i, 0))
                }
            },
            what,
        );
        // Only keys of the damaged leaf that were not rewritten may say Corruption.
        assert!(
            now.iter()
                .all(|i| corrupt.contains(i) && !rewritten.contains(i)),
            "{what}: a key outside the damaged leaf says Corruption"
        );
        assert!(!now.is_empty(), "{what}: the damage is no longer reported");
    };
    check(&tree, "after writes");
    assert!(
        tree.stats().leaves_salvaged > 0,
        "the damaged leaf was never rewritten"
    );
    let segments = || {
        fs::read_dir(dir.join("wal"))
            .expect("wal dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
            })
            .count()
    };
    tree.close().expect("close with a damaged leaf");
    assert_eq!(segments(), 1, "the log was not trimmed");

    let tree = Tree::open(config(&dir)).expect("reopen");
    check(&tree, "after reopen");
    // A scan reads every key below the damaged leaf, then stops there with Corruption if
    // its range reaches into the leaf's.
    let below: Vec<_> = tree.range(..key(lo)).collect();
    let ok: Vec<Vec<u8>> = below
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|kv| kv.0.clone())
        .collect();
    assert_eq!(
        ok,
        (0..lo).map(key).collect::<Vec<_>>(),
        "scan below the damaged leaf"
    );
    assert!(below.len() as u32 <= lo + 1);
    if let Some(Err(e)) = below.last() {
        assert!(matches!(e, Error::Corruption { .. }), "scan: {e}");
    }
    tree.close().expect("close");
}

/// A backup reads every leaf page it copies: a tree with a damaged leaf is not backed up
/// as if it were whole (a snapshot built from it would spread the damage), before the
/// damaged leaf is written again or after its salvage marked it.
#[test]
fn a_backup_of_a_tree_with_a_damaged_leaf_fails_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("db");
    let tree = Tree::open(config(&dir)).expect("open");
    for i in 0..KEYS {
        tree.insert(key(i), value(i, 0)).expect("insert");
    }
    tree.backup(tmp.path().join("whole"))
        .expect("backup of an undamaged tree");
    tree.close().expect("close");
    let data = dir.join("data");
    let pristine = fs::read(&data).expect("read data");
    let mut damaged = None;
    for page in (1..pristine.len() / PAGE).rev() {
        if pristine[page * PAGE..(page + 1) * PAGE]
            .iter()
            .all(|&b| b == 0)
        {
            continue;
        }
        let mut bytes = pristine.clone();
        bytes[page * PAGE + PAGE / 2] ^= 0x10;
        fs::write(&data, &bytes).expect("damage");
        let tree = Tree::open(config(&dir)).expect("open with a damaged page");
        let corrupt = read_all(&tree, |i| Some(value(i, 0)), "damaged");
        drop(tree);
        if let Some(&first) = corrupt.first() {
            damaged = Some(first);
            break;
        }
        fs::write(&data, &pristine).expect("restore");
    }
    let first = damaged.expect("no page of the data file held a leaf");
    let tree = Tree::open(config(&dir)).expect("open");
    let target = tmp.path().join("copy");
    match tree.backup(&target) {
        Err(Error::Corruption { file, page, .. }) => {
            assert_eq!(file, data);
            assert!(page.is_some());
        }
        other => panic!("backup of a damaged tree: {other:?}"),
    }
    assert!(!target.exists(), "a failed backup left files");
    // Written again, the leaf is salvaged: its lost keys stay lost, and so is the backup.
    tree.insert(key(first), value(first, 1))
        .expect("write to the damaged leaf");
    tree.checkpoint().expect("checkpoint");
    assert!(
        tree.stats().leaves_salvaged > 0,
        "the damaged leaf was not salvaged"
    );
    assert!(matches!(
        tree.backup(&target),
        Err(Error::Corruption { .. })
    ));
    assert!(!target.exists(), "a failed backup left files");
    tree.close().expect("close");
    // The backup taken before the damage holds every key.
    let whole = Tree::open(config(&tmp.path().join("whole"))).expect("open the backup");
    assert!(read_all(&whole, |i| Some(value(i, 0)), "backup").is_empty());
}
