//! The engine-independent part of a benchmark run: the [`Engine`] trait every storage engine
//! under test implements, and the multi-threaded runner that drives one with the
//! `WORKLOADS.md` operations, checking every value it reads. Shared by the criterion bench,
//! the `vs_bftree` example and the peer comparison (`bench/peers`), so all of them measure
//! exactly the same thing; the engine adapters live with their users (they need the
//! engines as dependencies, which this crate does not have).

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{decode_value, key, write_value, Distribution, Op, OpGen, Phase, VALUE_LEN};

/// Any failure of a benchmark run.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// What a benchmark needs from a storage engine.
pub trait Engine: Sync {
    /// Short name for tables.
    fn name(&self) -> &'static str;
    /// Copies `key`'s value into `out`; false if absent.
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError>;
    /// Inserts or overwrites `key`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError>;
    /// Reads up to `len` records from `start` on, checking each value's format; returns the
    /// number read.
    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError>;
    /// Leaf pages read and written so far, if the engine counts them.
    fn leaf_io(&self) -> Option<(u64, u64)>;
}

/// Bytes this process has read from and written to storage (`/proc/self/io` `read_bytes`,
/// `write_bytes`; direct I/O included), if the kernel reports them.
pub fn proc_io() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("read_bytes:")?, field("write_bytes:")?))
}

/// The operations a run issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A phase of `WORKLOADS.md`.
    Phase(Phase),
    /// Inserts of new records N, N+1, ... (random key order), as in a load.
    Insert,
    /// Overwrites of existing records chosen like phase C's reads.
    Update,
}

impl Workload {
    /// Name for tables and benchmark ids.
    pub fn name(self) -> String {
        match self {
            Workload::Phase(Phase::Load) => "load".into(),
            Workload::Phase(p) => format!("ycsb-{}", p.letter().to_ascii_lowercase()),
            Workload::Insert => "insert".into(),
            Workload::Update => "update".into(),
        }
    }
}

/// When a run ends: at whichever limit comes first (a load also ends with its range).
#[derive(Debug, Clone, Copy)]
pub struct Stop {
    /// Operations in total, split evenly over the threads.
    pub ops: u64,
    /// Wall time.
    pub time: Option<Duration>,
}

/// What a run measured.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Operations completed.
    pub ops: u64,
    /// Wall time, start to the last thread's end.
    pub elapsed: Duration,
    /// Leaf pages read and written during the run, if the engine counts them.
    pub leaf_io: Option<(u64, u64)>,
    /// Bytes read and written by the process during the run (`/proc/self/io`).
    pub proc_io: Option<(u64, u64)>,
}

impl Outcome {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// 4 KiB units read and written per operation, from `/proc/self/io`.
    pub fn proc_pages_per_op(&self) -> Option<(f64, f64)> {
        let (r, w) = self.proc_io?;
        let per = |b: u64| b as f64 / 4096.0 / self.ops.max(1) as f64;
        Some((per(r), per(w)))
    }

    /// Leaf pages read and written per operation, from the engine's own counters.
    pub fn leaf_pages_per_op(&self) -> Option<(f64, f64)> {
        let (r, w) = self.leaf_io?;
        let per = |n: u64| n as f64 / self.ops.max(1) as f64;
        Some((per(r), per(w)))
    }
}

/// A run's fixed parameters.
#[derive(Debug, Clone, Copy)]
pub struct RunSpec {
    /// Records loaded (or to load): reads choose among `0..records`.
    pub records: u64,
    /// Worker threads.
    pub threads: usize,
    /// Record choice.
    pub dist: Distribution,
    /// Seed of the operation streams.
    pub seed: u64,
    /// Bytes in every value written (at least 16: [`VALUE_LEN`], or
    /// [`VALUE_LEN_LARGE`](crate::VALUE_LEN_LARGE) for the large-value variant); reads
    /// check it.
    pub value_len: usize,
}

/// `after - before` for a pair of counters.
fn delta(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<(u64, u64)> {
    let (b, a) = (before?, after?);
    Some((a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)))
}

/// What every worker thread of one [`run`] shares.
struct Shared<'a> {
    /// The engine under test.
    engine: &'a dyn Engine,
    /// The operations.
    work: Workload,
    /// Operations per thread at most.
    budget: u64,
    /// When to stop, if time-bounded.
    deadline: Option<Instant>,
    /// Next new record number.
    next_insert: &'a Arc<AtomicU64>,
    /// Bytes in every value.
    value_len: usize,
    /// Set by a failing thread so the others stop early.
    failed: AtomicBool,
}

