//! Snapshots and transactions against a model: seeded random sequences of writes (inserts,
//! removes, merges, batches, compare-and-swaps) over three keyspaces, interleaved with
//! snapshots (each checked against a copy of the model taken when it was made) and
//! transactions (their reads checked against the model at their start plus their own
//! writes; their commit expected to conflict exactly when a key they read, or any key in a
//! range they scanned, was written after their start; the model replays each commit in
//! commit order). Caches are small enough that eviction, write-back and splits run under
//! the snapshots.
//!
//! A failure prints the seed; rerun one with `BFKV_SEED=<seed> cargo test --release --test
//! differential_transactions`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bfkv::{Config, Error, Keyspace, Snapshot, Transaction, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Model = Vec<BTreeMap<Vec<u8>, Vec<u8>>>;

/// A range of user keys: its lower and upper bound.
type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// Appends the operand to the value (the model does the same).
#[allow(clippy::unnecessary_wraps)] // the merge operator's signature
fn append(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let mut v = old.unwrap_or_default().to_vec();
    v.extend_from_slice(operand);
    Some(v)
}

fn key(rng: &mut StdRng) -> Vec<u8> {
    format!("k{:03}", rng.gen_range(0..300)).into_bytes()
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.gen_ratio(1, 10) {
        rng.gen_range(100..900)
    } else {
        rng.gen_range(0..24)
    };
    (0..len).map(|_| rng.gen()).collect()
}

/// A range of user keys, possibly empty or inverted.
fn bounds(rng: &mut StdRng) -> Bounds {
    let one = |rng: &mut StdRng| match rng.gen_range(0..3) {
        0 => Bound::Included(key(rng)),
        1 => Bound::Excluded(key(rng)),
        _ => Bound::Unbounded,
    };
    (one(rng), one(rng))
}

fn contains(b: &Bounds, k: &[u8]) -> bool {
    let lo = match &b.0 {
        Bound::Included(l) => k >= l.as_slice(),
        Bound::Excluded(l) => k > l.as_slice(),
        Bound::Unbounded => true,
    };
    let hi = match &b.1 {
        Bound::Included(h) => k <= h.as_slice(),
        Bound::Excluded(h) => k < h.as_slice(),
        Bound::Unbounded => true,
    };
    lo && hi
}

