//! Random 4 KiB `O_DIRECT` reads on a 1 GiB file: a bare io_uring loop (depth 1, 32 and 64),
//! the same loop with a registered file and registered buffers (depth 32: the most those
//! could buy), the store's `read_batch` at depth 32 and 64 (io_uring backend, checksums
//! verified), and single-threaded `pread` (the store's pread backend, one page per call).
//! Throughput is in pages (IOPS).
//!
//! Run: `cargo bench --features internals --bench store`. The file is created once under
//! `target/bench-data/` (or `$BFKV_BENCH_DIR`) and reused.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use bfkv::internals::StoreBench;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use io_uring::{opcode, types, IoUring};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PAGE: usize = 4096;
const FILE_PAGES: u64 = (1 << 30) / PAGE as u64;

fn data_file() -> PathBuf {
    let dir = std::env::var_os("BFKV_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"));
    std::fs::create_dir_all(&dir).expect("create the bench directory");
    dir.join("store-1g.bfkv")
}

/// Opens the bench file, filling it to 1 GiB of data pages the first time.
fn prepared(io_uring: bool) -> StoreBench {
    let path = data_file();
    let mut store = StoreBench::open(&path, PAGE, io_uring).expect("open the bench file");
    if store.data_pages() < FILE_PAGES {
        eprintln!("creating {} (1 GiB, once)", path.display());
        store.fill(FILE_PAGES, 256).expect("fill the bench file");
    }
    assert!(
        store.is_direct(),
        "the bench needs O_DIRECT; set BFKV_BENCH_DIR to a disk file system"
    );
    store
}

/// Page-aligned buffers for the bare loop.
struct Bufs(Vec<*mut u8>);
impl Bufs {
    fn new(n: usize) -> Bufs {
        let layout = Layout::from_size_align(PAGE, PAGE).unwrap();
        // SAFETY: non-zero size; freed in Drop with the same layout.
        Bufs((0..n).map(|_| unsafe { alloc_zeroed(layout) }).collect())
    }
}
impl Drop for Bufs {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(PAGE, PAGE).unwrap();
        for &p in &self.0 {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(p, layout) }
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut store = prepared(true);
    let (first, pages) = (store.first_page(), store.data_pages());
    let mut rng = SmallRng::seed_from_u64(7);
    let mut group = c.benchmark_group("store_random_4k_read");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));

    // (a) A bare io_uring loop: push `depth` reads, one submit_and_wait, reap.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(data_file())
        .expect("open O_DIRECT");
    let fd = types::Fd(file.as_raw_fd());
    let mut ring = IoUring::new(128).expect("io_uring");
    for depth in [1usize, 32, 64] {
        let bufs = Bufs::new(depth);
        group.throughput(Throughput::Elements(depth as u64));
        group.bench_function(BenchmarkId::new("bare_io_uring", depth), |b| {
            b.iter(|| {
                for (i, &buf) in bufs.0.iter().enumerate() {
                    let page = first + rng.gen_range(0..pages);
                    let sqe = opcode::Read::new(fd, buf, PAGE as u32)
                        .offset(page * PAGE as u64)
                        .build()
                        .user_data(i as u64);
                    // SAFETY: the buffer lives until the completion is reaped below.
                    unsafe { ring.submission().push(&sqe).expect("queue full") };
                }
                ring.submit_and_wait(depth).expect("submit");
                let mut done = 0;
                for cqe in ring.completion() {
                    assert_eq!(cqe.result(), PAGE as i32);
                    done += 1;
                }
                assert_eq!(done, depth);
            })
        });
    }

    // (a') The bare loop at depth 32 with a registered file and registered buffers.
    {
        let depth = 32usize;
        let bufs = Bufs::new(depth);
        let iovecs: Vec<libc::iovec> = bufs
            .0
            .iter()
            .map(|&p| libc::iovec {
                iov_base: p.cast(),
                iov_len: PAGE,
            })
            .collect();
        let mut fixed = IoUring::new(64).expect("io_uring");
        // SAFETY: the buffers outlive the ring (dropped after it, below).
        unsafe { fixed.submitter().register_buffers(&iovecs) }.expect("register buffers");
        fixed
            .submitter()
            .register_files(&[file.as_raw_fd()])
            .expect("register file");
        group.throughput(Throughput::Elements(depth as u64));
        group.bench_function(BenchmarkId::new("bare_io_uring_fixed", depth), |b| {
            b.iter(|| {
                for (i, &buf) in bufs.0.iter().enumerate() {
                    let page = first + rng.gen_range(0..pages);
                    let sqe = opcode::ReadFixed::new(types::Fixed(0), buf, PAGE as u32, i as u16)
                        .offset(page * PAGE as u64)
                        .build()
                        .user_data(i as u64);
                    // SAFETY: the buffer lives until the completion is reaped below.
                    unsafe { fixed.submission().push(&sqe).expect("queue full") };
                }
                fixed.submit_and_wait(depth).expect("submit");
                let mut done = 0;
                for cqe in fixed.completion() {
                    assert_eq!(cqe.result(), PAGE as i32);
                    done += 1;
                }
                assert_eq!(done, depth);
            })
        });
        drop(fixed);
    }

    // (b) The store's read_batch (io_uring backend, checksums verified).
    for depth in [32usize, 64] {
        let mut batch = vec![0u64; depth];
        group.throughput(Throughput::Elements(depth as u64));
        group.bench_function(BenchmarkId::new("store_read_batch", depth), |b| {
            b.iter(|| {
                batch
                    .iter_mut()
                    .for_each(|p| *p = first + rng.gen_range(0..pages));
                store.read_batch(&batch).expect("read_batch");
            })
        });
    }
    drop(store);

    // (c) Single-threaded pread, one page per call (the store's pread backend).
    let mut store = prepared(false);
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("store_pread", 1), |b| {
        b.iter(|| store.read(first + rng.gen_range(0..pages)).expect("read"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
