//! The tree against `std::collections::BTreeMap`: seeded random sequences of inserts,
//! removes, merges (with an appending merge operator), gets, compare-and-swaps, atomic
//! batches (of all three), ranges (both directions, every bound kind), keyspace drops and
//! close+reopen, spread over the default keyspace and two named ones (one model map each),
//! with caches so small that eviction, mini-page merges, splits and copy-on-access run
//! constantly.
//!
//! A failure prints the seed; rerun one with `BFKV_SEED=<seed> cargo test --release --test
//! differential`. `BFKV_DIFF_OPS` sets the operations per seed.

use std::collections::BTreeMap;
use std::ops::Bound;

use bfkv::{Config, Error, Keyspace, Range, Result, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PREFIXES: [&str; 4] = [
    "",
    "user/",
    "tenant-0042/orders/2026/11/21/aaaaaaaaaaaaaaaaaaaaaaaaaa/",
    "shared-prefix-shared-prefix-shared-prefix-shared-prefix-shared-prefix-shared-prefix-/",
];

fn key(rng: &mut StdRng, space: u64) -> Vec<u8> {
    let p = PREFIXES[rng.gen_range(0..PREFIXES.len())];
    let mut k = format!("{p}{:x}", rng.gen_range(0..space)).into_bytes();
    if rng.gen_ratio(1, 50) {
        k.truncate(rng.gen_range(0..=k.len())); // short and empty keys too
    }
    k.truncate(100);
    k
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.gen_ratio(7, 10) {
        rng.gen_range(0..32)
    } else {
        rng.gen_range(0..600)
    };
    (0..len).map(|_| rng.gen()).collect()
}

fn bound(rng: &mut StdRng, k: Vec<u8>) -> Bound<Vec<u8>> {
    match rng.gen_range(0..3) {
        0 => Bound::Included(k),
        1 => Bound::Excluded(k),
        _ => Bound::Unbounded,
    }
}

/// Whether `BTreeMap::range` accepts these bounds (it panics on inverted or empty-excluded
/// ranges; the tree returns nothing for those).
fn btree_accepts(lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    match (lo, hi) {
        (Bound::Included(l), Bound::Included(h)) => l <= h,
        (Bound::Included(l), Bound::Excluded(h)) | (Bound::Excluded(l), Bound::Included(h)) => {
            l <= h
        }
        (Bound::Excluded(l), Bound::Excluded(h)) => l < h,
        _ => true,
    }
}

type Kv = (Vec<u8>, Vec<u8>);

/// The merge operator of every run: appends the operand and the key's length to the value,
/// keeping the last 700 bytes; the operand `-` removes the key.
fn append(key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    if operand == b"-" {
        return None;
    }
    let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
    v.extend_from_slice(operand);
    v.push(key.len() as u8);
    if v.len() > 700 {
        v.drain(..v.len() - 700);
    }
    Some(v)
}

/// A merge operand: mostly a few bytes, now and then the removing `-`.
fn operand(rng: &mut StdRng) -> Vec<u8> {
    if rng.gen_ratio(1, 15) {
        return b"-".to_vec();
    }
    let len = rng.gen_range(0..12);
    (0..len).map(|_| rng.gen()).collect()
}

/// `model` after a merge of `operand` into `k`.
fn merge_model(model: &mut BTreeMap<Vec<u8>, Vec<u8>>, k: &[u8], operand: &[u8]) {
    match append(k, model.get(k).map(Vec::as_slice), operand) {
        Some(v) => model.insert(k.to_vec(), v),
        None => model.remove(k),
    };
}

/// The named keyspaces every run uses besides the default one.
const NAMED: [&str; 2] = ["alpha", "beta"];

/// Where an operation goes: the tree's own methods (the default keyspace) or a handle.
#[derive(Clone, Copy)]
enum Target<'a> {
    Tree(&'a Tree),
    Space(&'a Keyspace),
}

impl<'a> Target<'a> {
    fn insert(self, k: &[u8], v: &[u8]) -> Result<()> {
        match self {
            Target::Tree(t) => t.insert(k, v),
            Target::Space(s) => s.insert(k, v),
        }
    }
    fn remove(self, k: &[u8]) -> Result<()> {
        match self {
            Target::Tree(t) => t.remove(k),
            Target::Space(s) => s.remove(k),
        }
    }
    fn merge(self, k: &[u8], operand: &[u8]) -> Result<()> {
        match self {
            Target::Tree(t) => t.merge(k, operand),
            Target::Space(s) => s.merge(k, operand),
        }
    }
    fn get(self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            Target::Tree(t) => t.get(k),
            Target::Space(s) => s.get(k),
        }
    }
    fn cas(self, k: &[u8], expected: Option<&[u8]>, new: Option<&[u8]>) -> Result<bool> {
        match self {
            Target::Tree(t) => t.compare_and_swap(k, expected, new),
            Target::Space(s) => s.compare_and_swap(k, expected, new),
        }
    }
    fn range(self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Range<'a> {
        match self {
            Target::Tree(t) => t.range((lo, hi)),
            Target::Space(s) => s.range((lo, hi)),
        }
    }
    fn all(self) -> Vec<Kv> {
        self.range(Bound::Unbounded, Bound::Unbounded)
            .map(|r| r.expect("iter"))
            .collect()
    }
}

/// Handles on the named keyspaces.
fn handles(tree: &Tree) -> Vec<Keyspace> {
    NAMED
        .iter()
        .map(|n| tree.keyspace(n).expect("keyspace"))
        .collect()
}

/// Equality with a readable report: lengths and the first differing record.
fn assert_same(got: &[Kv], expected: &[Kv], what: &str) {
    if got == expected {
        return;
    }
    let at = got
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(expected.len()));
    let show = |kv: Option<&Kv>| {
        kv.map(|(k, v)| format!("{:?} ({} value bytes)", String::from_utf8_lossy(k), v.len()))
    };
    panic!(
        "{what}: got {} records, expected {}; first difference at {at}: got {:?}, expected {:?}",
        got.len(),
        expected.len(),
        show(got.get(at)),
        show(expected.get(at))
    );
}

