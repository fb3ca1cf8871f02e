//! Merge operators (Bε upserts): blind merges fold in order over the value, through reads,
//! scans, compare-and-swap, batches, evictions, checkpoints and reopen; a merge without an
//! operator is refused with nothing written; a log that holds merges needs the operator to
//! open; concurrent merges lose nothing.

use std::collections::BTreeMap;

use bfkv::{Config, Durability, Error, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Appends the operand to the value; the operand `del` removes the key, `big` returns a
/// value past any limit.
fn append(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    match operand {
        b"del" => None,
        b"big" => Some(vec![7; 1 << 20]),
        _ => Some([old.unwrap_or_default(), operand].concat()),
    }
}

/// The u64 add merge operator; an empty operand resets the counter (removes it).
fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    if operand.is_empty() {
        return None;
    }
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

#[test]
fn merges_fold_in_order_through_eviction_checkpoint_and_reopen() {
    for durability in [Durability::Sync, Durability::Buffered, Durability::None] {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = || {
            Config::new(dir.path())
                .cache_size(512 << 10)
                .durability(durability)
                .merge_operator(append)
        };
        let tree = Tree::open(config()).expect("open");
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..40_000u32 {
            let k = key(rng.gen_range(0..3_000));
            match rng.gen_range(0..10) {
                0 => {
                    tree.insert(&k, b"base:").expect("insert");
                    model.insert(k, b"base:".to_vec());
                }
                1 => {
                    tree.remove(&k).expect("remove");
                    model.remove(&k);
                }
                2 if rng.gen_ratio(1, 5) => {
                    tree.merge(&k, b"del").expect("merge del");
                    model.remove(&k);
                }
                _ => {
                    let o = format!("{},", round % 97).into_bytes();
                    tree.merge(&k, &o).expect("merge");
                    let v = model.entry(k).or_default();
                    v.extend_from_slice(&o);
                }
            }
            if round % 5_000 == 0 {
                tree.checkpoint().expect("checkpoint");
            }
            if round % 997 == 0 {
                let probe = key(rng.gen_range(0..3_000));
                assert_eq!(tree.get(&probe).expect("get"), model.get(&probe).cloned());
            }
        }
        let check = |tree: &Tree, what: &str| {
            for (k, v) in &model {
                assert_eq!(
                    tree.get(k).expect("get").as_ref(),
                    Some(v),
                    "{durability:?} {what}: {}",
                    String::from_utf8_lossy(k)
                );
            }
            let all: Vec<(Vec<u8>, Vec<u8>)> = tree.iter().map(|r| r.expect("scan")).collect();
            let want: Vec<(Vec<u8>, Vec<u8>)> =
                model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert!(all == want, "{durability:?} {what}: scan differs");
        };
        check(&tree, "before reopen");
        let stats = tree.stats();
        assert!(stats.upserts > 20_000, "{durability:?}: {stats:?}");
        assert!(stats.write_backs > 0, "{durability:?}: nothing was evicted");
        tree.close().expect("close");
        let tree = Tree::open(config()).expect("reopen");
        check(&tree, "after reopen");
    }
}

#[test]
fn merge_without_an_operator_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).durability(Durability::Sync)).expect("open");
    let ks = tree.keyspace("ks").expect("keyspace");
    let appends = tree.stats().log_appends;
    assert!(matches!(
        tree.merge(b"k", b"1"),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        ks.merge(b"k", b"1"),
        Err(Error::InvalidConfig { .. })
    ));
    let mut batch = tree.batch();
    batch.insert(&ks, b"other", b"v");
    batch.merge(&ks, b"k", b"1");
    assert!(matches!(batch.commit(), Err(Error::InvalidConfig { .. })));
    assert_eq!(tree.get(b"k").expect("get"), None);
    assert_eq!(ks.get(b"k").expect("get"), None);
    assert_eq!(ks.get(b"other").expect("get"), None);
    assert_eq!(tree.stats().log_appends, appends, "nothing was logged");
    tree.close().expect("close");
    let tree = Tree::open(Config::new(dir.path())).expect("reopen");
    assert_eq!(tree.get(b"k").expect("get"), None);
    assert!(tree.keyspace("ks").expect("ks").iter().next().is_none());
}

