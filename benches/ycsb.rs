//! bfkv vs Microsoft's `bf-tree` 0.5.7 on the `WORKLOADS.md` operations (16-byte keys and
//! values, Zipf 0.9), same records, same cache size, both file-backed on direct I/O.
//!
//! - `fit`: the data fits in the cache (2M records, 512 MiB cache; `BFKV_BENCH_FIT_N` sets
//!   the record count): get (YCSB-C), insert of new records, Zipf update; 1 and 2 threads;
//!   bf-tree both file-backed and in its cache-only mode.
//! - `big` (opt-in, `BFKV_BENCH_BIG=1`; `BFKV_BENCH_BIG_N` sets the count): 5M records in a
//!   32 MiB cache: YCSB-C, YCSB-A and inserts on the loaded tree; 1 and 2 threads. Disk
//!   traffic per operation is printed after each benchmark (bfkv: leaf pages from its
//!   counters; both: 4 KiB units from `/proc/self/io`).
//!
//! Each dataset is loaded once per engine and group (the load's own rate is printed).
//! `cargo bench --bench ycsb`; `BFKV_BENCH_BIG=1 cargo bench --bench ycsb -- big` for the
//! large group alone. `examples/vs_bftree.rs` gives the same comparison as one table with
//! one process per engine.

#[path = "ycsb/engines.rs"]
mod engines;

use std::cell::RefCell;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bfkv::Durability;
use bfkv_workload::runner::{self, BoxError, Engine, Outcome, RunSpec, Stop, Workload};
use bfkv_workload::{Distribution, Phase, DEFAULT_THETA};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engines::{Bfkv, MsBfTree};

/// Leaves the process with `e`: a failed engine operation invalidates the whole run, and
/// criterion's timing closures cannot return errors.
fn or_exit<T>(r: Result<T, BoxError>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("ycsb bench: {e}");
        std::process::exit(1)
    })
}

/// A record count from the environment, or `default`.
fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Opens engine `name` in a fresh directory with `cache` bytes of cache.
fn open(name: &str, dir: &std::path::Path, cache: usize) -> Result<Box<dyn Engine>, BoxError> {
    Ok(match name {
        "bfkv" => Box::new(Bfkv::open(dir, cache, Durability::None, None)?),
        "bf-tree-cache-only" => Box::new(MsBfTree::open_cache_only(cache)?),
        _ => Box::new(MsBfTree::open(dir, cache)?),
    })
}

/// Benchmarks `work` at 1 and 2 threads for every engine in `group_name`, each engine
/// loaded once with `records` records into a `cache`-byte cache.
fn compare(
    c: &mut Criterion,
    group_name: &str,
    (records, cache): (u64, usize),
    engines: &[&str],
    work: &[Workload],
) {
    let mut group = c.benchmark_group(group_name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for &name in engines {
        let dir = or_exit(tempfile::tempdir().map_err(Into::into));
        let engine = or_exit(open(name, dir.path(), cache));
        let next_insert = Arc::new(AtomicU64::new(records));
        let spec = |threads| RunSpec {
            records,
            threads,
            dist: Distribution::Zipf(DEFAULT_THETA),
            seed: 42,
        };
        let load = Workload::Phase(Phase::Load);
        let out = or_exit(runner::run(
            engine.as_ref(),
            load,
            spec(2),
            Stop {
                ops: u64::MAX,
                time: None,
            },
            &next_insert,
        ));
        report(group_name, name, "load (2 threads, once)", &out);
        for &w in work {
            for threads in [1, 2] {
                let total = RefCell::new(None::<Outcome>);
                let id = BenchmarkId::new(format!("{name}/{}", w.name()), format!("{threads}t"));
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let stop = Stop {
                            ops: iters,
                            time: None,
                        };
                        let out = or_exit(runner::run(
                            engine.as_ref(),
                            w,
                            spec(threads),
                            stop,
                            &next_insert,
                        ));
                        accumulate(&mut total.borrow_mut(), &out);
                        out.elapsed
                    })
                });
                if let Some(out) = total.into_inner() {
                    let label = format!("{} {threads}t (all iterations)", w.name());
                    report(group_name, name, &label, &out);
                }
            }
        }
    }
    group.finish();
}

/// Adds `out` to the running total `sum`.
fn accumulate(sum: &mut Option<Outcome>, out: &Outcome) {
    let add = |a: Option<(u64, u64)>, b: Option<(u64, u64)>| Some((a?.0 + b?.0, a?.1 + b?.1));
    *sum = Some(match sum.take() {
        None => *out,
        Some(s) => Outcome {
            ops: s.ops + out.ops,
            elapsed: s.elapsed + out.elapsed,
            leaf_io: add(s.leaf_io, out.leaf_io),
            proc_io: add(s.proc_io, out.proc_io),
        },
    });
}

/// Prints throughput and disk traffic per operation of `out`.
fn report(group: &str, engine: &str, what: &str, out: &Outcome) {
    let fmt =
        |v: Option<(f64, f64)>| v.map_or("-".to_string(), |(r, w)| format!("{r:.3} r / {w:.3} w"));
    eprintln!(
        "[{group}] {engine} {what}: {:.0} ops/s; disk per op: proc {} (4 KiB); leaf pages {}",
        out.ops_per_sec(),
        fmt(out.proc_pages_per_op()),
        fmt(out.leaf_pages_per_op()),
    );
}

/// Data that fits in the cache.
fn fit(c: &mut Criterion) {
    let records = env_count("BFKV_BENCH_FIT_N", 2_000_000);
    let work = [
        Workload::Phase(Phase::C),
        Workload::Update,
        Workload::Insert,
    ];
    // bf-tree's file-backed mode keeps reading leaf pages from disk even when they would
    // fit (it caches records, not pages), so its cache-only mode is measured too.
    let engines = ["bfkv", "bf-tree", "bf-tree-cache-only"];
    compare(c, "fit", (records, 512 << 20), &engines, &work);
}

/// Data 5-10x the cache (opt-in: minutes of loading and disk traffic).
fn big(c: &mut Criterion) {
    if std::env::var_os("BFKV_BENCH_BIG").is_none() {
        eprintln!("ycsb bench: group `big` skipped; set BFKV_BENCH_BIG=1 to run it");
        return;
    }
    let records = env_count("BFKV_BENCH_BIG_N", 5_000_000);
    let work = [
        Workload::Phase(Phase::C),
        Workload::Phase(Phase::A),
        Workload::Insert,
    ];
    compare(c, "big", (records, 32 << 20), &["bfkv", "bf-tree"], &work);
}

criterion_group!(benches, fit, big);
criterion_main!(benches);
