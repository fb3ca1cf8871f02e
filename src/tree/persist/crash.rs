//! One power-cut scenario under `Durability::Sync`, shared by the sweeps in `power_tests`
//! and the fuzz target `crash_recovery` (through `internals::crash_recovery_check`).
//!
//! The tree's data pages live on a `FaultStore` and its log and checkpoint file on a
//! `MemFs`, linked so both lose power together; the cache is 64 KiB (evictions write
//! leaves) and log segments 8 KiB (segment rolls and releases happen). Power is cut at the
//! N-th mutating log-file-system call or at the N-th data-page write. The operations run
//! until the first error, which must come from the cut; every successful `get` before the
//! cut must agree with the model. The tree is then reopened from the two crash images and
//! must equal a `BTreeMap` replay of every acknowledged operation, or that plus the one in
//! flight; point lookups must agree with the scan, the structure check must pass, and the
//! recovered tree must accept a write and a checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::Result;
use crate::store::{FaultStore, PageStore};
use crate::sync::Arc;
use crate::tree::Tree;
use crate::wal::memfs::MemFs;
use crate::wal::vfs::LogFs;
use crate::Durability;

/// The tree's directory on the emulated file system.
pub(in crate::tree) const DIR: &str = "/powercut";

/// One operation of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(fuzzing, bfkv_internals)), allow(unreachable_pub))] // `internals` re-exports it
pub enum CrashOp {
    /// `insert(key, value)`.
    Insert(Vec<u8>, Vec<u8>),
    /// `remove(key)`.
    Remove(Vec<u8>),
    /// `get(key)`, checked against the model while the power is on.
    Get(Vec<u8>),
    /// A checkpoint: of each three, the third full (`Tree::checkpoint`), the others fuzzy
    /// (the background checkpointer's kind).
    Checkpoint,
}

/// Where the power goes off; counts start when the disks are created, so the tree's own
/// open is included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(fuzzing, bfkv_internals)), allow(unreachable_pub))] // `internals` re-exports it
pub enum CrashCut {
    /// No cut: the run ends with a clean close (a checkpoint) before the reopen.
    None,
    /// At the `at`-th mutating call of the log's file system (1 = the first); with `torn`,
    /// the first half of a cut write reaches the medium.
    Log {
        /// The call, counted from 1.
        at: u64,
        /// Whether a cut write tears.
        torn: bool,
    },
    /// At the `at`-th data-page write (the store's own metadata pages included).
    Data {
        /// The write, counted from 1.
        at: u64,
        /// Whether the cut write tears.
        torn: bool,
    },
}

/// What one scenario did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(fuzzing, bfkv_internals)), allow(unreachable_pub))] // `internals` re-exports it
pub struct CrashOutcome {
    /// Operations that returned success before the first error.
    pub acked: usize,
    /// Whether the disk the cut was armed on lost power (false for `CrashCut::None`).
    pub cut_fired: bool,
    /// Mutating log-file-system calls of the run, the final close included.
    pub log_calls: u64,
    /// Data-page writes of the run, the final close included.
    pub data_writes: u64,
}

impl CrashOp {
    /// The key the operation touches, if any.
    fn key(&self) -> Option<&[u8]> {
        match self {
            CrashOp::Insert(k, _) | CrashOp::Remove(k) | CrashOp::Get(k) => Some(k),
            CrashOp::Checkpoint => None,
        }
    }

    /// Applies the operation to the model.
    pub(in crate::tree) fn apply(&self, model: &mut BTreeMap<Vec<u8>, Vec<u8>>) {
        match self {
            CrashOp::Insert(k, v) => {
                model.insert(k.clone(), v.clone());
            }
            CrashOp::Remove(k) => {
                model.remove(k);
            }
            CrashOp::Get(_) | CrashOp::Checkpoint => {}
        }
    }
}

/// The shape of a generated workload (`workload`).
#[cfg(test)]
#[derive(Clone, Copy)]
pub(in crate::tree) struct Shape {
    /// Seed of the generator.
    pub(in crate::tree) seed: u64,
    /// Writes in all.
    pub(in crate::tree) ops: u32,
    /// Distinct keys.
    pub(in crate::tree) keys: u32,
    /// Writes between explicit checkpoints.
    pub(in crate::tree) checkpoint_every: u32,
    /// Writes before the first remove.
    pub(in crate::tree) inserts_first: u32,
}

