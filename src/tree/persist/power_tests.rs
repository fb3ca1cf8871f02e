//! Power-cut sweeps under `Durability::Sync`: a workload of a few thousand inserts and
//! removes on a tree whose data pages live on a `FaultStore` and whose log and checkpoint
//! live on a `MemFs` (both emulated disks with volatile caches, powered off together), with
//! a 64 KiB cache (evictions write leaves) and a checkpoint every 400 operations. Power is
//! cut at the N-th mutating call of the log's file system (one sweep) or at the N-th
//! data-page write (another), for every N over the whole run, torn writes on odd N. After
//! each cut the tree is reopened from the two crash images; it must equal a `BTreeMap` replay
//! of every acknowledged operation, plus possibly the one in flight, and pass its structure
//! check. The scenario itself (run, reopen, compare) is `crash.rs`, shared with the fuzz
//! target `crash_recovery`.

use super::crash::{self, scenario, CrashCut, CrashOp, Shape};

/// Operations per run.
const OPS: u32 = 2400;
/// Distinct keys.
const KEYS: u32 = 1500;
/// Operations between explicit checkpoints.
const CHECKPOINT_EVERY: u32 = 400;
/// Point lookups after a reopen check every this many keys (the scan checks them all).
const GET_STRIDE: usize = 17;

/// The fixed workload (`crash::workload`).
fn workload() -> Vec<CrashOp> {
    crash::workload(Shape {
        seed: 0x9e37_79b9_7f4a_7c15,
        ops: OPS,
        keys: KEYS,
        checkpoint_every: CHECKPOINT_EVERY,
        inserts_first: 300,
    })
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
    let full = scenario(&ops, CrashCut::None, GET_STRIDE, "no cut");
    assert_eq!(full.acked, ops.len());
    let total = full.log_calls;
    let mut runs = 0;
    for n in cuts(total) {
        let what = format!("log cut at call {n}");
        let cut = CrashCut::Log {
            at: n,
            torn: n % 2 == 1,
        };
        let r = scenario(&ops, cut, GET_STRIDE, &what);
        assert_eq!(r.cut_fired, n <= total, "{what} did not happen");
        runs += 1;
    }
    eprintln!("log sweep: {runs} cuts over {total} file-system calls");
}

#[test]
fn power_cut_at_every_data_write_loses_nothing_acknowledged() {
    let ops = workload();
    let total = scenario(&ops, CrashCut::None, GET_STRIDE, "no cut").data_writes;
    assert!(total > 50, "only {total} data-page writes");
    let (mut runs, mut fired) = (0, 0);
    for n in cuts(total) {
        let what = format!("data cut at write {n}");
        let cut = CrashCut::Data {
            at: n,
            torn: n % 2 == 1,
        };
        // The close at the end writes a varying number of pages: the last few N may not
        // be reached.
        fired += u64::from(scenario(&ops, cut, GET_STRIDE, &what).cut_fired);
        runs += 1;
    }
    eprintln!("data sweep: {runs} cuts over {total} page writes, {fired} fired");
    assert!(
        fired * 10 >= runs * 9,
        "only {fired} of {runs} cuts happened"
    );
}