fn in_model(m: &BTreeMap<Vec<u8>, Vec<u8>>, b: &Bounds) -> Vec<(Vec<u8>, Vec<u8>)> {
    m.iter()
        .filter(|(k, _)| contains(b, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// What one write does, for the model: (keyspace, key, Some(value) / None remove, merge).
#[derive(Clone)]
enum W {
    Put(usize, Vec<u8>, Vec<u8>),
    Del(usize, Vec<u8>),
    Merge(usize, Vec<u8>, Vec<u8>),
}

impl W {
    fn apply(&self, model: &mut Model) {
        match self {
            W::Put(s, k, v) => {
                model[*s].insert(k.clone(), v.clone());
            }
            W::Del(s, k) => {
                model[*s].remove(k);
            }
            W::Merge(s, k, o) => {
                let mut v = model[*s].get(k).cloned().unwrap_or_default();
                v.extend_from_slice(o);
                model[*s].insert(k.clone(), v);
            }
        }
    }

    fn target(&self) -> (usize, &[u8]) {
        match self {
            W::Put(s, k, _) | W::Del(s, k) | W::Merge(s, k, _) => (*s, k),
        }
    }
}

/// An open transaction and what the model knows of it.
struct Open {
    tx: Transaction,
    /// The model at its start.
    start: Model,
    /// Its own writes, in order.
    writes: Vec<W>,
    /// What it read: keys and ranges, per keyspace.
    keys: BTreeSet<(usize, Vec<u8>)>,
    ranges: Vec<(usize, Bounds)>,
    /// Keys others wrote since its start.
    written_since: BTreeSet<(usize, Vec<u8>)>,
}

impl Open {
    /// The model as this transaction sees it.
    fn view(&self) -> Model {
        let mut m = self.start.clone();
        for w in &self.writes {
            w.apply(&mut m);
        }
        m
    }

    fn conflicts(&self) -> bool {
        self.written_since.iter().any(|(s, k)| {
            self.keys.contains(&(*s, k.clone()))
                || self.ranges.iter().any(|(rs, b)| rs == s && contains(b, k))
        })
    }
}

fn run(seed: u64, ops: usize, in_memory: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = if in_memory {
        Config::in_memory().cache_size(4 << 20)
    } else {
        Config::new(dir.path()).cache_size(256 << 10)
    }
    .merge_operator(append);
    let tree = Tree::open(config).expect("open");
    let spaces: Vec<Keyspace> = vec![
        tree.default_keyspace(),
        tree.keyspace("a").expect("keyspace"),
        tree.keyspace("b").expect("keyspace"),
    ];
    let mut model: Model = vec![BTreeMap::new(); spaces.len()];
    let mut snapshots: Vec<(Snapshot, Model)> = Vec::new();
    let mut txs: Vec<Open> = Vec::new();
    let ctx = |op: usize| format!("seed {seed} op {op}");
    for op in 0..ops {
        let s = rng.gen_range(0..spaces.len());
        let ks = &spaces[s];
        let roll = rng.gen_range(0..1000);
        // A write from outside any transaction.
        let mut direct: Vec<W> = Vec::new();
        if roll < 300 {
            let (k, v) = (key(&mut rng), value(&mut rng));
            ks.insert(&k, &v).expect("insert");
            direct.push(W::Put(s, k, v));
        } else if roll < 380 {
            let k = key(&mut rng);
            ks.remove(&k).expect("remove");
            direct.push(W::Del(s, k));
        } else if roll < 430 {
            let (k, o) = (key(&mut rng), vec![rng.gen::<u8>(); 2]);
            ks.merge(&k, &o).expect("merge");
            direct.push(W::Merge(s, k, o));
        } else if roll < 460 {
            let mut batch = tree.batch();
            for _ in 0..rng.gen_range(1..6) {
                let t = rng.gen_range(0..spaces.len());
                let (k, v) = (key(&mut rng), value(&mut rng));
                batch.insert(&spaces[t], &k, &v);
                direct.push(W::Put(t, k, v));
            }
            batch.commit().expect("batch");
        } else if roll < 480 {
            let k = key(&mut rng);
            let current = model[s].get(&k).cloned();
            let new = value(&mut rng);
            let expected = if rng.gen() {
                current.clone()
            } else {
                Some(b"nope".to_vec())
            };
            let swapped = ks
                .compare_and_swap(&k, expected.as_deref(), Some(new.as_slice()))
                .expect("cas");
            assert_eq!(swapped, expected == current, "{}: cas", ctx(op));
            if swapped {
                direct.push(W::Put(s, k, new));
            }
        } else if roll < 540 {
            snapshots.push((tree.snapshot(), model.clone()));
        } else if roll < 620 && !snapshots.is_empty() {
            let i = rng.gen_range(0..snapshots.len());
            let (snap, then) = &snapshots[i];
            if rng.gen() {
                let k = key(&mut rng);
                let got = snap.get(ks, &k).expect("snapshot get");
                assert_eq!(got.as_ref(), then[s].get(&k), "{}: snapshot get", ctx(op));
            } else {
                let b = bounds(&mut rng);
                let mut got: Vec<_> = snap
                    .range(ks, b.clone())
                    .map(|r| r.expect("snapshot range"))
                    .collect();
                if rng.gen() {
                    got = snap
                        .range(ks, b.clone())
                        .rev()
                        .map(|r| r.expect("range"))
                        .collect();
                    got.reverse();
                }
                assert_eq!(got, in_model(&then[s], &b), "{}: snapshot range", ctx(op));
            }
        } else if roll < 650 && !snapshots.is_empty() {
            snapshots.swap_remove(rng.gen_range(0..snapshots.len()));
        } else if roll < 680 && txs.len() < 4 {
            txs.push(Open {
                tx: tree.transaction(),
                start: model.clone(),
                writes: Vec::new(),
                keys: BTreeSet::new(),
                ranges: Vec::new(),
                written_since: BTreeSet::new(),
            });
        } else if roll < 900 && !txs.is_empty() {
            let i = rng.gen_range(0..txs.len());
            let t = &mut txs[i];
            match rng.gen_range(0..10) {
                0..=2 => {
                    let k = key(&mut rng);
                    let got = t.tx.get(ks, &k).expect("tx get");
                    let view = t.view();
                    assert_eq!(got.as_ref(), view[s].get(&k), "{}: tx get", ctx(op));
                    // A key the transaction itself set or removed is not read from the tree.
                    let own = t.writes.iter().rev().find(|w| w.target() == (s, &k[..]));
                    if !matches!(own, Some(W::Put(..) | W::Del(..))) {
                        t.keys.insert((s, k));
                    }
                }
                3 => {
                    let b = bounds(&mut rng);
                    let view = t.view();
                    let got: Vec<_> =
                        t.tx.range(ks, b.clone())
                            .map(|r| r.expect("tx range"))
                            .collect();
                    assert_eq!(got, in_model(&view[s], &b), "{}: tx range", ctx(op));
                    t.ranges.push((s, b));
                }
                4..=6 => {
                    let (k, v) = (key(&mut rng), value(&mut rng));
                    t.tx.insert(ks, &k, &v);
                    t.writes.push(W::Put(s, k, v));
                }
                7 => {
                    let k = key(&mut rng);
                    t.tx.remove(ks, &k);
                    t.writes.push(W::Del(s, k));
                }
                _ => {
                    let k = key(&mut rng);
                    t.tx.merge(ks, &k, b"m");
                    t.writes.push(W::Merge(s, k, b"m".to_vec()));
                }
            }
        } else if !txs.is_empty() {
            let t = txs.swap_remove(rng.gen_range(0..txs.len()));
            let conflict = t.conflicts() && !t.writes.is_empty();
            let writes = t.writes.clone();
            let outcome = t.tx.commit();
            if conflict {
                assert!(
                    matches!(outcome, Err(Error::Conflict { .. })),
                    "{}: expected a conflict, got {outcome:?}",
                    ctx(op)
                );
            } else {
                outcome.unwrap_or_else(|e| panic!("{}: commit: {e}", ctx(op)));
                // The commit is a write from outside every other open transaction.
                for w in &writes {
                    w.apply(&mut model);
                }
                direct.extend(writes);
            }
        }
        for t in &mut txs {
            for w in &direct {
                let (ws, wk) = w.target();
                t.written_since.insert((ws, wk.to_vec()));
            }
        }
        // A commit's writes are in the model already.
        if roll < 480 {
            for w in &direct {
                w.apply(&mut model);
            }
        }
    }
    // Every snapshot still reads its moment, whole, both ways.
    for (snap, then) in &snapshots {
        for (s, ks) in spaces.iter().enumerate() {
            let all = (Bound::Unbounded, Bound::Unbounded);
            let up: Vec<_> = snap.iter(ks).map(|r| r.expect("iter")).collect();
            assert_eq!(up, in_model(&then[s], &all), "seed {seed}: final snapshot");
            let mut down: Vec<_> = snap.iter(ks).rev().map(|r| r.expect("iter")).collect();
            down.reverse();
            assert_eq!(down, up, "seed {seed}: final snapshot reversed");
        }
    }
    drop(txs);
    drop(snapshots);
    for (s, ks) in spaces.iter().enumerate() {
        let got: Vec<_> = ks.iter().map(|r| r.expect("iter")).collect();
        assert_eq!(
            got,
            in_model(&model[s], &(Bound::Unbounded, Bound::Unbounded)),
            "seed {seed}: final"
        );
    }
    assert_eq!(
        tree.stats().snapshot_bytes,
        0,
        "seed {seed}: nothing kept once all are gone"
    );
}

fn seeds(base: u64, n: u64) -> Vec<u64> {
    match std::env::var("BFKV_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (base..base + n).collect(),
    }
}

#[test]
fn transactions_and_snapshots_match_the_model_on_disk() {
    for seed in seeds(0xD1F7, 6) {
        run(seed, 6000, false);
    }
}

#[test]
fn transactions_and_snapshots_match_the_model_in_memory() {
    for seed in seeds(0xD1F8, 6) {
        run(seed, 6000, true);
    }
}
