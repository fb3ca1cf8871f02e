//! Node layout hot paths: search in a full 4 KiB leaf of 16-byte keys (hit and miss), and
//! upserts into a mini-page. Run: `cd bench/layers && cargo bench --bench node`.

use std::hint::black_box;

use bfkv::internals::{node_get, node_init, node_upsert};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Random 16-byte keys.
fn keys(rng: &mut SmallRng, n: usize) -> Vec<[u8; 16]> {
    (0..n).map(|_| rng.gen()).collect()
}

/// A 4 KiB leaf filled with 16-byte keys and 8-byte values until full; returns it and the
/// keys stored.
fn full_leaf(rng: &mut SmallRng) -> (Vec<u8>, Vec<[u8; 16]>) {
    let mut page = vec![0u8; 4096];
    node_init(&mut page, false);
    let mut stored = Vec::new();
    for k in keys(rng, 1000) {
        if !node_upsert(&mut page, &k, &[7; 8]) {
            break;
        }
        stored.push(k);
    }
    (page, stored)
}

/// Lookups of every stored key (hit) and of as many absent random keys (miss).
fn search(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(1);
    let (page, stored) = full_leaf(&mut rng);
    let misses = keys(&mut rng, stored.len());
    let mut g = c.benchmark_group(format!("node/search_4k_leaf_{}x16B", stored.len()));
    g.throughput(Throughput::Elements(stored.len() as u64));
    g.bench_function("hit", |b| {
        b.iter(|| {
            for k in &stored {
                black_box(node_get(&page, black_box(k)));
            }
        })
    });
    g.bench_function("miss", |b| {
        b.iter(|| {
            for k in &misses {
                black_box(node_get(&page, black_box(k)));
            }
        })
    });
    g.finish();
}

/// Inserts into a fresh 2 KiB mini-page, and in-place overwrites of the same keys.
fn upsert(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(2);
    // 48 records of 16 + 8 bytes plus metas fill about 1.6 KiB: the paper's mini-pages
    // before a merge (2 KiB threshold).
    let batch = keys(&mut rng, 48);
    let mut g = c.benchmark_group("node/upsert_mini_2k");
    g.throughput(Throughput::Elements(batch.len() as u64));
    g.bench_function("insert_48_random", |b| {
        b.iter_batched_ref(
            || {
                let mut mini = vec![0u8; 2048];
                node_init(&mut mini, true);
                mini
            },
            |mini| {
                for k in &batch {
                    assert!(node_upsert(mini, k, &[1; 8]));
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("overwrite_48", |b| {
        let mut mini = vec![0u8; 2048];
        node_init(&mut mini, true);
        for k in &batch {
            assert!(node_upsert(&mut mini, k, &[1; 8]));
        }
        b.iter(|| {
            for k in &batch {
                node_upsert(&mut mini, black_box(k), &[2; 8]);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, search, upsert);
criterion_main!(benches);