/// A deterministic workload (a cheap xorshift generator): mostly inserts of 20..140-byte
/// values, after `inserts_first` writes a quarter removes, an eighth of the writes preceded
/// by a lookup of their key, a checkpoint before every `checkpoint_every`-th write.
#[cfg(test)]
pub(in crate::tree) fn workload(shape: Shape) -> Vec<CrashOp> {
    let mut x = shape.seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ops = Vec::new();
    for seq in 0..shape.ops {
        if seq > 0 && seq % shape.checkpoint_every == 0 {
            ops.push(CrashOp::Checkpoint);
        }
        let r = next();
        let key = format!("key-{:05}", r % u64::from(shape.keys)).into_bytes();
        if (r >> 50) % 8 == 0 {
            // A lookup of a key that may be present or removed, checked against the model.
            ops.push(CrashOp::Get(key.clone()));
        }
        ops.push(if seq > shape.inserts_first && (r >> 40) % 4 == 0 {
            CrashOp::Remove(key)
        } else {
            let len = 20 + (r >> 20) as usize % 120;
            let mut v = format!("v{seq}-").into_bytes();
            v.resize(len, b'x');
            CrashOp::Insert(key, v)
        });
    }
    ops
}

/// The model after `ops`.
fn model(ops: &[CrashOp]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for op in ops {
        op.apply(&mut m);
    }
    m
}

/// The configuration every scenario uses: small cache and segments, synchronous commits,
/// no evictor threads (evictions happen inline, so runs are repeatable) and no idle write-back.
fn config() -> Config {
    Config::new(DIR)
        .cache_size(64 << 10)
        .durability(Durability::Sync)
        .log_segment_size(8 << 10)
        .evictor_threads(0)
        .idle_write_back(None)
}

/// Opens a tree over the given store and file system (no directory lock: nothing on disk).
fn open(store: Arc<FaultStore>, fs: Arc<MemFs>) -> Result<Tree> {
    open_with(config(), store, fs)
}

/// `open` with another configuration (its directory is ignored).
pub(in crate::tree) fn open_with(
    config: Config,
    store: Arc<FaultStore>,
    fs: Arc<MemFs>,
) -> Result<Tree> {
    let store: Arc<dyn PageStore> = store;
    let fs: Arc<dyn LogFs> = fs;
    let shared = std::sync::Arc::new(super::open::open_on(
        config,
        Path::new(DIR),
        store,
        PathBuf::from(format!("{DIR}/data")),
        None,
        fs,
        None,
    )?);
    Ok(Tree::from_shared(shared, 0))
}

/// A configuration for a tree on `disks` whose leaves stay cached and dirty until a
/// test evicts or writes them back: `Sync` writes, a 4 MiB cache, no evictor threads, no
/// idle write-back.
#[cfg(test)]
pub(in crate::tree) fn quiet_config() -> Config {
    Config::new(DIR)
        .cache_size(4 << 20)
        .durability(crate::Durability::Sync)
        // `MemFs` copies a segment's bytes on every sync: keep them small.
        .log_segment_size(64 << 10)
        .evictor_threads(0)
        .idle_write_back(None)
}

/// Fresh disks that lose power together.
pub(in crate::tree) fn disks() -> (Arc<FaultStore>, Arc<MemFs>) {
    let store = Arc::new(FaultStore::new(4096));
    let fs = Arc::new(MemFs::new());
    fs.link(store.clone());
    (store, fs)
}

/// Whether either disk has lost power.
fn power_off(store: &FaultStore, fs: &MemFs) -> bool {
    store.is_powered_off() || fs.is_powered_off()
}

/// Runs `ops` until the first error and returns how many were acknowledged. An error with
/// both disks powered is a bug, and so is a `get` that disagrees with the model.
fn run(ops: &[CrashOp], store: &Arc<FaultStore>, fs: &Arc<MemFs>, what: &str) -> usize {
    let tree = match open(store.clone(), fs.clone()) {
        Ok(tree) => tree,
        Err(e) => {
            assert!(power_off(store, fs), "{what}: open failed, power on: {e}");
            return 0;
        }
    };
    let mut live = BTreeMap::new();
    let mut acked = 0;
    let mut checkpoints = 0u32;
    for (i, op) in ops.iter().enumerate() {
        let res = match op {
            CrashOp::Insert(k, v) => tree.insert(k, v),
            CrashOp::Remove(k) => tree.remove(k),
            // Two of three fuzzy (what the background checkpointer runs), so the log kept
            // for a leaf left dirty spans a checkpoint before a crash.
            CrashOp::Checkpoint => {
                checkpoints += 1;
                if checkpoints.is_multiple_of(3) {
                    tree.checkpoint()
                } else {
                    tree.shared().checkpoint_fuzzy()
                }
            }
            CrashOp::Get(k) => tree.get(k).map(|got| {
                // Once a data write has been dropped silently, pages read back may be stale:
                // the process would be dead by then, so its reads prove nothing.
                if !power_off(store, fs) {
                    assert_eq!(got.as_ref(), live.get(k), "{what}: get at op {i}");
                }
            }),
        };
        if let Err(e) = res {
            assert!(power_off(store, fs), "{what}: op {i} failed, power on: {e}");
            break;
        }
        op.apply(&mut live);
        acked = i + 1;
    }
    // Dropping closes (a checkpoint) on the dead disks: errors are ignored, nothing panics.
    drop(tree);
    acked
}

