//! Power-cut sweeps under `Durability::Sync`: a workload of a few thousand inserts and
//! removes on a tree whose data pages live on a `FaultStore` and whose log and checkpoint
//! live on a `MemFs` (both emulated disks with volatile caches, powered off together), with
//! a 64 KiB cache (evictions write leaves) and a checkpoint every 400 operations. Power is
//! cut at the N-th mutating call of the log's file system (one sweep) or at the N-th
//! data-page write (another), for every N over the whole run, torn writes on odd N. After
//! each cut the tree is reopened from the two crash images; it must equal a `BTreeMap` replay
//! of every acknowledged operation, plus possibly the one in flight, and pass its structure
//! check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{background, persist, Tree};
use crate::config::Config;
use crate::error::Result;
use crate::store::{FaultStore, PageStore};
use crate::sync::Arc;
use crate::wal::memfs::MemFs;
use crate::wal::vfs::LogFs;
use crate::Durability;

/// Operations per run.
const OPS: u32 = 2400;
/// Distinct keys.
const KEYS: u32 = 1500;
/// Operations between explicit checkpoints.
const CHECKPOINT_EVERY: u32 = 400;

/// One operation of the workload.
#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

/// The fixed workload: a cheap deterministic generator, mostly inserts, a quarter removes.
fn workload() -> Vec<Op> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..OPS)
        .map(|seq| {
            let r = next();
            let key = format!("key-{:05}", r % u64::from(KEYS)).into_bytes();
            if seq > 300 && r >> 40 & 3 == 0 {
                Op::Remove(key)
            } else {
                let len = 20 + (r >> 20) as usize % 120;
                let mut v = format!("v{seq}-").into_bytes();
                v.resize(len, b'x');
                Op::Insert(key, v)
            }
        })
        .collect()
}

fn config() -> Config {
    Config::new("/powercut")
        .cache_size(64 << 10)
        .durability(Durability::Sync)
        .log_segment_size(8 << 10)
        .evictor_threads(0)
}

/// Opens a tree over the given store and file system (no directory lock: nothing on disk).
fn open(store: Arc<FaultStore>, fs: Arc<MemFs>) -> Result<Tree> {
    let dir = Path::new("/powercut");
    let store: Arc<dyn PageStore> = store;
    let fs: Arc<dyn LogFs> = fs;
    let shared = std::sync::Arc::new(persist::open_on(
        config(),
        dir,
        store,
        PathBuf::from("/powercut/data"),
        fs,
        None,
    )?);
    Ok(Tree {
        background: background::Background::start(&shared, 0),
        shared,
    })
}

/// What a run did before the power went: how many operations were acknowledged.
struct Run {
    acked: usize,
}

/// Runs the workload until the first error (the power cut) and returns how far it got.
fn run(ops: &[Op], store: &Arc<FaultStore>, fs: &Arc<MemFs>) -> Run {
    let Ok(tree) = open(store.clone(), fs.clone()) else {
        return Run { acked: 0 };
    };
    let mut acked = 0;
    for (i, op) in ops.iter().enumerate() {
        if i > 0 && i as u32 % CHECKPOINT_EVERY == 0 && tree.checkpoint().is_err() {
            break;
        }
        let res = match op {
            Op::Insert(k, v) => tree.insert(k, v),
            Op::Remove(k) => tree.remove(k),
        };
        if res.is_err() {
            break;
        }
        acked = i + 1;
    }
    // Dropping closes (a checkpoint) on the dead disks: errors are ignored, nothing panics.
    drop(tree);
    Run { acked }
}

fn model(ops: &[Op]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for op in ops {
        match op {
            Op::Insert(k, v) => m.insert(k.clone(), v.clone()),
            Op::Remove(k) => m.remove(k),
        };
    }
    m
}

/// Reopens from the crash images and compares with the acknowledged prefix (or that plus
/// the operation in flight).
fn check_recovery(ops: &[Op], run: &Run, store: &FaultStore, fs: &MemFs, what: &str) {
    let tree = open(Arc::new(store.crash_image()), Arc::new(fs.crash_image()))
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    tree.shared
        .check_structure()
        .unwrap_or_else(|e| panic!("{what}: structure: {e}"));
    let got: BTreeMap<Vec<u8>, Vec<u8>> = tree
        .iter()
        .collect::<Result<_>>()
        .unwrap_or_else(|e| panic!("{what}: scan failed: {e}"));
    let acked = model(&ops[..run.acked]);
    if got != acked {
        let with_inflight = model(&ops[..(run.acked + 1).min(ops.len())]);
        assert!(
            got == with_inflight,
            "{what}: {} acknowledged ops, tree has {} keys, model {}",
            run.acked,
            got.len(),
            acked.len()
        );
    }
    for (k, v) in acked.iter().step_by(17) {
        if run.acked < ops.len() && ops[run.acked].key() == k.as_slice() {
            continue;
        }
        assert_eq!(tree.get(k).ok().flatten().as_ref(), Some(v), "{what}: get");
    }
    drop(tree);
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Insert(k, _) | Op::Remove(k) => k,
        }
    }
}

/// Fresh linked disks.
fn disks() -> (Arc<FaultStore>, Arc<MemFs>) {
    let store = Arc::new(FaultStore::new(4096));
    let fs = Arc::new(MemFs::new());
    fs.link(store.clone());
    (store, fs)
}

/// Every N up to `total`, or every `total / limit`-th if `BFKV_POWER_SAMPLE` asks for fewer.
fn cuts(total: u64) -> impl Iterator<Item = u64> {
    let limit: u64 = std::env::var("BFKV_POWER_SAMPLE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let step = total.div_ceil(limit).max(1);
    (1..=total + 1).step_by(step as usize)
}

#[test]
fn power_cut_at_every_log_call_loses_nothing_acknowledged() {
    let ops = workload();
    let (store, fs) = disks();
    let full = run(&ops, &store, &fs);
    assert_eq!(full.acked, ops.len());
    let total = fs.ops();
    let mut runs = 0;
    for n in cuts(total) {
        let (store, fs) = disks();
        fs.power_cut_at(n, n % 2 == 1);
        let r = run(&ops, &store, &fs);
        assert_eq!(
            fs.is_powered_off(),
            n <= total,
            "log cut at call {n} did not happen"
        );
        check_recovery(&ops, &r, &store, &fs, &format!("log cut at call {n}"));
        runs += 1;
    }
    eprintln!("log sweep: {runs} cuts over {total} file-system calls");
}

#[test]
fn power_cut_at_every_data_write_loses_nothing_acknowledged() {
    let ops = workload();
    let (store, fs) = disks();
    run(&ops, &store, &fs);
    let total = store.disk_writes();
    assert!(total > 50, "only {total} data-page writes");
    let (mut runs, mut fired) = (0, 0);
    for n in cuts(total) {
        let (store, fs) = disks();
        store.power_cut_at_write(n, n % 2 == 1);
        let r = run(&ops, &store, &fs);
        // The close at the end writes a varying number of pages: the last few N may not
        // be reached.
        fired += u64::from(store.is_powered_off());
        check_recovery(&ops, &r, &store, &fs, &format!("data cut at write {n}"));
        runs += 1;
    }
    eprintln!("data sweep: {runs} cuts over {total} page writes, {fired} fired");
    assert!(
        fired * 10 >= runs * 9,
        "only {fired} of {runs} cuts happened"
    );
}
