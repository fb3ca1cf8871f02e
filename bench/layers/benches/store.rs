//! Random 4 KiB `O_DIRECT` reads on a 1 GiB file: a bare io_uring loop (depth 1, 32 and 64),
//! the same loop with a registered file and registered buffers (depth 32: the most those
//! could buy), the store's `read_batch` at depth 32 and 64 (io_uring backend, checksums
//! verified), and single-threaded `pread` (the store's pread backend, one page per call).
//! Throughput is in pages (IOPS).
//!
//! Run: `cd bench/layers && cargo bench --bench store`. The file is created once under
//! `target/bench-data/` (or `$BFKV_BENCH_DIR`) and reused.
//!
//! On a shared machine the device's speed drifts within seconds, so ratios of criterion
//! results measured one after another are noisy. `BFKV_STORE_PAIRED=<rounds>` runs a paired
//! comparison instead: each round runs 60 batches of the bare loop, the fixed bare loop, the
//! store and pread back to back at depth 32 and 64 (in reverse order every other round), and
//! the medians of the per-round throughputs and ratios are printed.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bfkv::internals::StoreBench;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use io_uring::{opcode, squeue, types, IoUring};
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

/// A bare io_uring loop: push one read per buffer, one `submit_and_wait`, reap.
struct Bare {
    /// Its own ring.
    ring: IoUring,
    /// One page buffer per request of a batch.
    bufs: Bufs,
    /// The file, or `None` when it is registered (as fixed file 0, with the buffers).
    fd: Option<types::Fd>,
}

impl Bare {
    /// A loop of `depth` reads per batch on `file`; `fixed` registers the file and buffers.
    fn new(file: &std::fs::File, depth: usize, fixed: bool) -> Bare {
        let ring = IoUring::new(128).expect("io_uring");
        let bufs = Bufs::new(depth);
        if !fixed {
            let fd = Some(types::Fd(file.as_raw_fd()));
            return Bare { ring, bufs, fd };
        }
        let iovecs: Vec<libc::iovec> = (bufs.0.iter())
            .map(|&p| libc::iovec {
                iov_base: p.cast(),
                iov_len: PAGE,
            })
            .collect();
        // SAFETY: the buffers live as long as the ring (both are fields of `Bare`, and the
        // ring is declared first, so it is dropped first).
        unsafe { ring.submitter().register_buffers(&iovecs) }.expect("register buffers");
        (ring.submitter())
            .register_files(&[file.as_raw_fd()])
            .expect("register file");
        Bare {
            ring,
            bufs,
            fd: None,
        }
    }

    /// Reads one batch of random pages from `first..first + pages`.
    fn batch(&mut self, rng: &mut SmallRng, first: u64, pages: u64) {
        for (i, &buf) in self.bufs.0.iter().enumerate() {
            let offset = (first + rng.gen_range(0..pages)) * PAGE as u64;
            let sqe: squeue::Entry = match self.fd {
                Some(fd) => opcode::Read::new(fd, buf, PAGE as u32)
                    .offset(offset)
                    .build(),
                None => opcode::ReadFixed::new(types::Fixed(0), buf, PAGE as u32, i as u16)
                    .offset(offset)
                    .build(),
            };
            // SAFETY: the buffer lives until the completion is reaped below.
            unsafe { self.ring.submission().push(&sqe.user_data(i as u64)) }.expect("queue full");
        }
        let depth = self.bufs.0.len();
        self.ring.submit_and_wait(depth).expect("submit");
        let mut done = 0;
        for cqe in self.ring.completion() {
            assert_eq!(cqe.result(), PAGE as i32);
            done += 1;
        }
        assert_eq!(done, depth);
    }
}

/// Opens the bench file with `O_DIRECT` for the bare loops.
fn direct_file() -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(data_file())
        .expect("open O_DIRECT")
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

    // (a) A bare io_uring loop; (a') the same with a registered file and buffers, the most
    // those could buy.
    let file = direct_file();
    for (name, depth, fixed) in [
        ("bare_io_uring", 1usize, false),
        ("bare_io_uring", 32, false),
        ("bare_io_uring", 64, false),
        ("bare_io_uring_fixed", 32, true),
    ] {
        let mut bare = Bare::new(&file, depth, fixed);
        group.throughput(Throughput::Elements(depth as u64));
        group.bench_function(BenchmarkId::new(name, depth), |b| {
            b.iter(|| bare.batch(&mut rng, first, pages))
        });
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

/// The median of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The paired comparison (see the module docs): `rounds` rounds per depth.
fn paired(rounds: usize) {
    const BATCHES: usize = 60;
    let mut store = prepared(true);
    let mut pread = prepared(false);
    let (first, pages) = (store.first_page(), store.data_pages());
    let mut rng = SmallRng::seed_from_u64(11);
    let file = direct_file();
    for depth in [32usize, 64] {
        let mut bare = Bare::new(&file, depth, false);
        let mut fixed = Bare::new(&file, depth, true);
        let mut batch = vec![0u64; depth];
        // Per round, pages per second of: bare, fixed, store, pread.
        let mut iops: [Vec<f64>; 4] = Default::default();
        let n = (BATCHES * depth) as f64;
        for round in 0..rounds {
            // Odd rounds run the four in reverse order, so a device that speeds up or slows
            // down within a round favours none of them.
            let order: [usize; 4] = if round % 2 == 0 {
                [0, 1, 2, 3]
            } else {
                [3, 2, 1, 0]
            };
            for which in order {
                let t = Instant::now();
                match which {
                    0 => (0..BATCHES).for_each(|_| bare.batch(&mut rng, first, pages)),
                    1 => (0..BATCHES).for_each(|_| fixed.batch(&mut rng, first, pages)),
                    2 => {
                        for _ in 0..BATCHES {
                            batch
                                .iter_mut()
                                .for_each(|p| *p = first + rng.gen_range(0..pages));
                            store.read_batch(&batch).expect("read_batch");
                        }
                    }
                    _ => {
                        for _ in 0..BATCHES * depth {
                            pread.read(first + rng.gen_range(0..pages)).expect("read");
                        }
                    }
                }
                iops[which].push(n / t.elapsed().as_secs_f64());
            }
        }
        let ratio =
            |a: usize, b: usize| median((0..rounds).map(|r| iops[a][r] / iops[b][r]).collect());
        let k = |i: usize| median(iops[i].clone()) / 1e3;
        println!(
            "depth {depth}: bare {:.1}k, fixed {:.1}k, store {:.1}k, pread {:.1}k pages/s; \
             paired ratios: bare/pread {:.3}, store/pread {:.3}, store/bare {:.3}, fixed/bare {:.3}",
            k(0), k(1), k(2), k(3),
            ratio(0, 3), ratio(2, 3), ratio(2, 0), ratio(1, 0)
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Some(rounds) = std::env::var("BFKV_STORE_PAIRED")
        .ok()
        .and_then(|r| r.parse().ok())
    {
        paired(rounds);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
