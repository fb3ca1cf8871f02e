//! Loading sorted records into a fresh file-backed tree: `Tree::bulk_load` against a loop of
//! `insert` followed by `checkpoint`. 1M records with 16-byte keys (spread over the key
//! space, as the other benches', then sorted) and 16-byte or 100-byte values; the default
//! leaf page size (8 KiB), a 32 MiB cache, `Durability::None`, one thread.
//!
//! - `bulk_load/bulk_load_{16,100}B`: one `bulk_load` of every record (it ends with its
//!   own checkpoint).
//! - `bulk_load/insert_{16,100}B`: `insert` of every record in order, then `checkpoint`.
//!
//! Each iteration opens a tree in a new directory (not timed) and loads it; the tree is
//! closed after the measurement. Before the groups, each case runs once more and its data
//! file is described on stderr: file size, pages in use and leaves (from the checkpoint
//! file), one line per case.
//!
//! Files go under `target/bench-data/` (or `$BFKV_BENCH_DIR`), which should be on the
//! real disk. `cargo test --benches` runs each case once on 20k records.
//!
//! ```sh
//! cargo bench --bench bulk_load
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

/// Records per load: a real run, or the one-shot check of `cargo test --benches`.
fn records_per_load() -> u64 {
    let args: Vec<String> = std::env::args().collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    // Criterion benchmarks only with `--bench` and without `--test` or `--list`.
    if has("--bench") && !has("--test") && !has("--list") {
        1_000_000
    } else {
        20_000
    }
}

/// `n` records with 16-byte keys in key order and `value_len`-byte values.
fn records(n: u64, value_len: usize) -> Vec<([u8; 16], Vec<u8>)> {
    let mut records: Vec<([u8; 16], Vec<u8>)> = (0..n)
        .map(|i| {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            k[8..].copy_from_slice(&i.to_be_bytes());
            (k, vec![i as u8; value_len])
        })
        .collect();
    records.sort_unstable();
    records
}

fn base_dir() -> PathBuf {
    let base = std::env::var_os("BFKV_BENCH_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&base).expect("bench dir");
    base
}

fn open(dir: &Path) -> Tree {
    Tree::open(
        Config::new(dir)
            .cache_size(32 << 20)
            .durability(Durability::None),
    )
    .expect("open")
}

/// The two ways of loading.
#[derive(Clone, Copy)]
enum Way {
    Bulk,
    Insert,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Bulk => "bulk_load",
            Way::Insert => "insert",
        }
    }

    fn load(self, tree: &Tree, records: &[([u8; 16], Vec<u8>)]) {
        match self {
            Way::Bulk => {
                let n = tree.bulk_load(records.iter().map(|(k, v)| (k, v)));
                assert_eq!(n.expect("bulk load"), records.len() as u64);
            }
            Way::Insert => {
                for (k, v) in records {
                    tree.insert(k, v).expect("insert");
                }
                tree.checkpoint().expect("checkpoint");
            }
        }
    }
}

/// Loads once more and prints what the data file holds.
fn describe(way: Way, value_len: usize, records: &[([u8; 16], Vec<u8>)]) {
    let dir = tempfile::tempdir_in(base_dir()).expect("tempdir");
    let tree = open(dir.path());
    let start = Instant::now();
    way.load(&tree, records);
    let took = start.elapsed();
    let in_use = tree.stats().disk_pages_in_use;
    tree.close().expect("close");
    let file = std::fs::metadata(dir.path().join("data"))
        .expect("data file")
        .len();
    let checkpoint = std::fs::read(dir.path().join("checkpoint")).expect("checkpoint file");
    let leaves = u64::from_le_bytes(checkpoint[24..32].try_into().expect("8 bytes"));
    eprintln!(
        "bulk_load: {}_{value_len}B: {} records, data file {:.1} MiB ({} bytes), {in_use} \
         pages in use, {leaves} leaves, one load {:.2} s",
        way.name(),
        records.len(),
        file as f64 / f64::from(1 << 20),
        file,
        took.as_secs_f64()
    );
}

fn bench(c: &mut Criterion) {
    let n = records_per_load();
    let base = base_dir();
    for value_len in [16usize, 100] {
        let records = records(n, value_len);
        for way in [Way::Bulk, Way::Insert] {
            describe(way, value_len, &records);
        }
        let mut group = c.benchmark_group("bulk_load");
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(1))
            .measurement_time(Duration::from_secs(1))
            .throughput(Throughput::Elements(n));
        for way in [Way::Bulk, Way::Insert] {
            group.bench_function(format!("{}_{value_len}B", way.name()), |b| {
                b.iter_batched(
                    || {
                        let dir = tempfile::tempdir_in(&base).expect("tempdir");
                        let tree = open(dir.path());
                        (dir, tree)
                    },
                    |(dir, tree)| {
                        way.load(&tree, &records);
                        (dir, tree)
                    },
                    BatchSize::PerIteration,
                );
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
