//! The YCSB suite on bfkv: load and workloads A, B, C, E and F as
//! `docs/workloads.md` defines them, with uniform and Zipf 0.9 key choice, at 1 and 2 threads,
//! in four criterion groups (results and their spread: `docs/benchmarks.md`, "Criterion YCSB
//! suite"):
//!
//! - `mem/v16`, `mem/v100`: `Config::in_memory()` (no files, nothing can be evicted), with a
//!   cache of 8x the raw record bytes (at least 256 MiB) so the suite's inserts never fill it.
//! - `disk10x/v16`, `disk10x/v100`: file-backed on `io_uring` with `O_DIRECT`, no log
//!   (`Durability::None`), cache = raw record bytes / 10 (1M 16-byte records: 3.2 MB; on
//!   disk the leaves take ~1.6x the raw bytes, so ~16x the cache). Disk reads and writes per
//!   operation (leaf pages, from `Tree::stats()` deltas, and 4 KiB units from
//!   `/proc/self/io`) are printed after each benchmark.
//!
//! Records: 1,000,000 per dataset (`BFKV_BENCH_N`), 16-byte keys, 16-byte values (`v16`) or
//! 100-byte values (`v100`), the default 8 KiB leaf pages. Everything else is the shared
//! runner of `bench/workload`, the one `benches/ycsb.rs` and the examples use: every value
//! read is checked.
//!
//! **Load** (`load/1t`, `load/2t`; disk groups only the first of `BFKV_BENCH_THREADS`, as a
//! disk load takes seconds; throughput in records per second): one criterion iteration
//! is a whole load of N records into a fresh, empty tree (opened outside the timing), with
//! flat sampling, 10 samples of one iteration each. A fresh tree per iteration is the only
//! way to time what a load is, inserting into a tree that starts empty and grows past the
//! cache; a loop of inserts into one tree would time inserts into an ever larger tree. The
//! price is 11 loads per benchmark (criterion's minimum of 10 samples plus one warm-up), and
//! criterion's warning that 10 samples did not fit its target time (one iteration per sample
//! is intended). The last tree loaded is the group's dataset for the workloads.
//!
//! **Workloads** (`{uniform,zipf}/ycsb-{c,b,a,f,e}/{1,2}t`, operations per second): one
//! iteration is one operation on the loaded tree, timed by `iter_custom` over the runner
//! (thread start included, generator setup not); 10 samples, 0.5 s warm-up, 2 s measurement.
//! Each call draws a fresh seed so samples do not replay each other's keys. The order, C, B,
//! A, F, E, puts the writes after the pure reads; E's inserts add new records N, N+1, ...
//! to the dataset.
//!
//! ```sh
//! cargo bench --bench workloads                     # everything, about 8 min on 2 cores
//! cargo bench --bench workloads -- 'mem/v16/'       # one group (criterion's filter)
//! BFKV_BENCH_N=5000000 BFKV_BENCH_SECS=5 cargo bench --bench workloads
//! ```
//!
//! Environment: `BFKV_BENCH_N` records per dataset; `BFKV_BENCH_SECS` measurement seconds
//! per workload benchmark (default 2); `BFKV_BENCH_THREADS` thread counts (default `1,2`);
//! `BFKV_BENCH_DIR` parent directory of the disk groups' files (default: the system
//! temporary directory; it must support `O_DIRECT`, so not tmpfs). A dataset is loaded only
//! when one of its group's benchmarks runs, so a filter skips the others' loading.

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bfkv::{Config, Durability, Tree};
use bfkv_workload::engines::Bfkv;
use bfkv_workload::report::{accumulate, env_count, or_exit, report};
use bfkv_workload::runner::{self, BoxError, Outcome, RunSpec, Stop, Workload};
use bfkv_workload::{Distribution, Phase, DEFAULT_THETA, KEY_LEN, VALUE_LEN, VALUE_LEN_LARGE};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use tempfile::TempDir;

/// Records per dataset unless `BFKV_BENCH_N` says otherwise: with it the default suite
/// fits in 5-8 minutes on the 2-core development machine.
const DEFAULT_RECORDS: u64 = 1_000_000;