fn check_range(
    tree: Target<'_>,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    rng: &mut StdRng,
    seed: u64,
    op: usize,
) {
    let (lo_key, hi_key) = (key(rng, 4096), key(rng, 4096));
    let lo = bound(rng, lo_key);
    let hi = bound(rng, hi_key);
    let expected_all: Vec<Kv> = if btree_accepts(&lo, &hi) {
        model
            .range((lo.clone(), hi.clone()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    } else {
        Vec::new()
    };
    let limit = 300;
    let mode = rng.gen_range(0..3);
    let got: Vec<Kv> = match mode {
        0 => tree
            .range(lo.clone(), hi.clone())
            .take(limit)
            .map(|r| r.expect("range item"))
            .collect(),
        1 => tree
            .range(lo.clone(), hi.clone())
            .rev()
            .take(limit)
            .map(|r| r.expect("range item"))
            .collect(),
        _ => {
            // Alternate ends until they meet: every record exactly once.
            let mut it = tree.range(lo.clone(), hi.clone());
            let (mut front, mut back) = (Vec::new(), Vec::new());
            loop {
                let next = if rng.gen() {
                    it.next().map(|r| (true, r))
                } else {
                    it.next_back().map(|r| (false, r))
                };
                match next {
                    Some((true, r)) => front.push(r.expect("range item")),
                    Some((false, r)) => back.push(r.expect("range item")),
                    None => break,
                }
            }
            back.reverse();
            front.extend(back);
            assert_same(
                &front,
                &expected_all,
                &format!("seed {seed} op {op}: two-ended range {lo:?}..{hi:?}"),
            );
            return;
        }
    };
    let expected: Vec<Kv> = if mode == 0 {
        expected_all.into_iter().take(limit).collect()
    } else {
        expected_all.into_iter().rev().take(limit).collect()
    };
    assert_same(
        &got,
        &expected,
        &format!("seed {seed} op {op}: range {lo:?}..{hi:?} mode {mode}"),
    );
}

fn run(seed: u64, ops: usize, cache: usize, in_memory: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // Seeds vary the merge threshold: the default (the page size), a smaller size class,
    // and a size between classes, so mini-pages turn into mirrors at different sizes.
    let merge = [None, Some(1024), Some(1000)][(seed % 3) as usize];
    let config = || {
        let c = if in_memory {
            Config::in_memory().cache_size(cache)
        } else {
            Config::new(dir.path()).cache_size(cache)
        }
        .merge_operator(append);
        match merge {
            Some(m) => c.merge_threshold(m),
            None => c,
        }
    };
    let mut tree = Tree::open(config()).expect("open");
    let mut spaces = handles(&tree);
    let mut models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); 1 + NAMED.len()];
    let space = 1 << rng.gen_range(6..14);
    for op in 0..ops {
        // Half the operations go to the default keyspace, the rest to the named ones.
        let s = if rng.gen() {
            0
        } else {
            rng.gen_range(1..=NAMED.len())
        };
        let target = if s == 0 {
            Target::Tree(&tree)
        } else {
            Target::Space(&spaces[s - 1])
        };
        let model = &mut models[s];
        let roll = rng.gen_range(0..1000);
        if roll < 430 {
            let (k, v) = (key(&mut rng, space), value(&mut rng));
            target
                .insert(&k, &v)
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: insert: {e}"));
            model.insert(k, v);
        } else if roll < 520 {
            let (k, o) = (key(&mut rng, space), operand(&mut rng));
            target
                .merge(&k, &o)
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: merge: {e}"));
            merge_model(model, &k, &o);
        } else if roll < 700 {
            let k = key(&mut rng, space);
            target
                .remove(&k)
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: remove: {e}"));
            model.remove(&k);
        } else if roll < 740 {
            let k = key(&mut rng, space);
            let current = model.get(&k).cloned();
            // Mostly the right expectation, else a wrong value or "absent".
            let expected = match rng.gen_range(0..10) {
                0..=6 => current.clone(),
                7 | 8 => Some(value(&mut rng)),
                _ => None,
            };
            let new = rng.gen_ratio(4, 5).then(|| value(&mut rng));
            let swapped = target
                .cas(&k, expected.as_deref(), new.as_deref())
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: compare_and_swap: {e}"));
            assert_eq!(
                swapped,
                expected == current,
                "seed {seed} op {op}: cas {k:?}"
            );
            if swapped {
                match new {
                    Some(v) => model.insert(k, v),
                    None => model.remove(&k),
                };
            }
        } else if roll < 790 {
            // An atomic batch over every keyspace: mostly a few writes, sometimes hundreds,
            // now and then with an invalid write that must leave everything unchanged.
            let n = if rng.gen_ratio(1, 10) {
                rng.gen_range(50..400)
            } else {
                rng.gen_range(1..8)
            };
            let default = tree.default_keyspace();
            let mut batch = tree.batch();
            // (keyspace, key, value or operand, kind: 0 insert, 1 remove, 2 merge)
            let mut writes: Vec<(usize, Vec<u8>, Vec<u8>, u8)> = Vec::new();
            for _ in 0..n {
                let t = rng.gen_range(0..=NAMED.len());
                let ks = if t == 0 { &default } else { &spaces[t - 1] };
                // Sometimes a key written earlier in the batch again.
                let k = match writes.last() {
                    Some(w) if w.0 == t && rng.gen_ratio(1, 8) => w.1.clone(),
                    _ => key(&mut rng, space),
                };
                match rng.gen_range(0..8) {
                    0..=3 => {
                        let v = value(&mut rng);
                        batch.insert(ks, &k, &v);
                        writes.push((t, k, v, 0));
                    }
                    4 | 5 => {
                        batch.remove(ks, &k);
                        writes.push((t, k, Vec::new(), 1));
                    }
                    _ => {
                        let o = operand(&mut rng);
                        batch.merge(ks, &k, &o);
                        writes.push((t, k, o, 2));
                    }
                }
            }
            let invalid = rng.gen_ratio(1, 20);
            if invalid {
                let limit = tree.limits().max_key_len;
                batch.insert(&default, vec![7u8; limit + 1], b"x");
            }
            let result = batch.commit();
            if invalid {
                assert!(
                    matches!(result, Err(Error::KeyTooLarge { .. })),
                    "seed {seed} op {op}: invalid batch: {result:?}"
                );
            } else {
                result.unwrap_or_else(|e| panic!("seed {seed} op {op}: batch: {e}"));
                for (t, k, v, kind) in writes {
                    match kind {
                        0 => {
                            models[t].insert(k, v);
                        }
                        1 => {
                            models[t].remove(&k);
                        }
                        _ => merge_model(&mut models[t], &k, &v),
                    }
                }
            }
        } else if roll < 960 {
            let k = key(&mut rng, space);
            let got = target
                .get(&k)
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: get: {e}"));
            assert_eq!(
                got.as_ref(),
                model.get(&k),
                "seed {seed} op {op}: get {k:?}"
            );
        } else if roll < 998 || (in_memory && roll < 999) {
            check_range(target, model, &mut rng, seed, op);
        } else if roll < 999 {
            tree.close()
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: close: {e}"));
            assert!(matches!(spaces[0].get(b"k"), Err(Error::Closed)));
            tree =
                Tree::open(config()).unwrap_or_else(|e| panic!("seed {seed} op {op}: reopen: {e}"));
            assert_eq!(tree.keyspaces().expect("keyspaces"), NAMED);
            spaces = handles(&tree);
        } else if s > 0 {
            // Drop a named keyspace and start it again, empty.
            tree.drop_keyspace(NAMED[s - 1])
                .unwrap_or_else(|e| panic!("seed {seed} op {op}: drop: {e}"));
            assert!(matches!(
                spaces[s - 1].get(b"k"),
                Err(Error::KeyspaceDropped { .. })
            ));
            model.clear();
            spaces[s - 1] = tree.keyspace(NAMED[s - 1]).expect("keyspace again");
            assert!(
                spaces[s - 1].iter().next().is_none(),
                "seed {seed} op {op}: recreated keyspace not empty"
            );
        }
    }
    // Everything, both ways, at the end.
    let check_all = |tree: &Tree, spaces: &[Keyspace], what: &str| {
        for (s, model) in models.iter().enumerate() {
            let target = if s == 0 {
                Target::Tree(tree)
            } else {
                Target::Space(&spaces[s - 1])
            };
            let expected: Vec<Kv> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_same(
                &target.all(),
                &expected,
                &format!("seed {seed}: {what}, keyspace {s}"),
            );
            let mut rev: Vec<Kv> = target
                .range(Bound::Unbounded, Bound::Unbounded)
                .rev()
                .map(|r| r.expect("iter"))
                .collect();
            rev.reverse();
            assert_eq!(rev, expected, "seed {seed}: {what} reversed, keyspace {s}");
        }
    };
    check_all(&tree, &spaces, "final iteration");
    if !in_memory {
        tree.close().expect("close");
        let tree = Tree::open(config()).expect("reopen");
        let spaces = handles(&tree);
        check_all(&tree, &spaces, "after final reopen");
    }
}

fn ops_per_seed(default: usize) -> usize {
    std::env::var("BFKV_DIFF_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn seeds(base: u64, n: u64) -> Vec<u64> {
    match std::env::var("BFKV_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (base..base + n).collect(),
    }
}

#[test]
fn tiny_cache_256k_matches_btreemap() {
    for seed in seeds(1, 4) {
        run(seed, ops_per_seed(150_000), 256 << 10, false);
    }
}

#[test]
fn cache_4m_matches_btreemap() {
    for seed in seeds(100, 2) {
        run(seed, ops_per_seed(150_000), 4 << 20, false);
    }
}

#[test]
fn in_memory_matches_btreemap() {
    for seed in seeds(200, 2) {
        run(seed, ops_per_seed(60_000), 64 << 20, true);
    }
}
