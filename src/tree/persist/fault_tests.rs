//! Fault sweeps: one I/O call fails (a full disk, a failed `fdatasync`) and the power stays
//! on. The contract (DESIGN.md, "Bad input and faults"): a write that returns an error is
//! not visible and not present after reopen; every write acknowledged stays.
//!
//! A workload runs on a tree whose log lives on a `MemFs` and whose pages live on a
//! `FaultStore`, with a 64 KiB cache and 8 KiB log segments. For every N over the run, the
//! N-th mutating call of the log's file system fails (one sweep per durability), or the
//! N-th page write or flush of the store fails. Every operation's result is checked: a
//! successful `get` must agree with the model of the writes acknowledged so far, a failed
//! write is left out of the model. The tree is dropped, reopened on the same disks (a
//! restart of the process, not of the machine), and must equal that model; under `Sync` it
//! must also after a power cut (the disks' crash images).

use std::collections::BTreeMap;

use super::crash::{disks, open_with, CrashOp, Shape};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::FaultStore;
use crate::sync::Arc;
use crate::tree::Tree;
use crate::wal::memfs::MemFs;
use crate::Durability;

/// Operations per run.
const OPS: u32 = 700;
/// Distinct keys.
const KEYS: u32 = 300;

/// The workload (`crash::workload`): a checkpoint every 150 writes.
fn workload() -> Vec<CrashOp> {
    super::crash::workload(Shape {
        seed: 0x2545_f491_4f6c_dd1d,
        ops: OPS,
        keys: KEYS,
        checkpoint_every: 150,
        inserts_first: 100,
    })
}

fn config(durability: Durability) -> Config {
    Config::new(super::crash::DIR)
        .cache_size(64 << 10)
        .durability(durability)
        .log_segment_size(8 << 10)
        .evictor_threads(0)
        .idle_write_back(None)
}

/// Which call fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The N-th mutating call of the log's file system.
    Log(u64),
    /// The N-th page write of the store.
    PageWrite(u64),
    /// The N-th flush of the store.
    PageSync(u64),
}

/// What one run left: the model of every acknowledged write, the model as of the last
/// successful checkpoint (what `None` keeps), and whether anything failed.
struct Outcome {
    acked: BTreeMap<Vec<u8>, Vec<u8>>,
    checkpointed: BTreeMap<Vec<u8>, Vec<u8>>,
    failures: usize,
}

/// Runs the workload with `fault` armed, checking each result, and closes the tree.
fn run(durability: Durability, fault: Fault, store: &Arc<FaultStore>, fs: &Arc<MemFs>) -> Outcome {
    match fault {
        Fault::Log(n) => fs.fail_at(n),
        Fault::PageWrite(n) => store.fail_nth_write(n),
        Fault::PageSync(n) => store.fail_nth_sync(n),
    }
    let mut out = Outcome {
        acked: BTreeMap::new(),
        checkpointed: BTreeMap::new(),
        failures: 0,
    };
    let what = format!("{durability:?} {fault:?}");
    let tree = match open_with(config(durability), store.clone(), fs.clone()) {
        Ok(tree) => tree,
        Err(e) => {
            assert!(matches!(e, Error::Io { .. }), "{what}: open: {e}");
            out.failures += 1;
            return out;
        }
    };
    for (i, op) in workload().into_iter().enumerate() {
        let res = match &op {
            CrashOp::Insert(k, v) => tree.insert(k, v),
            CrashOp::Remove(k) => tree.remove(k),
            CrashOp::Checkpoint => tree.checkpoint(),
            CrashOp::Get(k) => tree.get(k).map(|got| {
                assert_eq!(got.as_ref(), out.acked.get(k), "{what}: get at op {i}");
            }),
        };
        match res {
            Ok(()) => {
                op.apply(&mut out.acked);
                if op == CrashOp::Checkpoint {
                    out.checkpointed = out.acked.clone();
                }
            }
            Err(e) => {
                assert!(matches!(e, Error::Io { .. }), "{what}: op {i}: {e}");
                out.failures += 1;
            }
        }
    }
    if tree.close().is_ok() {
        out.checkpointed = out.acked.clone();
    }
    out
}

