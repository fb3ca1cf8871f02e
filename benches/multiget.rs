//! Batched lookups against the device: 2M records (16-byte keys and values) in a file-backed
//! tree of 4 KiB leaf pages (as the device reads below) with a 4 MiB cache (the leaves are
//! about 25 times the cache), `Durability::None`, uniform random keys, one thread.
//!
//! - `device`: random 4 KiB `O_DIRECT` reads of the tree's data file, timed before and after
//!   the criterion groups and printed (reads per second), two ways: a bare `io_uring` loop that
//!   submits 32 reads and waits for them, batch after batch (the store bench's "bare" loop
//!   at depth 32: the rate `get_many` is measured against), and 32 threads reading one page
//!   at a time each (32 reads always in flight).
//! - `multiget/get_many`: `get_many` of 32 keys per iteration (throughput in keys).
//! - `multiget/get`: the same 32 keys with `get`, one at a time.
//!
//! After each group the data-page reads per key are printed (from `Stats`). Results:
//! `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench --bench multiget
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const RECORDS: u64 = 2_000_000;
const KEYS_PER_CALL: usize = 32;
const DEPTH: usize = 32;

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn config(dir: &Path) -> Config {
    Config::new(dir)
        .page_size(4096)
        .cache_size(4 << 20)
        .durability(Durability::None)
}

/// A page-aligned 4 KiB buffer.
struct Aligned(*mut u8);

impl Aligned {
    const LAYOUT: std::alloc::Layout = match std::alloc::Layout::from_size_align(4096, 4096) {
        Ok(l) => l,
        Err(_) => panic!("layout"),
    };

    fn new() -> Aligned {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(Self::LAYOUT) };
        assert!(!ptr.is_null(), "allocation failed");
        Aligned(ptr)
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live 4096-byte allocation owned by `self`, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.0, 4096) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout and not used after.
        unsafe { std::alloc::dealloc(self.0, Self::LAYOUT) };
    }
}

/// Random 4 KiB direct reads of `file` for `secs`, `DEPTH` per `io_uring` submission, each
/// batch waited for whole: reads per second.
fn device_batches(file: &Path, secs: u64) -> f64 {
    use io_uring::{opcode, types, IoUring};
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .expect("open the data file");
    let pages = f.metadata().expect("metadata").len() / 4096;
    let mut uring = IoUring::new(DEPTH as u32).expect("io_uring");
    let mut bufs: Vec<Aligned> = (0..DEPTH).map(|_| Aligned::new()).collect();
    let mut rng = SmallRng::seed_from_u64(5);
    let (start, mut reads) = (Instant::now(), 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        for (i, buf) in bufs.iter_mut().enumerate() {
            let offset = rng.gen_range(2..pages) * 4096;
            let sqe = opcode::Read::new(types::Fd(f.as_raw_fd()), buf.bytes().as_mut_ptr(), 4096)
                .offset(offset)
                .build()
                .user_data(i as u64);
            // SAFETY: the buffer outlives the read, whose completion is reaped below before
            // the buffer is touched or reused.
            unsafe { uring.submission().push(&sqe) }.expect("queue full");
        }
        uring.submit_and_wait(DEPTH).expect("submit");
        for cqe in uring.completion() {
            assert_eq!(cqe.result(), 4096, "read failed");
            reads += 1;
        }
    }
    reads as f64 / start.elapsed().as_secs_f64()
}

/// Random 4 KiB direct reads of `file` by `DEPTH` threads for `secs`: reads per second.
fn device_threads(file: &Path, secs: u64) -> f64 {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .expect("open the data file");
    let pages = f.metadata().expect("metadata").len() / 4096;
    let (done, reads) = (AtomicBool::new(false), AtomicU64::new(0));
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..DEPTH {
            let (f, done, reads) = (&f, &done, &reads);
            s.spawn(move || {
                let mut buf = Aligned::new();
                let mut rng = SmallRng::seed_from_u64(t as u64);
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let page = rng.gen_range(2..pages);
                    f.read_exact_at(buf.bytes(), page * 4096).expect("read");
                    n += 1;
                }
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        done.store(true, Ordering::Relaxed);
    });
    reads.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn multiget(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let tree = Tree::open(config(dir.path())).expect("open");
        for i in 0..RECORDS {
            tree.insert(key(i), [7u8; 16]).expect("load");
        }
        tree.close().expect("close");
    }
    let data = dir.path().join("data");
    let before = (device_batches(&data, 3), device_threads(&data, 3));
    let tree = Tree::open(config(dir.path())).expect("reopen");
    let mut g = c.benchmark_group("multiget");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(KEYS_PER_CALL as u64));
    let mut rng = SmallRng::seed_from_u64(9);
    let batch = |rng: &mut SmallRng| -> Vec<[u8; 16]> {
        (0..KEYS_PER_CALL)
            .map(|_| key(rng.gen_range(0..RECORDS)))
            .collect()
    };
    for (name, many) in [("get_many", true), ("get", false)] {
        let (mut calls, reads_before) = (0u64, tree.stats().pages_read);
        g.bench_function(name, |b| {
            b.iter(|| {
                let keys = batch(&mut rng);
                calls += 1;
                if many {
                    for r in tree.get_many(&keys) {
                        assert!(r.expect("get_many").is_some());
                    }
                } else {
                    for k in &keys {
                        assert!(tree.get(k).expect("get").is_some());
                    }
                }
            });
        });
        let reads = tree.stats().pages_read - reads_before;
        eprintln!(
            "multiget/{name}: {:.3} data-page reads per key",
            reads as f64 / (calls * KEYS_PER_CALL as u64).max(1) as f64
        );
    }
    g.finish();
    drop(tree);
    let after = (device_batches(&data, 3), device_threads(&data, 3));
    eprintln!(
        "device: random 4 KiB O_DIRECT reads, io_uring batches of {DEPTH}: {:.0}/s before, \
         {:.0}/s after; {DEPTH} threads: {:.0}/s before, {:.0}/s after",
        before.0, after.0, before.1, after.1
    );
}

criterion_group!(benches, multiget);
criterion_main!(benches);