/// The workloads after the load, reads first so the pure-read numbers see the loaded tree.
const PHASES: [Phase; 5] = [Phase::C, Phase::B, Phase::A, Phase::F, Phase::E];

/// Seed of the load and the first workload run; later runs add a counter to it.
const SEED: u64 = 42;

/// Where a dataset lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// `Config::in_memory()`: no files.
    Memory,
    /// File-backed with a cache a tenth of the raw record bytes.
    Disk10x,
}

/// One criterion group's fixed parameters.
#[derive(Debug, Clone)]
struct Dataset {
    /// Where the tree lives.
    regime: Regime,
    /// Records loaded.
    records: u64,
    /// Bytes per value.
    value_len: usize,
    /// Parent directory of the tree's files (disk regime), if not the system default.
    dir: Option<PathBuf>,
}

/// A loaded tree and what its workloads share.
struct Loaded {
    /// The tree. Declared before `_dir` so it is closed before its directory is removed.
    engine: Bfkv,
    /// The tree's directory (disk regime), removed on drop.
    _dir: Option<TempDir>,
    /// Next new record number for E's inserts.
    next_insert: Arc<AtomicU64>,
}

impl Dataset {
    /// The group name, e.g. `disk10x/v16`.
    fn name(&self) -> String {
        let regime = match self.regime {
            Regime::Memory => "mem",
            Regime::Disk10x => "disk10x",
        };
        format!("{regime}/v{}", self.value_len)
    }

    /// Cache bytes: room to spare in memory, a tenth of the raw records on disk (rounded up
    /// to whole leaf pages of the default size, at least the 16 pages a tree needs).
    fn cache(&self) -> usize {
        let raw = self.records as usize * (KEY_LEN + self.value_len);
        let page = Config::in_memory().get_page_size();
        match self.regime {
            Regime::Memory => (raw * 8).max(256 << 20),
            Regime::Disk10x => (raw / 10).next_multiple_of(page).max(16 * page),
        }
    }

    /// Opens an empty tree.
    fn open(&self) -> Result<(Bfkv, Option<TempDir>), BoxError> {
        match self.regime {
            Regime::Memory => {
                let config = Config::in_memory()
                    .cache_size(self.cache())
                    .durability(Durability::None);
                Ok((Bfkv(Tree::open(config)?), None))
            }
            Regime::Disk10x => {
                let dir = match &self.dir {
                    Some(parent) => tempfile::tempdir_in(parent)?,
                    None => tempfile::tempdir()?,
                };
                let config = Config::new(dir.path())
                    .cache_size(self.cache())
                    .durability(Durability::None);
                Ok((Bfkv(Tree::open(config)?), Some(dir)))
            }
        }
    }

    /// The runner's parameters for `threads` threads choosing records by `dist`.
    fn spec(&self, threads: usize, dist: Distribution, seed: u64) -> RunSpec {
        RunSpec {
            dist,
            seed,
            value_len: self.value_len,
            ..RunSpec::new(self.records, threads)
        }
    }

    /// Loads the N records into a fresh tree with `threads` threads.
    fn load(&self, threads: usize) -> Result<(Loaded, Outcome), BoxError> {
        let (engine, dir) = self.open()?;
        let next_insert = Arc::new(AtomicU64::new(self.records));
        // The load inserts its range in order; the distribution is not used.
        let spec = self.spec(threads, Distribution::Uniform, SEED);
        let all = Stop {
            ops: u64::MAX,
            time: None,
        };
        let load = Workload::Phase(Phase::Load);
        let out = runner::run(&engine, load, spec, all, &next_insert)?;
        let loaded = Loaded {
            engine,
            _dir: dir,
            next_insert,
        };
        Ok((loaded, out))
    }
}

