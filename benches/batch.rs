//! Atomic batches of 1, 10, 100 and 1,000 writes against the same writes made one at a time
//! (throughput in writes per second), in two groups:
//!
//! - `batch/mem`: `Config::in_memory()`, 200,000 records of 16 + 16 bytes loaded first;
//!   what a batch costs over single writes when nothing waits for a disk (sorting, locking
//!   every leaf first, the one log record's encoding is skipped: no log).
//! - `batch/sync`: file-backed, `Durability::Sync`, the same data: one log record and one
//!   fsync per commit, where single writes pay one fsync (shared by concurrent writers)
//!   each.
//!
//! Keys are uniform over the loaded ones, 16-byte values, the default 8 KiB leaf pages. Results:
//! `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench --bench batch
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::time::Duration;

use bfkv::{Config, Durability, Tree};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const RECORDS: u64 = 200_000;
const SIZES: [u64; 4] = [1, 10, 100, 1_000];

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn loaded(config: Config) -> Tree {
    let tree = Tree::open(config).expect("open");
    for i in 0..RECORDS {
        tree.insert(key(i), [1u8; 16]).expect("load");
    }
    tree
}

fn group(c: &mut Criterion, name: &str, tree: &Tree) {
    let mut g = c.benchmark_group(format!("batch/{name}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let ks = tree.default_keyspace();
    let mut rng = SmallRng::seed_from_u64(7);
    for n in SIZES {
        g.throughput(Throughput::Elements(n));
        g.bench_with_input(BenchmarkId::new("batch", n), &n, |b, &n| {
            b.iter(|| {
                let mut batch = tree.batch();
                for _ in 0..n {
                    batch.insert(&ks, key(rng.gen_range(0..RECORDS)), [2u8; 16]);
                }
                batch.commit().expect("commit");
            });
        });
        g.bench_with_input(BenchmarkId::new("single", n), &n, |b, &n| {
            b.iter(|| {
                for _ in 0..n {
                    tree.insert(key(rng.gen_range(0..RECORDS)), [2u8; 16])
                        .expect("insert");
                }
            });
        });
    }
    g.finish();
}

fn batches(c: &mut Criterion) {
    let mem = loaded(Config::in_memory().cache_size(256 << 20));
    group(c, "mem", &mem);
    drop(mem);
    let dir = tempfile::tempdir().expect("tempdir");
    let on_disk = |durability| {
        Config::new(dir.path())
            .cache_size(64 << 20)
            .durability(durability)
    };
    // Loaded without the log (an fsync per insert would take most of a minute).
    loaded(on_disk(Durability::None)).close().expect("close");
    let sync = Tree::open(on_disk(Durability::Sync)).expect("open");
    group(c, "sync", &sync);
    sync.close().expect("close");
}

criterion_group!(benches, batches);
criterion_main!(benches);
