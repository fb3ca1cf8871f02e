//! Buffer pool throughput: alloc+dealloc pairs with 1 and 2 threads (the free-list fast path
//! must scale), and mapping-table lock+unlock.
//!
//! Run: `cd bench/layers && cargo bench --bench pool`

use std::time::{Duration, Instant};

use bfkv::internals::PoolHarness;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// `iters` alloc+dealloc pairs on each of `threads` threads; wall time of the slowest.
fn pairs(pool: &PoolHarness, threads: usize, iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..iters {
                    // 256-byte and 1 KiB mini-pages alternate: two size classes, like growth.
                    let ok = pool.alloc_and_free(8 + ((i as u8 + t as u8) & 1) * 8);
                    assert!(ok, "the pool is large enough never to fill");
                }
            });
        }
    });
    start.elapsed()
}

fn alloc_dealloc(c: &mut Criterion) {
    let pool = PoolHarness::new(64 << 20, 10).expect("64 MiB pool");
    // Warm up past the copy-on-access region so frees go to the free lists.
    for _ in 0..100_000 {
        pool.alloc_and_free(16);
    }
    let mut g = c.benchmark_group("pool_alloc_dealloc");
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| pairs(&pool, threads, iters))
        });
    }
    g.finish();
}

/// The same thread layout doing only private arithmetic: how much two threads can scale on
/// this machine at this moment (the cores are shared), to read the pool's figure against.
fn baseline(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_baseline_private_work");
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..threads {
                        s.spawn(move || {
                            let mut x = t as u64 + 1;
                            for _ in 0..iters * 16 {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                            }
                            std::hint::black_box(x);
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn mapping_locks(c: &mut Criterion) {
    let pool = PoolHarness::new(1 << 20, 10).expect("1 MiB pool");
    let pids: Vec<u32> = (0..1024)
        .map(|i| pool.add_page(i).expect("page id"))
        .collect();
    let mut g = c.benchmark_group("pool_mapping_lock");
    g.throughput(Throughput::Elements(1));
    for (name, exclusive) in [("read", false), ("write", true)] {
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                pool.lock_cycle(pids[i], exclusive);
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = alloc_dealloc, baseline, mapping_locks
}
criterion_main!(benches);
