//! Durability benchmarks: `Sync` inserts with 1, 2 and 4 threads (ops/s and log
//! fsyncs per operation), `Buffered` against `None` on YCSB-A, the writers' pause during a
//! checkpoint of a large dirty cache, and recovery time for 1M logged operations.
//!
//! Run: `cargo run --release --example durability -- [sync|ycsb [threads]|pause|recovery|all]`.
//! With `BFKV_ROUNDS=1`, `ycsb` also prints each round's ratio and how many checkpoints have
//! finished by then (a round a checkpoint runs in is slower for `Buffered`); with
//! `BFKV_CHECKPOINT_MB=N`, automatic checkpoints come every N MiB of log instead of the
//! default 128 (24 puts one in most rounds); with `BFKV_RECORDS=N`, `ycsb` loads N records
//! instead of docs/workloads.md's 5,000,000 (the cache is sized to hold them; a set as small
//! as 200,000 makes two writers meet on the same leaves far more often).
//! Files go under `target/bench-data/durability` (or `$BFKV_BENCH_DIR/durability`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use bfkv_workload::{key, value, Distribution, Op, OpGen, Phase, DEFAULT_THETA};

/// Re-executed child for the recovery figure: `recovery-child <dir> <ops>`.
const CHILD_ARG: &str = "recovery-child";

fn bench_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("BFKV_BENCH_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"),
        PathBuf::from,
    );
    let dir = base.join("durability").join(name);
    // A leftover from an earlier run would be recovered instead of created.
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `Sync` inserts of distinct 16-byte keys with 16-byte values from `threads` threads.
fn sync_inserts(threads: u64, ops: u64) {
    let dir = bench_dir(&format!("sync-{threads}"));
    let tree = Tree::open(base(&dir).durability(Durability::Sync)).expect("open");
    let before = tree.stats().log_syncs;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let tree = &tree;
            s.spawn(move || {
                for i in (t..ops).step_by(threads as usize) {
                    tree.insert(key(i), value(i, 0, 16)).expect("insert");
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let syncs = tree.stats().log_syncs - before;
    println!(
        "sync-inserts threads={threads} ops={ops} ops_per_s={:.0} log_syncs={syncs} \
         fsyncs_per_op={:.3}",
        ops as f64 / secs,
        syncs as f64 / ops as f64
    );
    tree.close().expect("close");
}

/// `BFKV_CHECKPOINT_MB`: the log size between automatic checkpoints in mebibytes, instead
/// of the default (smaller puts a checkpoint in most rounds, to measure what one costs).
fn checkpoint_log_bytes() -> Option<u64> {
    let mb = std::env::var("BFKV_CHECKPOINT_MB").ok()?;
    Some(
        mb.parse::<u64>()
            .expect("BFKV_CHECKPOINT_MB: a number of MiB")
            << 20,
    )
}

/// Opens a tree for the YCSB-A comparison with `records` 16-byte records loaded into a cache
/// that holds them all.
fn loaded_tree(durability: Durability, records: u64) -> Tree {
    let dir = bench_dir(&format!("ycsb-{durability:?}"));
    // In memory: room for every record (about 60 bytes each in mini-pages) with space left.
    let cache = (256 << 20).max(records as usize * 128);
    let mut config = base(&dir).cache_size(cache).durability(durability);
    if let Some(bytes) = checkpoint_log_bytes() {
        config = config.checkpoint_log_bytes(bytes);
    }
    let tree = Tree::open(config).expect("open");
    for i in 0..records {
        tree.insert(key(i), value(i, 0, 16)).expect("load");
    }
    tree.flush().expect("flush");
    tree
}

/// CPU time (user + system) this process has used, every thread included.
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given, which is zeroed plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &raw mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs `ops` YCSB-A operations (50 % reads, 50 % updates, Zipf 0.9) from `threads` threads
/// with generator seed `seed`; returns ops/s and the process's CPU nanoseconds per op
/// (background threads included: a loaded machine stretches the first, not the second).
fn ycsb_a_burst(tree: &Tree, records: u64, ops: u64, threads: usize, seed: u64) -> (f64, f64) {
    let per_thread = ops / threads as u64;
    let cpu = process_cpu();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let gen = OpGen::new(
                    Phase::A,
                    records,
                    Distribution::Zipf(DEFAULT_THETA),
                    seed,
                    t,
                    threads,
                    Arc::new(AtomicU64::new(records)),
                )
                .expect("generator");
                let mut buf = [0u8; 16];
                for op in gen.take(per_thread as usize) {
                    match op {
                        Op::Read(r) => {
                            std::hint::black_box(tree.get(key(r)).expect("get"));
                        }
                        Op::Update { record, version } => {
                            bfkv_workload::write_value(&mut buf, record, version);
                            tree.insert(key(record), buf).expect("update");
                        }
                        other => panic!("YCSB-A produced {other:?}"),
                    }
                }
            });
        }
    });
    let done = (per_thread * threads as u64) as f64;
    let cpu = process_cpu().checked_sub(cpu).unwrap().as_nanos() as f64;
    (done / start.elapsed().as_secs_f64(), cpu / done)
}

