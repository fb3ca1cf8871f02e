//! Crash recovery against a model: arbitrary inserts, removes, gets and checkpoints on a
//! tree over emulated disks that lose power at an arbitrary log-file-system call or data-page
//! write; after reopening from what survived, the tree must hold every acknowledged write
//! and equal the model (or the model plus the one operation in flight). The scenario and
//! its checks are `bfkv::internals::crash_recovery_check`.
#![no_main]

use arbitrary::Arbitrary;
use bfkv::internals::{crash_recovery_check, CrashCut, CrashOp};
use libfuzzer_sys::fuzz_target;

/// Operations per input (after expanding fills), so one run stays in the milliseconds.
const MAX_OPS: usize = 800;

/// A key: few distinct ids so operations collide, a little length variation.
#[derive(Arbitrary, Debug)]
struct Key {
    id: u8,
    pad: u8,
}

impl Key {
    fn bytes(&self) -> Vec<u8> {
        let mut k = vec![b'k', self.id % 64];
        k.resize(2 + usize::from(self.pad % 4) * 5, b'.');
        k
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A value of `4 * len` bytes (up to 1020: a few dozen fill the 64 KiB cache).
    Insert {
        key: Key,
        len: u8,
        fill: u8,
    },
    /// `count % 64 + 1` inserts of consecutive ids from `first`, values of `4 * len`
    /// bytes: one op of a short input can fill the cache and force evictions and splits.
    Fill {
        first: u8,
        count: u8,
        len: u8,
    },
    Remove {
        key: Key,
    },
    Get {
        key: Key,
    },
    Checkpoint,
}

#[derive(Arbitrary, Debug)]
enum Cut {
    None,
    /// Reduced modulo a bound that scales with the run, so most cuts land inside it.
    Log {
        at: u16,
        torn: bool,
    },
    Data {
        at: u16,
        torn: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    cut: Cut,
    ops: Vec<Op>,
}

/// A value of `4 * len` bytes that differs with `fill`.
fn value(len: u8, fill: u8) -> Vec<u8> {
    (0..usize::from(len) * 4)
        .map(|i| fill.wrapping_add(i as u8))
        .collect()
}

fuzz_target!(|input: Input| {
    let mut ops: Vec<CrashOp> = Vec::new();
    for op in &input.ops {
        match op {
            Op::Insert { key, len, fill } => {
                ops.push(CrashOp::Insert(key.bytes(), value(*len, *fill)))
            }
            Op::Fill { first, count, len } => {
                for i in 0..=count % 64 {
                    let key = Key {
                        id: first.wrapping_add(i),
                        pad: 0,
                    };
                    ops.push(CrashOp::Insert(key.bytes(), value(*len, i)));
                }
            }
            Op::Remove { key } => ops.push(CrashOp::Remove(key.bytes())),
            Op::Get { key } => ops.push(CrashOp::Get(key.bytes())),
            Op::Checkpoint => ops.push(CrashOp::Checkpoint),
        }
    }
    ops.truncate(MAX_OPS);
    // A synchronous commit is about two log calls (write, sync), plus the open and close;
    // data-page writes come from evictions and checkpoints, fewer than one per operation.
    let n = ops.len() as u64;
    let cut = match input.cut {
        Cut::None => CrashCut::None,
        Cut::Log { at, torn } => CrashCut::Log {
            at: 1 + u64::from(at) % (3 * n + 16),
            torn,
        },
        Cut::Data { at, torn } => CrashCut::Data {
            at: 1 + u64::from(at) % (n + 8),
            torn,
        },
    };
    crash_recovery_check(&ops, cut);
});