/// Reopens from the crash images and compares with the acknowledged prefix (or that plus
/// the operation in flight); point lookups are checked on every `get_stride`-th key either
/// model mentions.
fn check_recovery(
    ops: &[CrashOp],
    acked: usize,
    store: &FaultStore,
    fs: &MemFs,
    get_stride: usize,
    what: &str,
) {
    let tree = open(Arc::new(store.crash_image()), Arc::new(fs.crash_image()))
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    tree.shared()
        .check_structure()
        .unwrap_or_else(|e| panic!("{what}: structure: {e}"));
    let got: BTreeMap<Vec<u8>, Vec<u8>> = tree
        .iter()
        .collect::<Result<_>>()
        .unwrap_or_else(|e| panic!("{what}: scan failed: {e}"));
    let expected = model(&ops[..acked]);
    let with_inflight = model(&ops[..(acked + 1).min(ops.len())]);
    assert!(
        got == expected || got == with_inflight,
        "{what}: {acked} acknowledged ops (next {:?}), tree has {} keys, model {}; \
         first difference at {:?}",
        ops.get(acked)
            .map(|op| op.key().map(String::from_utf8_lossy)),
        got.len(),
        expected.len(),
        got.iter()
            .zip(expected.iter())
            .find(|(a, b)| a != b)
            .map(|(a, _)| String::from_utf8_lossy(a.0))
    );
    let keys: BTreeSet<&Vec<u8>> = expected.keys().chain(with_inflight.keys()).collect();
    for k in keys.into_iter().step_by(get_stride.max(1)) {
        let value = tree
            .get(k)
            .unwrap_or_else(|e| panic!("{what}: get after reopen: {e}"));
        assert_eq!(value.as_ref(), got.get(k), "{what}: get after reopen");
    }
    // The recovered tree must be usable, not only readable: its free list and log resume.
    let probe = b"\xffafter-recovery";
    tree.insert(probe, b"probe")
        .unwrap_or_else(|e| panic!("{what}: write after reopen: {e}"));
    tree.checkpoint()
        .unwrap_or_else(|e| panic!("{what}: checkpoint after reopen: {e}"));
    assert_eq!(
        tree.get(probe).ok().flatten().as_deref(),
        Some(&b"probe"[..]),
        "{what}: probe after reopen"
    );
}

/// Runs one scenario on fresh disks and checks recovery; panics, naming `what`, on any
/// disagreement with the model.
pub(crate) fn scenario(
    ops: &[CrashOp],
    cut: CrashCut,
    get_stride: usize,
    what: &str,
) -> CrashOutcome {
    let (store, fs) = disks();
    match cut {
        CrashCut::None => {}
        CrashCut::Log { at, torn } => fs.power_cut_at(at, torn),
        CrashCut::Data { at, torn } => store.power_cut_at_write(at, torn),
    }
    let acked = run(ops, &store, &fs, what);
    let outcome = CrashOutcome {
        acked,
        cut_fired: match cut {
            CrashCut::None => false,
            CrashCut::Log { .. } => fs.is_powered_off(),
            CrashCut::Data { .. } => store.is_powered_off(),
        },
        log_calls: fs.ops(),
        data_writes: store.disk_writes(),
    };
    check_recovery(ops, acked, &store, &fs, get_stride, what);
    outcome
}

/// Copies a tree's directory (but its `LOCK`) from `from` to `to`: what a process crash
/// would leave, for a tree that synced what it must.
#[cfg(all(test, not(shuttle)))]
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let (path, name) = (entry.path(), entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &to.join(name));
        } else if name != "LOCK" {
            std::fs::copy(&path, to.join(name)).expect("copy");
        }
    }
}
