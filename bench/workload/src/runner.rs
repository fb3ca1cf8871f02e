//! The engine-independent part of a benchmark run: the [`Engine`] trait every storage engine
//! under test implements, and the multi-threaded runner that drives one with the operations
//! of `docs/workloads.md`, checking every value it reads. The `ycsb` and `vs_bftree`
//! examples, the criterion benches and the peer comparison (`bench/peers`) all run through
//! it, so they measure exactly the same thing.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::{decode_value, key, write_value, Distribution, Op, OpGen, Phase, KEY_LEN, VALUE_LEN};

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

/// Per-operation latency percentiles of a run, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
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
    /// Latency percentiles, if the run timed every operation ([`RunSpec::timed`]).
    pub latency: Option<Latency>,
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
    /// Bytes in every key: record `i`'s 16-byte key ([`KEY_LEN`]) cut or padded with zeros
    /// (its first 8 bytes already tell records apart, so at least 8).
    pub key_len: usize,
    /// Time every operation for [`Outcome::latency`] (two clock reads per operation).
    pub timed: bool,
}

impl RunSpec {
    /// A run over `records` records with `threads` threads: 16-byte keys and values, Zipf
    /// 0.9, seed 42, operations not timed one by one.
    pub fn new(records: u64, threads: usize) -> RunSpec {
        RunSpec {
            records,
            threads,
            dist: Distribution::Zipf(crate::DEFAULT_THETA),
            seed: 42,
            value_len: VALUE_LEN,
            key_len: KEY_LEN,
            timed: false,
        }
    }
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
    /// Bytes in every key.
    key_len: usize,
    /// Whether to time every operation.
    timed: bool,
    /// Operations done so far, published every [`PUBLISH_EVERY`] operations per thread.
    progress: &'a AtomicU64,
    /// Set by a failing thread so the others stop early.
    failed: AtomicBool,
}

/// How many operations a worker does between looks at the clock, the failure flag and the
/// progress counter (one shared counter written per operation would be a hot line).
const PUBLISH_EVERY: u64 = 256;

/// What one worker thread did: its operation count, its end and its latencies.
type WorkerResult = Result<(u64, Instant, Option<Histogram<u64>>), BoxError>;

/// Runs `work` on `engine` with `spec.threads` threads until `stop`. `next_insert` is the
/// next new record number (starts at the record count; advanced by inserts).
///
/// # Errors
/// The first engine error, a missing or wrong value read back, or a spec with no records.
pub fn run(
    engine: &dyn Engine,
    work: Workload,
    spec: RunSpec,
    stop: Stop,
    next_insert: &Arc<AtomicU64>,
) -> Result<Outcome, BoxError> {
    run_with_progress(engine, work, spec, stop, next_insert, &AtomicU64::new(0))
}

/// [`run`], adding the operations done to `progress` as they go (for a progress bar).
///
/// # Errors
/// As [`run`].
pub fn run_with_progress(
    engine: &dyn Engine,
    work: Workload,
    spec: RunSpec,
    stop: Stop,
    next_insert: &Arc<AtomicU64>,
    progress: &AtomicU64,
) -> Result<Outcome, BoxError> {
    if spec.key_len < 8 || spec.value_len < VALUE_LEN {
        return Err("keys need at least 8 bytes and values at least 16".into());
    }
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
        value_len: spec.value_len,
        key_len: spec.key_len,
        timed: spec.timed,
        progress,
        failed: AtomicBool::new(false),
    };
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
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
    let mut latency: Option<Histogram<u64>> = None;
    for r in results {
        let (n, t, hist) = r?;
        ops += n;
        end = end.max(t);
        match (&mut latency, hist) {
            (Some(all), Some(h)) => all.add(h)?,
            (None, h) => latency = h,
            (Some(_), None) => {}
        }
    }
    Ok(Outcome {
        ops,
        elapsed: end - start,
        leaf_io: delta(io0, engine.leaf_io()),
        proc_io: delta(proc0, proc_io()),
        latency: latency.map(|h| Latency {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
        }),
    })
}