/// Opens the tree on `store` and `fs` and returns every record.
fn contents(
    durability: Durability,
    store: Arc<FaultStore>,
    fs: Arc<MemFs>,
    what: &str,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let tree: Tree = open_with(config(durability), store, fs)
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    tree.shared()
        .check_structure()
        .unwrap_or_else(|e| panic!("{what}: structure: {e}"));
    tree.iter()
        .collect::<Result<_>>()
        .unwrap_or_else(|e| panic!("{what}: scan after reopen: {e}"))
}

/// Asserts `got == want`, naming the first key that differs.
fn assert_same(got: &BTreeMap<Vec<u8>, Vec<u8>>, want: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    if got == want {
        return;
    }
    let diff = want
        .keys()
        .chain(got.keys())
        .find(|k| got.get(*k) != want.get(*k))
        .map(|k| String::from_utf8_lossy(k).into_owned());
    panic!(
        "{what}: {} keys after reopen, {} expected; first difference at {diff:?}: got {:?}, want {:?}",
        got.len(),
        want.len(),
        diff.as_ref().and_then(|k| got.get(k.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned()),
        diff.as_ref().and_then(|k| want.get(k.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned()),
    );
}

/// One run with `fault`, then the reopen checks; returns how many operations failed.
fn check(durability: Durability, fault: Fault) -> usize {
    let (store, fs) = disks();
    let out = run(durability, fault, &store, &fs);
    let what = format!("{durability:?} {fault:?}");
    let want = match durability {
        Durability::None => &out.checkpointed,
        _ => &out.acked,
    };
    if durability == Durability::Sync {
        let got = contents(
            durability,
            Arc::new(store.crash_image()),
            Arc::new(fs.crash_image()),
            &what,
        );
        assert_same(&got, want, &format!("{what}, after a power cut"));
    }
    let got = contents(durability, store, fs, &what);
    assert_same(&got, want, &format!("{what}, after a restart"));
    out.failures
}

/// How many calls of each kind a clean run makes.
fn calls(durability: Durability) -> (u64, u64, u64) {
    let (store, fs) = disks();
    let out = run(durability, Fault::Log(u64::MAX / 2), &store, &fs);
    assert_eq!(out.failures, 0, "{durability:?}: a clean run failed");
    (fs.ops(), store.disk_writes(), store.disk_syncs())
}

/// Sweeps `fault` over every call from 1 to `total`; checks that the failures hit.
fn sweep(durability: Durability, total: u64, fault: impl Fn(u64) -> Fault) {
    let mut failed_runs = 0;
    for n in 1..=total {
        if check(durability, fault(n)) > 0 {
            failed_runs += 1;
        }
    }
    assert!(
        failed_runs * 2 > total,
        "{durability:?}: only {failed_runs} of {total} runs saw the fault"
    );
}

#[test]
fn a_log_fault_under_sync_leaves_no_trace_of_the_failed_write() {
    let (log_calls, _, _) = calls(Durability::Sync);
    sweep(Durability::Sync, log_calls, Fault::Log);
}

#[test]
fn a_log_fault_under_buffered_leaves_no_trace_of_the_failed_write() {
    let (log_calls, _, _) = calls(Durability::Buffered);
    sweep(Durability::Buffered, log_calls, Fault::Log);
}

#[test]
fn a_page_fault_leaves_no_trace_of_the_failed_write_in_every_mode() {
    for durability in [Durability::Sync, Durability::Buffered, Durability::None] {
        let (_, writes, syncs) = calls(durability);
        sweep(durability, writes, Fault::PageWrite);
        sweep(durability, syncs, Fault::PageSync);
    }
}
