//! Batched lookups against the device: 2M records (16-byte keys and values) in a file-backed
//! tree of the default leaf pages (8 KiB, as the device reads below) with a 4 MiB cache (the
//! leaves are about 25 times the cache), `Durability::None`, uniform random keys, one thread.
//!
//! - `device`: random page-sized `O_DIRECT` reads of the tree's data file, timed before and
//!   after the criterion groups and printed (reads per second), two ways: a bare `io_uring` loop that
//!   submits 32 reads and waits for them, batch after batch (the store bench's "bare" loop
//!   at depth 32: the rate `get_many` is measured against), and 32 threads reading one page
//!   at a time each (32 reads always in flight).
//! - `multiget/get_many`: `get_many` of 32 keys per iteration (throughput in keys).
//! - `multiget/get`: the same 32 keys with `get`, one at a time.
//! - `paired`: after the groups, 10 s of `get_many` calls alternated with batches of the bare
//!   loop, one each in turn, so that both meet the device in the same state (its rate drifts
//!   within seconds): both rates and their ratio are printed.
//!
//! - `multiget_memory/get_many` and `multiget_memory/get`: the same calls against the same
//!   records in a tree held in memory (`Config::in_memory`, 256 MiB cache).
//!
//! After each device group the data-page reads per key are printed (from `Stats`). Results:
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
        .cache_size(4 << 20)
        .durability(Durability::None)
}

/// The tree's leaf page size (the default): what a device read below reads.
fn page_size() -> usize {
    Config::in_memory().get_page_size()
}

/// A page-aligned buffer of one leaf page.
struct Aligned(*mut u8, std::alloc::Layout);

impl Aligned {
    fn new() -> Aligned {
        let layout = std::alloc::Layout::from_size_align(page_size(), 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        Aligned(ptr, layout)
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live allocation of `self.1.size()` bytes owned by `self`, borrowed
        // mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout and not used after.
        unsafe { std::alloc::dealloc(self.0, self.1) };
    }
}

/// Random page-sized direct reads of a file, `DEPTH` per `io_uring` submission, each batch
/// waited for whole.
struct DeviceBatches {
    file: std::fs::File,
    pages: u64,
    uring: io_uring::IoUring,
    bufs: Vec<Aligned>,
    rng: SmallRng,
}

/// `file` opened for direct reads, and how many leaf pages it holds.
fn open_direct(file: &Path) -> (std::fs::File, u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .expect("open the data file");
    let pages = file.metadata().expect("metadata").len() / page_size() as u64;
    (file, pages)
}

impl DeviceBatches {
    fn open(file: &Path) -> DeviceBatches {
        let (file, pages) = open_direct(file);
        DeviceBatches {
            file,
            pages,
            uring: io_uring::IoUring::new(DEPTH as u32).expect("io_uring"),
            bufs: (0..DEPTH).map(|_| Aligned::new()).collect(),
            rng: SmallRng::seed_from_u64(5),
        }
    }

    /// Reads one batch of `DEPTH` pages.
    fn batch(&mut self) {
        use io_uring::{opcode, types};
        use std::os::unix::io::AsRawFd;
        let page = page_size() as u64;
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            let offset = self.rng.gen_range(2..self.pages) * page;
            let fd = types::Fd(self.file.as_raw_fd());
            let sqe = opcode::Read::new(fd, buf.bytes().as_mut_ptr(), page as u32)
                .offset(offset)
                .build()
                .user_data(i as u64);
            // SAFETY: the buffer outlives the read, whose completion is reaped below before
            // the buffer is touched or reused.
            unsafe { self.uring.submission().push(&sqe) }.expect("queue full");
        }
        self.uring.submit_and_wait(DEPTH).expect("submit");
        for cqe in self.uring.completion() {
            assert_eq!(cqe.result(), page as i32, "read failed");
        }
    }
}