/// One thread of [`run`], drawing from `gen`: returns its operation count, end time and (if
/// timed) its latencies.
fn worker(sh: &Shared<'_>, gen: OpGen) -> WorkerResult {
    let mut version = 0u64;
    let ops = gen.map(|op| match (sh.work, op) {
        (Workload::Insert, _) => Op::Insert(sh.next_insert.fetch_add(1, Ordering::Relaxed)),
        (Workload::Update, Op::Read(record)) => {
            version += 1;
            Op::Update { record, version }
        }
        (_, op) => op,
    });
    let mut bufs = Buffers {
        key: vec![0u8; sh.key_len],
        value: vec![0u8; sh.value_len],
        out: Vec::with_capacity(4096),
    };
    // Up to a minute, three significant digits.
    let mut hist = if sh.timed {
        Some(Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?)
    } else {
        None
    };
    let mut count = 0u64;
    for op in ops.take(sh.budget.min(usize::MAX as u64) as usize) {
        let t0 = hist.as_ref().map(|_| Instant::now());
        execute(sh.engine, op, &mut bufs)?;
        if let (Some(h), Some(t0)) = (&mut hist, t0) {
            h.saturating_record(t0.elapsed().as_nanos() as u64);
        }
        count += 1;
        if count % PUBLISH_EVERY == 0 {
            sh.progress.fetch_add(PUBLISH_EVERY, Ordering::Relaxed);
            if sh.failed.load(Ordering::Relaxed) || sh.deadline.is_some_and(|d| Instant::now() >= d)
            {
                break;
            }
        }
    }
    sh.progress
        .fetch_add(count % PUBLISH_EVERY, Ordering::Relaxed);
    Ok((count, Instant::now(), hist))
}

/// A worker's reusable buffers.
struct Buffers {
    /// The key of the current operation.
    key: Vec<u8>,
    /// The value it writes.
    value: Vec<u8>,
    /// The value it read.
    out: Vec<u8>,
}

/// Record `i`'s key at the length of `buf`.
fn key_into(buf: &mut [u8], i: u64) -> &[u8] {
    let k = key(i);
    let n = buf.len().min(k.len());
    buf[..n].copy_from_slice(&k[..n]);
    buf[n..].fill(0);
    buf
}

/// Executes one operation, checking every value read against its record.
fn execute(engine: &dyn Engine, op: Op, b: &mut Buffers) -> Result<(), BoxError> {
    let value_len = b.value.len();
    let read = |key: &[u8], i: u64, out: &mut Vec<u8>| -> Result<u64, BoxError> {
        if !engine.get(key, out)? {
            return Err(format!("{}: record {i} is missing", engine.name()).into());
        }
        match decode_value(out) {
            Some((r, version)) if r == i && out.len() == value_len => Ok(version),
            _ => Err(format!("{}: record {i} has a wrong value", engine.name()).into()),
        }
    };
    match op {
        Op::Read(i) => {
            read(key_into(&mut b.key, i), i, &mut b.out)?;
        }
        Op::Update { record, version } => {
            write_value(&mut b.value, record, version);
            engine.put(key_into(&mut b.key, record), &b.value)?;
        }
        Op::Insert(i) => {
            write_value(&mut b.value, i, 0);
            engine.put(key_into(&mut b.key, i), &b.value)?;
        }
        Op::Scan { start, len } => {
            if engine.scan(key_into(&mut b.key, start), len)? == 0 {
                return Err(format!("{}: empty scan from record {start}", engine.name()).into());
            }
        }
        Op::ReadModifyWrite(i) => {
            let version = read(key_into(&mut b.key, i), i, &mut b.out)?;
            write_value(&mut b.value, i, version + 1);
            engine.put(key_into(&mut b.key, i), &b.value)?;
        }
    }
    Ok(())
}