/// YCSB-A in memory under `None` and `Buffered`, paired: both trees are loaded once, then
/// each round runs the same burst of operations on one and then the other (alternating
/// which goes first), so the machine's drift hits both alike. Prints the median ops/s of
/// each and the median of the per-round ratios.
fn ycsb_a_paired(records: u64, rounds: u64, ops: u64, threads: usize) {
    let none = loaded_tree(Durability::None, records);
    let buffered = loaded_tree(Durability::Buffered, records);
    let before = buffered.stats();
    let per_round = std::env::var_os("BFKV_ROUNDS").is_some();
    let (mut rn, mut rb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cn, mut cb) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let seed = 42 + round;
        let (n, b) = if round % 2 == 0 {
            let n = ycsb_a_burst(&none, records, ops, threads, seed);
            (n, ycsb_a_burst(&buffered, records, ops, threads, seed))
        } else {
            let b = ycsb_a_burst(&buffered, records, ops, threads, seed);
            (ycsb_a_burst(&none, records, ops, threads, seed), b)
        };
        rn.push(n.0);
        rb.push(b.0);
        ratios.push(b.0 / n.0);
        if per_round {
            // The checkpoint count moves when one finishes; the rounds it ran in come before.
            println!(
                "round {round}: buffered/none {:.3}, checkpoints so far {}",
                b.0 / n.0,
                buffered.stats().checkpoints - before.checkpoints
            );
        }
        cn.push(n.1);
        cb.push(b.1);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let after = buffered.stats();
    let syncs = after.log_syncs - before.log_syncs;
    let (cn, cb) = (median(&mut cn), median(&mut cb));
    println!(
        "ycsb-a records={records} threads={threads} rounds={rounds} ops/round={ops}: \
         none {:.0} ops/s, buffered {:.0} ops/s (median), buffered/none per-round median {:.3}; \
         CPU per op none {cn:.0} ns, buffered {cb:.0} ns, none/buffered {:.3} \
         (during the rounds: {syncs} log syncs, {} checkpoints writing {} pages, {} pages read)",
        median(&mut rn),
        median(&mut rb),
        median(&mut ratios),
        cn / cb,
        after.checkpoints - before.checkpoints,
        after.pages_written - before.pages_written,
        after.pages_read - before.pages_read,
    );
    none.close().expect("close");
    buffered.close().expect("close");
}

