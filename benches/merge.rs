//! Blind merges against read-modify-write when the data is far larger than the cache: 2M
//! counters (16-byte keys, u64 values, about 80 MiB of leaves) under a 4 MiB cache,
//! `Durability::None`, one thread, uniform random keys, with 4 KiB leaf pages (the default)
//! and with 16 KiB ones. `rmw` reads the counter with `get` and writes it back incremented
//! with `insert`; `merge` calls `merge` with a u64 add operand. After each group, the
//! data-page reads, leaf write-backs and foreground evictions per operation (from `Stats`)
//! are printed. Results: `docs/benchmarks.md`.
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

fn config(dir: &std::path::Path, page_size: usize) -> Config {
    Config::new(dir)
        .cache_size(4 << 20)
        .page_size(page_size)
        .durability(Durability::None)
        .merge_operator(add)
}

/// Operations run, and what they cost in data-page reads, leaf write-backs and evictions the
/// operation had to make itself.
#[derive(Default)]
struct Totals {
    ops: u64,
    reads: u64,
    write_backs: u64,
    foreground_evictions: u64,
}

/// Runs `op` `iters` times on uniform random counters; returns the time, and adds what
/// they did to `totals`.
fn timed(tree: &Tree, iters: u64, totals: &mut Totals, mut op: impl FnMut(&Tree, u64)) -> Duration {
    let mut rng = SmallRng::seed_from_u64(iters ^ totals.ops);
    let before = tree.stats();
    let start = Instant::now();
    for _ in 0..iters {
        op(tree, rng.gen_range(0..COUNTERS));
    }
    let elapsed = start.elapsed();
    let after = tree.stats();
    totals.ops += iters;
    totals.reads += after.pages_read - before.pages_read;
    totals.write_backs += after.write_backs - before.write_backs;
    totals.foreground_evictions += after.foreground_evictions - before.foreground_evictions;
    elapsed
}

fn merges(c: &mut Criterion) {
    for page_size in [4096, 16384] {
        group(c, page_size);
    }
}

/// Both benchmarks over 2M counters in leaves of `page_size` bytes.
fn group(c: &mut Criterion, page_size: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let tree = Tree::open(config(dir.path(), page_size)).expect("open");
        for i in 0..COUNTERS {
            tree.insert(key(i), 0u64.to_le_bytes()).expect("load");
        }
        tree.close().expect("close");
    }
    let tree = Tree::open(config(dir.path(), page_size)).expect("reopen");
    let name = format!("merge/{}k", page_size >> 10);
    let mut g = c.benchmark_group(&name);
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Elements(1));
    let mut rmw = Totals::default();
    g.bench_function("rmw", |b| {
        b.iter_custom(|iters| {
            timed(&tree, iters, &mut rmw, |tree, i| {
                let old = tree.get(key(i)).expect("get").expect("loaded");
                let n = u64::from_le_bytes(old.try_into().expect("8 bytes"));
                tree.insert(key(i), (n + 1).to_le_bytes()).expect("insert");
            })
        });
    });
    let mut merge = Totals::default();
    g.bench_function("merge", |b| {
        b.iter_custom(|iters| {
            timed(&tree, iters, &mut merge, |tree, i| {
                tree.merge(key(i), 1u64.to_le_bytes()).expect("merge");
            })
        });
    });
    g.finish();
    for (what, t) in [("rmw", rmw), ("merge", merge)] {
        let per = |n: u64| n as f64 / t.ops.max(1) as f64;
        eprintln!(
            "{name}/{what}: {} operations; per operation {:.4} data-page reads, {:.4} leaf \
             write-backs, {:.4} foreground evictions",
            t.ops,
            per(t.reads),
            per(t.write_backs),
            per(t.foreground_evictions)
        );
    }
}

criterion_group!(benches, merges);
criterion_main!(benches);
