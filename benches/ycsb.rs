//! bfkv vs Microsoft's `bf-tree` 0.5.7 on the `docs/workloads.md` operations (16-byte keys and
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
//! Each dataset is loaded once per engine and group (the load's own rate is printed); each
//! timed call draws operations of its own (a new seed), not a replay of the last call's.
//! `cargo bench --bench ycsb`; `BFKV_BENCH_BIG=1 cargo bench --bench ycsb -- big` for the
//! large group alone. `examples/vs_bftree.rs` gives the same comparison as one table with
//! one process per engine.

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::cell::RefCell;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bfkv::Durability;
use bfkv_workload::engines::{Bfkv, MsBfTree};
use bfkv_workload::report::{accumulate, env_count, or_exit, report};
use bfkv_workload::runner::{self, BoxError, Engine, Outcome, RunSpec, Stop, Workload};
use bfkv_workload::Phase;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Opens engine `name` in a fresh directory with `cache` bytes of cache.
fn open(name: &str, dir: &std::path::Path, cache: usize) -> Result<Box<dyn Engine>, BoxError> {
    Ok(match name {
        "bfkv" => Box::new(Bfkv::open(dir, cache, Durability::None, None, None)?),
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
        // Each timed call draws a seed of its own, so that a sample does not replay the keys
        // the samples before it just brought into the cache.
        let calls = std::cell::Cell::new(0u64);
        let spec = |threads| RunSpec {
            seed: 42 + calls.replace(calls.get() + 1),
            ..RunSpec::new(records, threads)
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
                    });
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