/// Benchmarks loading the dataset with each of `threads`, keeping the last tree loaded in
/// `dataset`.
fn bench_load(
    group: &mut BenchmarkGroup<'_, WallTime>,
    ds: &Dataset,
    threads: &[usize],
    dataset: &RefCell<Option<Loaded>>,
) {
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(ds.records));
    for &t in threads {
        let total = RefCell::new(None::<Outcome>);
        group.bench_function(BenchmarkId::new("load", format!("{t}t")), |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    // Dropped first: two loaded trees at once would double the memory and
                    // disk traffic under measurement.
                    dataset.replace(None);
                    let (loaded, out) = or_exit(ds.load(t));
                    accumulate(&mut total.borrow_mut(), &out);
                    elapsed += out.elapsed;
                    dataset.replace(Some(loaded));
                }
                elapsed
            });
        });
        if let Some(out) = total.into_inner() {
            report(&ds.name(), "bfkv", &format!("load {t}t (all loads)"), &out);
        }
    }
}

/// Benchmarks the workloads on the group's dataset, loading it first if no load benchmark
/// ran (a filter).
fn bench_workloads(
    group: &mut BenchmarkGroup<'_, WallTime>,
    ds: &Dataset,
    threads: &[usize],
    dataset: &RefCell<Option<Loaded>>,
) {
    let measure = Duration::from_secs(env_count("BFKV_BENCH_SECS", 2).max(1));
    group
        .sampling_mode(SamplingMode::Auto)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(measure)
        .throughput(Throughput::Elements(1));
    let runs = Cell::new(0u64);
    for (dist_name, dist) in [
        ("uniform", Distribution::Uniform),
        ("zipf", Distribution::Zipf(DEFAULT_THETA)),
    ] {
        for phase in PHASES {
            let work = Workload::Phase(phase);
            for &t in threads {
                let total = RefCell::new(None::<Outcome>);
                let id = BenchmarkId::new(format!("{dist_name}/{}", work.name()), format!("{t}t"));
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let mut slot = dataset.borrow_mut();
                        let loaded = slot.get_or_insert_with(|| {
                            let (loaded, out) = or_exit(ds.load(t));
                            report(&ds.name(), "bfkv", &format!("load {t}t (once)"), &out);
                            loaded
                        });
                        runs.set(runs.get() + 1);
                        let spec = ds.spec(t, dist, SEED + runs.get());
                        let stop = Stop {
                            ops: iters,
                            time: None,
                        };
                        let out = or_exit(runner::run(
                            &loaded.engine,
                            work,
                            spec,
                            stop,
                            &loaded.next_insert,
                        ));
                        accumulate(&mut total.borrow_mut(), &out);
                        out.elapsed
                    });
                });
                if let Some(out) = total.into_inner() {
                    let what = format!("{dist_name} {} {t}t (all iterations)", work.name());
                    report(&ds.name(), "bfkv", &what, &out);
                }
            }
        }
    }
}

/// The whole suite: four groups, each loading its dataset once per load benchmark
/// iteration, then running the workloads on the last tree loaded.
fn suite(c: &mut Criterion) {
    let records = env_count("BFKV_BENCH_N", DEFAULT_RECORDS).max(1);
    let threads: Vec<usize> = std::env::var("BFKV_BENCH_THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .filter(|t: &Vec<usize>| !t.is_empty() && t.iter().all(|&n| n > 0))
        .unwrap_or_else(|| vec![1, 2]);
    let dir = std::env::var_os("BFKV_BENCH_DIR").map(PathBuf::from);
    for regime in [Regime::Memory, Regime::Disk10x] {
        for value_len in [VALUE_LEN, VALUE_LEN_LARGE] {
            let ds = Dataset {
                regime,
                records,
                value_len,
                dir: dir.clone(),
            };
            let mut group = c.benchmark_group(ds.name());
            group.sample_size(10);
            let dataset = RefCell::new(None);
            // A disk load takes seconds and the benchmark repeats it 11 times: only the
            // first thread count there, to keep the default suite near 8 minutes.
            let load_threads = match regime {
                Regime::Memory => &threads[..],
                Regime::Disk10x => &threads[..1],
            };
            bench_load(&mut group, &ds, load_threads, &dataset);
            bench_workloads(&mut group, &ds, &threads, &dataset);
            group.finish();
        }
    }
}

criterion_group!(benches, suite);
criterion_main!(benches);
