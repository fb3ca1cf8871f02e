//! Tree-core tests that need the internals: the structure checker after every operation.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Config, Tree};

fn key(rng: &mut StdRng) -> Vec<u8> {
    let prefix = ["", "p/", "tenant-0042/orders/aaaaaaaaaaaaaaaaaaaaaa/"][rng.gen_range(0..3)];
    format!("{prefix}{:x}", rng.gen_range(0..2048u32)).into_bytes()
}

/// Runs a random workload against a model, checking the structure after every operation;
/// returns the tree's counters at the end.
fn checked_workload(seed: u64, ops: usize, cache: usize) -> crate::Stats {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).cache_size(cache)).expect("open");
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for op in 0..ops {
        let k = key(&mut rng);
        let before = tree.stats();
        let roll = rng.gen_range(0..10);
        match roll {
            0..=5 => {
                let v = vec![op as u8; rng.gen_range(0..400)];
                tree.insert(&k, &v).expect("insert");
                model.insert(k.clone(), v);
            }
            6..=7 => {
                tree.remove(&k).expect("remove");
                model.remove(&k);
            }
            _ => assert_eq!(
                tree.get(&k).expect("get").as_ref(),
                model.get(&k),
                "seed {seed} op {op}"
            ),
        }
        if let Err(e) = tree.shared().check_structure() {
            panic!(
                "seed {seed} op {op} (roll {roll}, key {:?}): {e}\nbefore {before:?}\nafter {:?}",
                String::from_utf8_lossy(&k),
                tree.stats()
            );
        }
    }
    let stats = tree.stats();
    let all: Vec<_> = tree.iter().map(|r| r.expect("iter")).collect();
    let expected: Vec<_> = model.into_iter().collect();
    assert_eq!(all, expected, "seed {seed}");
    stats
}

#[test]
fn structure_holds_after_every_operation_with_a_tiny_cache() {
    for seed in 0..3 {
        checked_workload(seed, 4000, 256 << 10);
    }
}

#[test]
fn structure_holds_when_misses_cache_whole_leaves() {
    // A cache that holds the leaves as mirrors in their size classes, but not as whole
    // pages beside the write buffers: evictions and misses happen, and misses cache whole
    // leaves (`whole_leaves.rs`; the workload scans nothing before the counters are read).
    for seed in 0..2 {
        let s = checked_workload(seed, 6000, 700 << 10);
        assert!(
            s.cache_misses > 0 && s.leaves_cached > 0,
            "seed {seed}: {s:?}"
        );
    }
}

#[test]
fn clean_mirrors_touched_near_the_head_keep_only_their_read_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::new(dir.path())
        .cache_size(256 << 10)
        .promotion_percent(100)
        .durability(crate::Durability::None);
    let tree = Tree::open(config).expect("open");
    let key = |i: u32| format!("k{i:06}").into_bytes();
    let value = |i: u32| i.to_le_bytes().repeat(4);
    let n = 20_000;
    for i in 0..n {
        tree.insert(key(i), value(i)).expect("insert");
    }
    tree.flush().expect("flush");
    // Scans leave clean full-page mirrors; the hot keys are read over and over while the
    // other scans push those mirrors towards the head of the buffer.
    for round in 0..40u32 {
        let start = (round * 997) % n;
        let got = tree.range(key(start)..key(start + 300)).count();
        assert!(got > 0);
        for i in (0..n).step_by(400) {
            assert_eq!(tree.get(key(i)).expect("get"), Some(value(i)));
        }
    }
    let s = tree.stats();
    assert!(s.mirrors_shrunk > 0, "no mirror shrank: {s:?}");
    if let Err(e) = tree.shared().check_structure() {
        panic!("{e}");
    }
    for (i, kv) in tree.iter().enumerate() {
        let (k, v) = kv.expect("iter");
        assert_eq!((k, v), (key(i as u32), value(i as u32)));
    }
}

#[test]
fn a_miss_caches_its_whole_leaf_only_while_every_leaf_fits_the_cache() {
    let key = |i: u32| format!("k{i:06}").into_bytes();
    let value = |i: u32| i.to_le_bytes().repeat(4);
    let n = 20_000;
    // About 200 leaves: whole in 4 MiB, not in 256 KiB.
    for (cache, whole) in [(4 << 20, true), (256 << 10, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::new(dir.path())
            .cache_size(cache)
            .durability(crate::Durability::None);
        let tree = Tree::open(config.clone()).expect("open");
        for i in 0..n {
            tree.insert(key(i), value(i)).expect("insert");
        }
        tree.close().expect("close");
        // Reopened, the cache is cold: the first lookup reads its leaf.
        let tree = Tree::open(config).expect("reopen");
        assert_eq!(tree.shared().caches_whole_leaves(), whole);
        let before = tree.stats();
        assert_eq!(tree.get(key(500)).expect("get"), Some(value(500)));
        let first = tree.stats();
        assert_eq!(first.cache_misses - before.cache_misses, 1);
        assert_eq!(first.leaves_cached - before.leaves_cached, u64::from(whole));
        assert_eq!(first.promotions - before.promotions, u64::from(!whole));
        // A neighbour in the same leaf: in memory only if the whole leaf was cached.
        assert_eq!(tree.get(key(501)).expect("get"), Some(value(501)));
        assert_eq!(tree.get(key(499)).expect("get"), Some(value(499)));
        let second = tree.stats();
        let misses = second.cache_misses - first.cache_misses;
        assert_eq!(misses, if whole { 0 } else { 2 }, "cache {cache}");
        if let Err(e) = tree.shared().check_structure() {
            panic!("{e}");
        }
    }
}

#[test]
fn a_write_needing_a_new_leaf_when_every_id_is_taken_fails_and_changes_nothing() {
    for in_memory in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = if in_memory {
            Config::in_memory()
        } else {
            Config::new(dir.path())
                .cache_size(256 << 10)
                .durability(crate::Durability::None)
        };
        let tree = Tree::open(config).expect("open");
        let key = |i: u32| format!("k{i:08}").into_bytes();
        let value = [7u8; 40];
        for i in 0..2000 {
            tree.insert(key(i), value).expect("insert");
        }
        tree.shared().pool().exhaust_ids();
        let mut failed = None;
        for i in 2000..100_000 {
            match tree.insert(key(i), value) {
                Ok(()) => {}
                Err(crate::Error::TooManyLeaves { limit }) => {
                    assert_eq!(limit, 1 << 32);
                    failed = Some(i);
                    break;
                }
                Err(e) => panic!("in memory {in_memory}: {e}"),
            }
        }
        let failed = failed.expect("no insert needed a new leaf");
        assert_eq!(tree.get(key(failed)).expect("get"), None);
        for i in 0..failed {
            assert_eq!(
                tree.get(key(i)).expect("get").as_deref(),
                Some(&value[..]),
                "in memory {in_memory}: key {i}"
            );
        }
        if let Err(e) = tree.shared().check_structure() {
            panic!("in memory {in_memory}: {e}");
        }
    }
}