/// Runs `work` on `engine` with `spec.threads` threads until `stop`. `next_insert` is the
/// next new record number (starts at the record count; advanced by inserts).
pub fn run(
    engine: &dyn Engine,
    work: Workload,
    spec: RunSpec,
    stop: Stop,
    next_insert: &Arc<AtomicU64>,
) -> Result<Outcome, BoxError> {
    let threads = spec.threads.max(1);
    // Generators are built before the clock starts: short criterion iterations must not
    // time their setup.
    let gens = (0..threads)
        .map(|t| {
            let phase = match work {
                Workload::Phase(p) => p,
                // Only the record choice is used (and not at all by Insert).
                Workload::Insert | Workload::Update => Phase::C,
            };
            OpGen::new(
                phase,
                spec.records,
                spec.dist,
                spec.seed,
                t,
                threads,
                next_insert.clone(),
            )
            .ok_or("no records, or a Zipf θ outside (0, 1)")
        })
        .collect::<Result<Vec<OpGen>, _>>()?;
    let (io0, proc0) = (engine.leaf_io(), proc_io());
    let start = Instant::now();
    let budget = stop.ops.div_ceil(threads as u64);
    let deadline = stop.time.map(|d| start + d);
    let shared = Shared {
        engine,
        work,
        budget,
        deadline,
        next_insert,
        value_len: spec.value_len.max(VALUE_LEN),
        failed: AtomicBool::new(false),
    };
    let results: Vec<Result<(u64, Instant), BoxError>> = std::thread::scope(|s| {
        let handles: Vec<_> = gens
            .into_iter()
            .map(|gen| {
                let shared = &shared;
                s.spawn(move || {
                    let r = worker(shared, gen);
                    if r.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let mut ops = 0;
    let mut end = start;
    for r in results {
        let (n, t) = r?;
        ops += n;
        end = end.max(t);
    }
    Ok(Outcome {
        ops,
        elapsed: end - start,
        leaf_io: delta(io0, engine.leaf_io()),
        proc_io: delta(proc0, proc_io()),
    })
}

/// One thread of [`run`], drawing from `gen`: returns its operation count and end time.
fn worker(sh: &Shared<'_>, gen: OpGen) -> Result<(u64, Instant), BoxError> {
    let mut version = 0u64;
    let ops = gen.map(|op| match (sh.work, op) {
        (Workload::Insert, _) => Op::Insert(sh.next_insert.fetch_add(1, Ordering::Relaxed)),
        (Workload::Update, Op::Read(record)) => {
            version += 1;
            Op::Update { record, version }
        }
        (_, op) => op,
    });
    let mut value = vec![0u8; sh.value_len];
    let mut out = Vec::with_capacity(4096);
    let mut count = 0u64;
    for op in ops.take(sh.budget.min(usize::MAX as u64) as usize) {
        execute(sh.engine, op, &mut value, &mut out)?;
        count += 1;
        if count % 256 == 0
            && (sh.failed.load(Ordering::Relaxed)
                || sh.deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
    }
    Ok((count, Instant::now()))
}

/// Executes one operation, checking every value read against its record.
fn execute(
    engine: &dyn Engine,
    op: Op,
    value: &mut [u8],
    out: &mut Vec<u8>,
) -> Result<(), BoxError> {
    let value_len = value.len();
    let read = |i: u64, out: &mut Vec<u8>| -> Result<u64, BoxError> {
        if !engine.get(&key(i), out)? {
            return Err(format!("{}: record {i} is missing", engine.name()).into());
        }
        match decode_value(out) {
            Some((r, version)) if r == i && out.len() == value_len => Ok(version),
            _ => Err(format!("{}: record {i} has a wrong value", engine.name()).into()),
        }
    };
    match op {
        Op::Read(i) => {
            read(i, out)?;
        }
        Op::Update { record, version } => {
            write_value(value, record, version);
            engine.put(&key(record), value)?;
        }
        Op::Insert(i) => {
            write_value(value, i, 0);
            engine.put(&key(i), value)?;
        }
        Op::Scan { start, len } => {
            if engine.scan(&key(start), len)? == 0 {
                return Err(format!("{}: empty scan from record {start}", engine.name()).into());
            }
        }
        Op::ReadModifyWrite(i) => {
            let version = read(i, out)?;
            write_value(value, i, version + 1);
            engine.put(&key(i), value)?;
        }
    }
    Ok(())
}
