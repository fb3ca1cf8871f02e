//! The whole tree against `BTreeMap`: arbitrary sequences of insert, remove, get, get_many, range
//! scans (any bounds, stepped from either end in any interleaving), checkpoint and close+reopen,
//! on a file-backed tree with a 256 KiB cache and 4 KiB pages, so eviction, mini-page growth,
//! merges, splits and leaf removal run after a few dozen operations. Every answer must equal
//! the model's.
#![no_main]

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::path::PathBuf;

use arbitrary::Arbitrary;
use bfkv::{Config, Tree};
use libfuzzer_sys::fuzz_target;

/// A key: mostly from a small space (so operations meet), sometimes raw bytes.
#[derive(Arbitrary, Debug, Clone)]
enum Key {
    /// `prefix` picks one of a few shared prefixes; `n` is reduced to 1024 keys.
    Small { prefix: u8, n: u16 },
    /// Raw bytes (the empty key too), cut to 64.
    Raw(Vec<u8>),
}

const PREFIXES: [&str; 3] = ["", "user/", "tenant-0042/orders/2026/aaaaaaaaaaaaaaaa/"];

impl Key {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Key::Small { prefix, n } => format!(
                "{}{:03x}",
                PREFIXES[usize::from(*prefix) % PREFIXES.len()],
                n % 1024
            )
            .into_bytes(),
            Key::Raw(b) => b[..b.len().min(64)].to_vec(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum End {
    Included(Key),
    Excluded(Key),
    Unbounded,
}

impl End {
    fn bound(&self) -> Bound<Vec<u8>> {
        match self {
            End::Included(k) => Bound::Included(k.bytes()),
            End::Excluded(k) => Bound::Excluded(k.bytes()),
            End::Unbounded => Bound::Unbounded,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Value of `len % 1500` bytes (large ones fill leaves fast) derived from `seed`.
    Insert {
        key: Key,
        len: u16,
        seed: u8,
    },
    Remove(Key),
    /// Inserts `count` consecutive small keys from `start` with values of `len % 1500` bytes:
    /// a few of these fill the cache, so short inputs reach eviction and splits.
    Fill {
        start: u16,
        count: u8,
        len: u16,
        seed: u8,
    },
    /// Removes `count` consecutive small keys from `start` (empties whole leaves).
    Clear {
        start: u16,
        count: u8,
    },
    Get(Key),
    /// `get_many` of `key` and `count % 48` small keys from `start`, `step % 64 + 1` apart
    /// (many leaves, so its reads of pages the cache misses run streamed, over batches).
    GetMany {
        key: Key,
        start: u16,
        step: u8,
        count: u8,
    },
    /// A scan over (lo, hi); each bit of `steps` (low first, `count % 40` of them) takes the
    /// next record from the front (0) or the back (1).
    Range {
        lo: End,
        hi: End,
        steps: u64,
        count: u8,
    },
    Checkpoint,
    Reopen,
}

fn value(len: u16, seed: u8) -> Vec<u8> {
    (0..usize::from(len % 1500))
        .map(|i| seed.wrapping_add((i * 31) as u8))
        .collect()
}

/// Whether `BTreeMap::range` accepts these bounds (it panics on inverted ranges; the tree
/// returns nothing for them).
fn model_accepts(lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    match (lo, hi) {
        (Bound::Included(l), Bound::Included(h))
        | (Bound::Included(l), Bound::Excluded(h))
        | (Bound::Excluded(l), Bound::Included(h)) => l <= h,
        (Bound::Excluded(l), Bound::Excluded(h)) => l < h,
        _ => true,
    }
}

/// This process's tree directory (libFuzzer runs inputs one after another). On tmpfs when
/// there is one: every input opens and closes a tree, and fsyncs on a disk would dominate.
fn dir() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("bfkv-fuzz-tree-{}", std::process::id()))
}

fn small_key(n: u32) -> Vec<u8> {
    Key::Small {
        prefix: 1,
        n: (n % 1024) as u16,
    }
    .bytes()
}

fn config() -> Config {
    Config::new(dir()).cache_size(256 << 10).page_size(4096)
}

fn check_all(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    let got: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{when}: iter: {e}"));
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(
        got == want,
        "{when}: {} records, model {}",
        got.len(),
        want.len()
    );
}

fuzz_target!(|ops: Vec<Op>| {
    let _ = std::fs::remove_dir_all(dir());
    let mut tree = Some(Tree::open(config()).expect("open"));
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (n, op) in ops.iter().take(3000).enumerate() {
        if let Op::Reopen = op {
            if let Some(t) = tree.take() {
                t.close().unwrap_or_else(|e| panic!("op {n}: close: {e}"));
            }
            let t = Tree::open(config()).unwrap_or_else(|e| panic!("op {n}: reopen: {e}"));
            check_all(&t, &model, "after reopen");
            tree = Some(t);
            continue;
        }
        let Some(t) = tree.as_ref() else { break };
        match op {
            Op::Insert { key, len, seed } => {
                let (k, v) = (key.bytes(), value(*len, *seed));
                t.insert(&k, &v)
                    .unwrap_or_else(|e| panic!("op {n}: insert: {e}"));
                model.insert(k, v);
            }
            Op::Fill {
                start,
                count,
                len,
                seed,
            } => {
                for i in 0..u32::from(*count) {
                    let (k, v) = (small_key(u32::from(*start) + i), value(*len, *seed));
                    t.insert(&k, &v)
                        .unwrap_or_else(|e| panic!("op {n}: fill: {e}"));
                    model.insert(k, v);
                }
            }
            Op::Clear { start, count } => {
                for i in 0..u32::from(*count) {
                    let k = small_key(u32::from(*start) + i);
                    t.remove(&k)
                        .unwrap_or_else(|e| panic!("op {n}: clear: {e}"));
                    model.remove(&k);
                }
            }
            Op::Remove(key) => {
                let k = key.bytes();
                t.remove(&k)
                    .unwrap_or_else(|e| panic!("op {n}: remove: {e}"));
                model.remove(&k);
            }
            Op::Get(key) => {
                let k = key.bytes();
                let got = t.get(&k).unwrap_or_else(|e| panic!("op {n}: get: {e}"));
                assert_eq!(got.as_ref(), model.get(&k), "op {n}: get {k:?}");
            }
            Op::GetMany {
                key,
                start,
                step,
                count,
            } => {
                let keys: Vec<Vec<u8>> =
                    std::iter::once(key.bytes())
                        .chain((0..u32::from(*count % 48)).map(|i| {
                            small_key(u32::from(*start) + i * (u32::from(*step % 64) + 1))
                        }))
                        .collect();
                let got = t.get_many(&keys);
                assert_eq!(got.len(), keys.len(), "op {n}: get_many");
                for (k, g) in keys.iter().zip(got) {
                    let g = g.unwrap_or_else(|e| panic!("op {n}: get_many: {e}"));
                    assert_eq!(g.as_ref(), model.get(k), "op {n}: get_many {k:?}");
                }
            }
            Op::Range {
                lo,
                hi,
                steps,
                count,
            } => {
                let (lo, hi) = (lo.bound(), hi.bound());
                let mut want: VecDeque<(Vec<u8>, Vec<u8>)> = if model_accepts(&lo, &hi) {
                    model
                        .range((lo.clone(), hi.clone()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                } else {
                    VecDeque::new()
                };
                let mut it = t.range::<Vec<u8>, _>((lo, hi));
                for s in 0..u32::from(*count % 40) {
                    let back = (steps >> s) & 1 == 1;
                    let (got, exp) = if back {
                        (it.next_back(), want.pop_back())
                    } else {
                        (it.next(), want.pop_front())
                    };
                    let got = got.map(|r| r.unwrap_or_else(|e| panic!("op {n}: scan: {e}")));
                    assert_eq!(got, exp, "op {n}: scan step {s} (back {back})");
                }
            }
            Op::Checkpoint => t
                .checkpoint()
                .unwrap_or_else(|e| panic!("op {n}: checkpoint: {e}")),
            Op::Reopen => {}
        }
    }
    if let Some(t) = tree.take() {
        check_all(&t, &model, "at the end");
        t.close().expect("close");
    }
    let _ = std::fs::remove_dir_all(dir());
});