/// `DeviceBatches` for `time`: reads per second.
fn device_batches(file: &Path, time: Duration) -> f64 {
    let mut device = DeviceBatches::open(file);
    let (start, mut reads) = (Instant::now(), 0u64);
    while start.elapsed() < time {
        device.batch();
        reads += DEPTH as u64;
    }
    reads as f64 / start.elapsed().as_secs_f64()
}

/// Random page-sized direct reads of `file` by `DEPTH` threads for `time`: reads per second.
fn device_threads(file: &Path, time: Duration) -> f64 {
    let (f, pages) = open_direct(file);
    let page = page_size() as u64;
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
                    let at = rng.gen_range(2..pages) * page;
                    f.read_exact_at(buf.bytes(), at).expect("read");
                    n += 1;
                }
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(time);
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
    let before = (
        device_batches(&data, Duration::from_secs(3)),
        device_threads(&data, Duration::from_secs(3)),
    );
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
    paired(
        &tree,
        &data,
        &mut || batch(&mut rng),
        Duration::from_secs(10),
    );
    drop(tree);
    let after = (
        device_batches(&data, Duration::from_secs(3)),
        device_threads(&data, Duration::from_secs(3)),
    );
    eprintln!(
        "device: random {} KiB O_DIRECT reads, io_uring batches of {DEPTH}: {:.0}/s before, \
         {:.0}/s after; {DEPTH} threads: {:.0}/s before, {:.0}/s after",
        page_size() >> 10,
        before.0,
        after.0,
        before.1,
        after.1
    );
}

/// `get_many` of `KEYS_PER_CALL` keys against one device batch of `DEPTH` reads, alternated
/// call by call for `time` (the device's rate drifts within seconds; alternating this finely,
/// both see the same device): prints both rates and their ratio.
fn paired(tree: &Tree, data: &Path, batch: &mut dyn FnMut() -> Vec<[u8; 16]>, time: Duration) {
    let mut device = DeviceBatches::open(data);
    let (mut in_device, mut in_tree) = (Duration::ZERO, Duration::ZERO);
    let (start, mut rounds) = (Instant::now(), 0u64);
    while start.elapsed() < time {
        let at = Instant::now();
        device.batch();
        let between = Instant::now();
        let keys = batch();
        for r in tree.get_many(&keys) {
            assert!(r.expect("get_many").is_some());
        }
        in_tree += between.elapsed();
        in_device += between - at;
        rounds += 1;
    }
    let device_rate = (rounds * DEPTH as u64) as f64 / in_device.as_secs_f64();
    let tree_rate = (rounds * KEYS_PER_CALL as u64) as f64 / in_tree.as_secs_f64();
    eprintln!(
        "paired, {rounds} alternated calls: get_many {tree_rate:.0} keys/s, device batches of \
         {DEPTH} {device_rate:.0} reads/s, ratio {:.3}",
        tree_rate / device_rate
    );
}

/// The same calls against the same records in memory (`Config::in_memory`, a cache that
/// holds them all): what batching buys when no key needs the device.
fn in_memory(c: &mut Criterion) {
    let tree = Tree::open(Config::in_memory().cache_size(256 << 20)).expect("open");
    for i in 0..RECORDS {
        tree.insert(key(i), [7u8; 16]).expect("load");
    }
    let mut g = c.benchmark_group("multiget_memory");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(KEYS_PER_CALL as u64));
    let mut rng = SmallRng::seed_from_u64(11);
    let mut keys = vec![[0u8; 16]; KEYS_PER_CALL];
    g.bench_function("get_many", |b| {
        b.iter(|| {
            keys.fill_with(|| key(rng.gen_range(0..RECORDS)));
            for r in tree.get_many(&keys) {
                assert!(r.expect("get_many").is_some());
            }
        });
    });
    g.bench_function("get", |b| {
        b.iter(|| {
            keys.fill_with(|| key(rng.gen_range(0..RECORDS)));
            for k in &keys {
                assert!(tree.get(k).expect("get").is_some());
            }
        });
    });
    g.finish();
}

criterion_group!(benches, multiget, in_memory);
criterion_main!(benches);