/// Two writers update records while the main thread checkpoints a cache full of dirty
/// mini-pages; reports the checkpoint's length and the longest single write before and
/// during it.
fn checkpoint_pause(records: u64) {
    let dir = bench_dir("pause");
    let tree = Tree::open(
        base(&dir)
            .cache_size(512 << 20)
            .durability(Durability::Buffered)
            .checkpoint_log_bytes(1 << 40),
    )
    .expect("open");
    for i in 0..records {
        tree.insert(key(i), value(i, 0, 16)).expect("load");
    }
    let dirty_leaves = tree.stats();
    let stop = AtomicBool::new(false);
    let in_checkpoint = AtomicBool::new(false);
    let (mut worst_before, mut worst_during, mut writes_during) = (0u64, 0u64, 0u64);
    let mut ckpt = Duration::ZERO;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..2u64 {
            let (tree, stop, in_checkpoint) = (&tree, &stop, &in_checkpoint);
            handles.push(s.spawn(move || {
                let (mut before, mut during, mut n_during) = (0u64, 0u64, 0u64);
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let r = bfkv_workload::splitmix64(i) % records;
                    let t0 = Instant::now();
                    tree.insert(key(r), value(r, i, 16)).expect("update");
                    let ns = t0.elapsed().as_nanos() as u64;
                    if in_checkpoint.load(Ordering::Relaxed) {
                        during = during.max(ns);
                        n_during += 1;
                    } else {
                        before = before.max(ns);
                    }
                    i += 2;
                }
                (before, during, n_during)
            }));
        }
        std::thread::sleep(Duration::from_millis(500));
        in_checkpoint.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        tree.checkpoint().expect("checkpoint");
        ckpt = t0.elapsed();
        in_checkpoint.store(false, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            let (b, d, n) = h.join().expect("writer");
            worst_before = worst_before.max(b);
            worst_during = worst_during.max(d);
            writes_during += n;
        }
    });
    let after = tree.stats();
    println!(
        "checkpoint-pause records={records} checkpoint_ms={:.1} pages_written={} \
         max_write_us_outside={:.0} max_write_us_during={:.0} writes_during={writes_during}",
        ckpt.as_secs_f64() * 1e3,
        after.pages_written - dirty_leaves.pages_written,
        worst_before as f64 / 1e3,
        worst_during as f64 / 1e3,
    );
    tree.close().expect("close");
}

/// The child of the recovery figure: a checkpointed empty tree, then `ops` logged inserts,
/// flushed, then exit without closing (a crash as far as the log is concerned).
fn recovery_child(dir: &Path, ops: u64) -> ! {
    let tree = Tree::open(recovery_config(dir)).expect("child open");
    for i in 0..ops {
        tree.insert(key(i), value(i, 0, 16)).expect("child insert");
    }
    tree.flush().expect("child flush");
    std::process::exit(0)
}

/// Every case's tree: the default configuration (8 KiB leaf pages) in `dir`.
fn base(dir: &Path) -> Config {
    Config::new(dir)
}

fn recovery_config(dir: &Path) -> Config {
    base(dir)
        .cache_size(256 << 20)
        .durability(Durability::Buffered)
        .checkpoint_log_bytes(1 << 40)
}

/// Opens a directory whose log holds `ops` records after a crash; reports the open time.
fn recovery(ops: u64) {
    let dir = bench_dir("recovery");
    let status = Command::new(std::env::current_exe().expect("exe"))
        .arg(CHILD_ARG)
        .arg(&dir)
        .arg(ops.to_string())
        .status()
        .expect("spawn");
    assert!(status.success(), "child failed: {status}");
    let t0 = Instant::now();
    let tree = Tree::open(recovery_config(&dir)).expect("recover");
    let secs = t0.elapsed().as_secs_f64();
    let replayed = tree.stats().replayed;
    assert_eq!(replayed, ops, "replayed");
    assert_eq!(
        tree.get(key(ops - 1)).expect("get"),
        Some(value(ops - 1, 0, 16))
    );
    println!(
        "recovery ops={ops} replayed={replayed} open_s={secs:.3} records_per_s={:.0}",
        replayed as f64 / secs
    );
    drop(tree);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD_ARG) {
        let ops = args
            .get(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000_000);
        recovery_child(Path::new(&args[1]), ops);
    }
    let what = args.first().map_or("all", String::as_str);
    if matches!(what, "sync" | "all") {
        for threads in [1, 2, 4] {
            sync_inserts(threads, 20_000);
        }
    }
    if matches!(what, "ycsb" | "all") {
        // `durability ycsb 2` runs only the 2-thread comparison (for profiling).
        let threads: Vec<usize> = match args.get(1).and_then(|t| t.parse().ok()) {
            Some(t) => vec![t],
            None => vec![1, 2],
        };
        for threads in threads {
            let records = std::env::var("BFKV_RECORDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(5_000_000);
            ycsb_a_paired(records, 21, 1_000_000, threads);
        }
    }
    if matches!(what, "pause" | "all") {
        checkpoint_pause(2_000_000);
    }
    if matches!(what, "recovery" | "all") {
        recovery(1_000_000);
    }
}
