//! Blind merges against read-modify-write when the data is far larger than the cache: 2M
//! counters (16-byte keys, u64 values, about 80 MiB of leaves) under a 4 MiB cache,
//! `Durability::None`, one thread, uniform random keys. `merge/rmw` reads the counter with
//! `get` and writes it back incremented with `insert`; `merge/merge` calls `merge` with a u64
//! add operand. After each, the data-page reads per operation (`Stats::pages_read` over the
//! operations) are printed. Results: `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench --bench merge
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const COUNTERS: u64 = 2_000_000;

/// Counter `i`'s key: 16 bytes, spread over the key space.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    (!operand.is_empty()).then(|| (n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

fn config(dir: &std::path::Path) -> Config {
    Config::new(dir)
        .cache_size(4 << 20)
        .durability(Durability::None)
        .merge_operator(add)
}

/// Runs `op` `iters` times on uniform random counters; returns the time, and adds the
/// operations and page reads to `totals`.
fn timed(
    tree: &Tree,
    iters: u64,
    totals: &mut (u64, u64),
    mut op: impl FnMut(&Tree, u64),
) -> Duration {
    let mut rng = SmallRng::seed_from_u64(iters ^ totals.0);
    let reads = tree.stats().pages_read;
    let start = Instant::now();
    for _ in 0..iters {
        op(tree, rng.gen_range(0..COUNTERS));
    }
    let elapsed = start.elapsed();
    totals.0 += iters;
    totals.1 += tree.stats().pages_read - reads;
    elapsed
}

fn merges(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let tree = Tree::open(config(dir.path())).expect("open");
        for i in 0..COUNTERS {
            tree.insert(key(i), 0u64.to_le_bytes()).expect("load");
        }
        tree.close().expect("close");
    }
    let tree = Tree::open(config(dir.path())).expect("reopen");
    let mut g = c.benchmark_group("merge");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Elements(1));
    let mut rmw = (0, 0);
    g.bench_function("rmw", |b| {
        b.iter_custom(|iters| {
            timed(&tree, iters, &mut rmw, |tree, i| {
                let old = tree.get(key(i)).expect("get").expect("loaded");
                let n = u64::from_le_bytes(old.try_into().expect("8 bytes"));
                tree.insert(key(i), (n + 1).to_le_bytes()).expect("insert");
            })
        });
    });
    let mut merge = (0, 0);
    g.bench_function("merge", |b| {
        b.iter_custom(|iters| {
            timed(&tree, iters, &mut merge, |tree, i| {
                tree.merge(key(i), 1u64.to_le_bytes()).expect("merge");
            })
        });
    });
    g.finish();
    for (name, (ops, reads)) in [("rmw", rmw), ("merge", merge)] {
        eprintln!(
            "merge/{name}: {ops} operations, {reads} data-page reads, {:.4} per operation",
            reads as f64 / ops.max(1) as f64
        );
    }
}

criterion_group!(benches, merges);
criterion_main!(benches);