#[test]
fn an_operator_may_remove_and_may_not_exceed_the_value_limit() {
    let tree = Tree::open(Config::in_memory().merge_operator(append)).expect("open");
    tree.merge(b"k", b"a").expect("merge");
    tree.merge(b"k", b"b").expect("merge");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"ab".to_vec()));
    tree.merge(b"k", b"del").expect("merge del");
    assert_eq!(tree.get(b"k").expect("get"), None);
    tree.merge(b"k", b"c").expect("merge after del");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"c".to_vec()));
    // A result past the limit is the error of the call that folds it; the value stays.
    assert!(matches!(
        tree.merge(b"k", b"big"),
        Err(Error::ValueTooLarge { .. })
    ));
    assert_eq!(tree.get(b"k").expect("get"), Some(b"c".to_vec()));
    // An operand over the limit is refused like a value.
    let limit = tree.limits().max_value_len;
    assert!(matches!(
        tree.merge(b"k", vec![0; limit + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
}

#[test]
fn pending_merges_fold_for_reads_scans_and_compare_and_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No idle write-back: on a loaded machine a pause in the merges below would let it
    // read the merged leaves' pages, which is not the merges' doing.
    let config = || {
        Config::new(dir.path())
            .merge_operator(append)
            .idle_write_back(None)
    };
    let tree = Tree::open(config()).expect("open");
    for i in 0..2_000 {
        tree.insert(key(i), b"v").expect("insert");
    }
    tree.close().expect("close");
    // Reopened, the leaves are on disk: these merges are buffered blind over them.
    let tree = Tree::open(config()).expect("reopen");
    let reads = tree.stats().pages_read;
    for i in (0..2_000).step_by(2) {
        tree.merge(key(i), b"+").expect("merge");
    }
    tree.merge(key(3), b"+").expect("merge");
    tree.merge(key(3), b"+").expect("merge");
    tree.merge(b"new", b"x").expect("merge of an absent key");
    assert_eq!(
        tree.stats().pages_read,
        reads,
        "a blind merge reads no page"
    );
    assert_eq!(tree.get(key(0)).expect("get"), Some(b"v+".to_vec()));
    assert_eq!(tree.get(key(1)).expect("get"), Some(b"v".to_vec()));
    assert_eq!(tree.get(key(3)).expect("get"), Some(b"v++".to_vec()));
    assert_eq!(tree.get(b"new").expect("get"), Some(b"x".to_vec()));
    let scanned: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range(key(0)..key(6))
        .map(|r| r.expect("scan"))
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = [b"v+".as_slice(), b"v", b"v+", b"v++", b"v+", b"v"]
        .iter()
        .enumerate()
        .map(|(i, v)| (key(i as u32), v.to_vec()))
        .collect();
    assert_eq!(scanned, expected);
    let backwards: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range(key(0)..key(6))
        .rev()
        .map(|r| r.expect("scan"))
        .collect();
    assert_eq!(backwards, expected.into_iter().rev().collect::<Vec<_>>());
    assert!(!tree
        .compare_and_swap(key(4), Some(b"v".as_slice()), Some(b"w".as_slice()))
        .expect("cas"));
    assert!(tree
        .compare_and_swap(key(4), Some(b"v+".as_slice()), Some(b"w".as_slice()))
        .expect("cas"));
    tree.merge(key(4), b"!").expect("merge");
    assert_eq!(tree.get(key(4)).expect("get"), Some(b"w!".to_vec()));
    tree.close().expect("close");
    let tree = Tree::open(config()).expect("reopen");
    assert_eq!(tree.get(key(3)).expect("get"), Some(b"v++".to_vec()));
    assert_eq!(tree.get(key(4)).expect("get"), Some(b"w!".to_vec()));
}

#[test]
fn a_batch_applies_its_writes_to_a_key_in_order() {
    let tree = Tree::open(Config::in_memory().merge_operator(append)).expect("open");
    let ks = tree.keyspace("ks").expect("keyspace");
    let d = tree.default_keyspace();
    tree.insert(b"a", b"0").expect("insert");
    let mut batch = tree.batch();
    batch.merge(&d, b"a", b"1");
    batch.merge(&d, b"a", b"2");
    batch.insert(&d, b"b", b"x");
    batch.merge(&d, b"b", b"y");
    batch.merge(&d, b"c", b"z");
    batch.insert(&d, b"c", b"reset");
    batch.remove(&d, b"e");
    batch.merge(&d, b"e", b"after-remove");
    batch.merge(&ks, b"a", b"other keyspace");
    batch.commit().expect("commit");
    assert_eq!(tree.get(b"a").expect("get"), Some(b"012".to_vec()));
    assert_eq!(tree.get(b"b").expect("get"), Some(b"xy".to_vec()));
    assert_eq!(tree.get(b"c").expect("get"), Some(b"reset".to_vec()));
    assert_eq!(tree.get(b"e").expect("get"), Some(b"after-remove".to_vec()));
    assert_eq!(ks.get(b"a").expect("get"), Some(b"other keyspace".to_vec()));
    assert_eq!(tree.stats().upserts, 6);
    // A fold that fails fails the whole batch.
    let mut batch = tree.batch();
    batch.insert(&d, b"f", b"1");
    batch.insert(&d, b"g", b"1");
    batch.merge(&d, b"g", b"big");
    assert!(matches!(batch.commit(), Err(Error::ValueTooLarge { .. })));
    assert_eq!(tree.get(b"f").expect("get"), None);
}

#[test]
fn concurrent_merges_lose_no_increment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(
        Config::new(dir.path())
            .cache_size(512 << 10)
            .durability(Durability::None)
            .merge_operator(add),
    )
    .expect("open");
    let threads = 4;
    let per_thread = 20_000u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let tree = &tree;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                let ks = tree.keyspace("counters").expect("keyspace");
                for i in 0..per_thread {
                    let k = key(rng.gen_range(0..500));
                    if i % 50 == 0 {
                        let mut b = tree.batch();
                        b.merge(&ks, &k, 1u64.to_le_bytes());
                        b.merge(&ks, key(999_999), 1u64.to_le_bytes());
                        b.commit().expect("batch");
                    } else {
                        ks.merge(&k, 1u64.to_le_bytes()).expect("merge");
                    }
                }
            });
        }
    });
    let ks = tree.keyspace("counters").expect("keyspace");
    let total: u64 = ks
        .iter()
        .map(|r| u64::from_le_bytes(r.expect("scan").1.try_into().expect("8 bytes")))
        .sum();
    let batches = threads * per_thread / 50;
    assert_eq!(total, threads * per_thread + batches);
    assert_eq!(
        ks.get(key(999_999)).expect("get"),
        Some(batches.to_le_bytes().to_vec())
    );
}

#[test]
fn a_backup_holds_pending_merges_folded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || Config::new(dir.path()).merge_operator(add);
    let tree = Tree::open(config()).expect("open");
    for i in 0..3_000 {
        tree.insert(key(i), 5u64.to_le_bytes()).expect("insert");
    }
    tree.close().expect("close");
    let tree = Tree::open(config()).expect("reopen");
    for i in 0..3_000 {
        tree.merge(key(i), u64::from(i).to_le_bytes())
            .expect("merge");
    }
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let target = elsewhere.path().join("backup");
    tree.backup(&target).expect("backup");
    // The backup was recovered and checkpointed when it was made: it needs no operator.
    let copy = Tree::open(Config::new(&target)).expect("open the backup");
    for i in (0..3_000).step_by(7) {
        assert_eq!(
            copy.get(key(i)).expect("get"),
            Some((5 + u64::from(i)).to_le_bytes().to_vec())
        );
    }
}
