//! Large values against the device: write and read throughput of 1 MiB and 16 MiB values
//! stored out of line (the blob file), as a fraction of the device's sequential bandwidth
//! measured in the same run, on files in the same directory.
//!
//! - `device/seq_write_qd4`: a preallocated (fully written) 1 GiB file, `O_DIRECT`, 256 MiB
//!   per iteration in 1 MiB aligned requests, 4 threads each moving its own interleaved
//!   requests (queue depth 4); `_qd1`: one thread, one request after another; `_synced`:
//!   qd4 with an `fdatasync` at the end. Iterations move through the file region by region.
//!   The better of qd4 and qd1 is the device's write bandwidth.
//! - `blobs/write_{1,16}MiB_{none,sync}`: `insert` of 256 values of 1 MiB / 16 values of
//!   16 MiB (256 MiB per iteration, the same keys overwritten each iteration) under
//!   `Durability::None` and `Durability::Sync`, one thread, the default 8 KiB leaf pages.
//! - `blobs/read_{1,16}MiB`: `get` of those values (the `None` trees), after `close` and
//!   reopen; the blob file is `O_DIRECT`, and its cached pages (there should be none) are
//!   dropped before every pass too, so the page cache never serves them. Each iteration
//!   first reads the blob file itself raw (`O_DIRECT`, as many bytes as the gets read, in
//!   1 MiB requests at queue depth 4, then 1): the device's read bandwidth on the same file
//!   under the same conditions. A separate file read raw was no fair yardstick: the host's
//!   caches below the virtual disk served a recently written one at up to twice the rate.
//!
//! Then a table goes to stderr: each bfkv case's MiB/s (median over the criterion samples)
//! and its ratio to the device's bandwidth in the same direction (the project's goal is at
//! least 0.70), with two device figures that bound what bfkv can reach: writes extending a
//! file (the blob file grows as values are added), and writes with an `fdatasync` after
//! each value's bytes (a `Sync` insert syncs its value before its log record).
//!
//! Files go under `target/bench-data/` (or `$BFKV_BENCH_DIR`), which must be on the real
//! disk, not tmpfs. Criterion warns that 10 samples do not fit the target time: each sample
//! is one iteration, on purpose. `cargo test --benches` runs each case once on 16 MiB.
//!
//! ```sh
//! cargo bench --bench blobs
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

const MIB: usize = 1 << 20;
/// The device's request size.
const REQUEST: usize = MIB;
/// Threads (requests in flight) of the queue-depth-4 passes, as the blob file uses.
const DEPTH: usize = 4;

/// How much each case moves: a real run, or the one-shot check of `cargo test --benches`.
#[derive(Clone, Copy)]
struct Scale {
    /// Bytes per iteration, of every case.
    per_iter: usize,
    /// Bytes of the device file.
    device_file: usize,
}

impl Scale {
    fn from_args() -> Scale {
        let args: Vec<String> = std::env::args().collect();
        let has = |a: &str| args.iter().any(|x| x == a);
        // Criterion benchmarks only with `--bench` and without `--test` or `--list`.
        if has("--bench") && !has("--test") && !has("--list") {
            Scale {
                per_iter: 256 * MIB,
                device_file: 1024 * MIB,
            }
        } else {
            Scale {
                per_iter: 16 * MIB,
                device_file: 32 * MIB,
            }
        }
    }
}

/// A zeroed buffer of `len` bytes aligned to 4 KiB (direct I/O needs it), inside a vector.
struct Aligned {
    vec: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let vec = vec![0u8; len + 4096];
        let off = vec.as_ptr().align_offset(4096);
        Aligned { vec, off, len }
    }

    fn random(len: usize, seed: u64) -> Aligned {
        let mut a = Aligned::new(len);
        SmallRng::seed_from_u64(seed).fill_bytes(a.bytes_mut());
        a
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.vec[self.off..self.off + self.len]
    }
}

/// The file system type of the mount holding `path` (the longest mount point that is a
/// prefix of it, from `/proc/mounts`).
fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_dev, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            let point = PathBuf::from(point.replace("\\040", " "));
            path.starts_with(&point)
                .then(|| (point.as_os_str().len(), kind.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "unknown".to_string(), |(_, kind)| kind)
}

/// The directory the files go under: `$BFKV_BENCH_DIR`, else `target/bench-data`, else (if
/// that is tmpfs) the system temp directory if it is not.
fn bench_dir() -> tempfile::TempDir {
    let memory = |p: &Path| matches!(fs_type(p).as_str(), "tmpfs" | "ramfs");
    let mut base = std::env::var_os("BFKV_BENCH_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&base).expect("bench dir");
    if memory(&base) && !memory(&std::env::temp_dir()) {
        base = std::env::temp_dir();
    }
    let kind = fs_type(&base);
    if memory(&base) {
        eprintln!(
            "blobs: WARNING: {} is on {kind}: no device is measured",
            base.display()
        );
    }
    let dir = tempfile::Builder::new()
        .prefix("blobs-")
        .tempdir_in(&base)
        .expect("tempdir");
    eprintln!("blobs: files under {} ({kind})", dir.path().display());
    dir
}

fn open_direct(path: &Path, create: bool) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open with O_DIRECT")
}

/// Moves `bytes` at byte `start` of `file` in `request`-byte requests, one buffer (thread)
/// of `bufs` each: thread `t` moves requests `t`, `t + threads`, ... Writes write what the
/// buffers hold; reads overwrite it.
fn device_pass(
    file: &File,
    write: bool,
    start: u64,
    bytes: usize,
    request: usize,
    bufs: &mut [Aligned],
) {
    let threads = bufs.len();
    let requests = bytes / request;
    let io = |buf: &mut Aligned, t: usize| {
        for i in (t..requests).step_by(threads) {
            let at = start + (i * request) as u64;
            let buf = &mut buf.bytes_mut()[..request];
            if write {
                file.write_all_at(buf, at).expect("device write");
            } else {
                file.read_exact_at(buf, at).expect("device read");
            }
        }
    };
    if threads == 1 {
        io(&mut bufs[0], 0);
        return;
    }
    let io = &io;
    std::thread::scope(|s| {
        for (t, buf) in bufs.iter_mut().enumerate() {
            s.spawn(move || io(buf, t));
        }
    });
}

/// `bytes` over `secs` in MiB/s.
fn mib_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / MIB as f64 / secs
}

/// The median rate in MiB/s of the calls criterion made, `bytes` per iteration: (iterations,
/// time) of each. `None` if the case did not run (filtered out).
fn median(samples: &[(u64, Duration)], bytes: usize) -> Option<f64> {
    let mut rates: Vec<f64> = samples
        .iter()
        .map(|&(iters, time)| mib_s(bytes * iters as usize, time.as_secs_f64()))
        .collect();
    middle(&mut rates)
}

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
}

/// What the device groups measured, MiB/s, and the extra device figures.
#[derive(Default)]
struct Device {
    write_qd4: Option<f64>,
    /// The queue-depth-4 pass with one fdatasync at its end: what reaches stable storage
    /// (the unsynced passes also measure the virtual disk's write-back cache).
    write_qd4_synced: Option<f64>,
    write_qd1: Option<f64>,
    extending_write_qd4: f64,
    /// (value bytes, MiB/s) of writes with an fdatasync after each value's bytes.
    synced_write: Vec<(usize, f64)>,
}

fn best(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn device(c: &mut Criterion, dir: &Path, scale: Scale) -> Device {
    let path = dir.join("device");
    let file = open_direct(&path, true);
    let mut bufs: Vec<Aligned> = (0..DEPTH)
        .map(|t| Aligned::random(REQUEST, t as u64 + 1))
        .collect();
    let mut out = Device::default();
    // Preallocate by writing the whole file; timed, as what extending writes reach.
    let start = Instant::now();
    device_pass(&file, true, 0, scale.device_file, REQUEST, &mut bufs);
    out.extending_write_qd4 = mib_s(scale.device_file, start.elapsed().as_secs_f64());
    file.sync_all().expect("sync the device file");

    // Each value's bytes in the chunks the blob file would use (a quarter of the value,
    // 128 KiB to 1 MiB, by 4 threads), then fdatasync.
    for value in [MIB, 16 * MIB] {
        let chunk = (value / 4).clamp(128 << 10, MIB);
        let values = scale.per_iter / value;
        let start = Instant::now();
        for v in 0..values {
            device_pass(&file, true, (v * value) as u64, value, chunk, &mut bufs);
            file.sync_data().expect("fdatasync");
        }
        let rate = mib_s(values * value, start.elapsed().as_secs_f64());
        out.synced_write.push((value, rate));
    }

    let mut g = c.benchmark_group("device");
    configure(&mut g);
    g.throughput(Throughput::Bytes(scale.per_iter as u64));
    let regions = (scale.device_file / scale.per_iter) as u64;
    let mut region = 0u64;
    for (name, write, threads) in [
        ("seq_write_qd4", true, DEPTH),
        ("seq_write_qd4_synced", true, DEPTH),
        ("seq_write_qd1", true, 1),
    ] {
        let mut samples = Vec::new();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let at = (region % regions) * scale.per_iter as u64;
                    region += 1;
                    let start = Instant::now();
                    device_pass(
                        &file,
                        write,
                        at,
                        scale.per_iter,
                        REQUEST,
                        &mut bufs[..threads],
                    );
                    if name == "seq_write_qd4_synced" {
                        file.sync_data().expect("fdatasync");
                    }
                    total += start.elapsed();
                }
                samples.push((iters, total));
                total
            });
        });
        let rate = median(&samples, scale.per_iter);
        match name {
            "seq_write_qd4" => out.write_qd4 = rate,
            "seq_write_qd4_synced" => out.write_qd4_synced = rate,
            _ => out.write_qd1 = rate,
        }
    }
    g.finish();
    drop(file);
    std::fs::remove_file(&path).expect("remove the device file");
    out
}

fn key(i: usize) -> [u8; 12] {
    let mut k = *b"blob\0\0\0\0\0\0\0\0";
    k[4..].copy_from_slice(&(i as u64).to_be_bytes());
    k
}

/// A tree in its own directory, open or closed.
struct Store {
    dir: PathBuf,
    durability: Durability,
    tree: Option<Tree>,
    /// The round of `Values` its values were last written in (0: never).
    round: u64,
}

impl Store {
    fn new(base: &Path, name: &str, durability: Durability) -> Store {
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).expect("tree dir");
        Store {
            dir,
            durability,
            tree: None,
            round: 0,
        }
    }

    fn tree(&mut self) -> &Tree {
        let config = Config::new(&self.dir)
            .durability(self.durability)
            .cache_size(64 << 20);
        self.tree
            .get_or_insert_with(|| Tree::open(config).expect("open"))
    }

    fn close(&mut self) {
        if let Some(tree) = self.tree.take() {
            tree.close().expect("close");
        }
    }
}

/// One size of value: its buffer (random bytes; the first 16 are the key's number and the
/// round that wrote it), and how many keys make an iteration.
struct Values {
    size: usize,
    keys: usize,
    buf: Vec<u8>,
    round: u64,
}

impl Values {
    fn new(size: usize, scale: Scale) -> Values {
        let mut buf = vec![0u8; size];
        SmallRng::seed_from_u64(size as u64).fill_bytes(&mut buf);
        Values {
            size,
            keys: scale.per_iter / size,
            buf,
            round: 0,
        }
    }

    /// Writes every key once, in a new round; the time taken.
    fn write_all(&mut self, tree: &Tree) -> Duration {
        self.round += 1;
        let start = Instant::now();
        for k in 0..self.keys {
            self.buf[..8].copy_from_slice(&(k as u64).to_le_bytes());
            self.buf[8..16].copy_from_slice(&self.round.to_le_bytes());
            tree.insert(key(k), &self.buf).expect("insert");
        }
        start.elapsed()
    }
}

/// Drops whatever of `path` the page cache holds (nothing, if it is only ever accessed
/// with `O_DIRECT`).
fn drop_cached(path: &Path) {
    let file = File::open(path).expect("open the blob file");
    // SAFETY: a plain system call on a descriptor that stays open for its duration.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}

/// Label, whether a write, MiB/s of each bfkv case, and for reads the MiB/s of the same
/// blob file read raw in the same iterations (qd4, qd1).
type Results = Vec<(&'static str, bool, Option<f64>, Option<(f64, f64)>)>;

fn write_case(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    store: &mut Store,
    values: &mut Values,
) -> Option<f64> {
    let mut samples = Vec::new();
    g.throughput(Throughput::Bytes((values.keys * values.size) as u64));
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let tree = store.tree();
            let total = (0..iters).map(|_| values.write_all(tree)).sum();
            store.round = values.round;
            samples.push((iters, total));
            total
        });
    });
    if let Some(tree) = &store.tree {
        let s = tree.stats();
        eprintln!(
            "blobs/{name}: {} values ({} MiB) written to the blob file, {} MiB of it in use",
            s.blobs_written,
            s.blob_bytes_written >> 20,
            s.blob_bytes_in_use >> 20,
        );
    }
    store.close();
    median(&samples, values.keys * values.size)
}

fn read_case(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    store: &mut Store,
    values: &mut Values,
) -> (Option<f64>, Option<(f64, f64)>) {
    let mut samples = Vec::new();
    let (mut raw_qd4, mut raw_qd1) = (Vec::new(), Vec::new());
    let mut bufs: Vec<Aligned> = (0..DEPTH).map(|_| Aligned::new(REQUEST)).collect();
    let mut ready = false;
    let bytes = values.keys * values.size;
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            if !ready {
                if store.round == 0 {
                    // The write case was filtered out.
                    values.write_all(store.tree());
                    store.round = values.round;
                }
                store.close();
                ready = true;
            }
            let (round, keys, size) = (store.round, values.keys, values.size);
            let blobs = store.dir.join("blobs");
            let tree = store.tree();
            let raw = open_direct(&blobs, false);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // The device, on the very bytes the gets read, in the same iteration: the
                // host's caches below the virtual disk then favour neither side.
                for (threads, rates) in [(DEPTH, &mut raw_qd4), (1, &mut raw_qd1)] {
                    drop_cached(&blobs);
                    let start = Instant::now();
                    device_pass(&raw, false, 0, bytes, REQUEST, &mut bufs[..threads]);
                    rates.push(mib_s(bytes, start.elapsed().as_secs_f64()));
                }
                drop_cached(&blobs);
                let start = Instant::now();
                for k in 0..keys {
                    let v = tree.get(key(k)).expect("get").expect("a value");
                    assert_eq!(v.len(), size);
                    assert_eq!(v[..8], (k as u64).to_le_bytes());
                    assert_eq!(v[8..16], round.to_le_bytes());
                    std::hint::black_box(v);
                }
                total += start.elapsed();
            }
            samples.push((iters, total));
            total
        });
    });
    if let Some(tree) = &store.tree {
        let s = tree.stats();
        eprintln!(
            "blobs/{name}: {} values ({} MiB) read from the blob file since reopening",
            s.blobs_read,
            s.blob_bytes_read >> 20,
        );
    }
    store.close();
    let raw = match (middle(&mut raw_qd4), middle(&mut raw_qd1)) {
        (Some(qd4), Some(qd1)) => Some((qd4, qd1)),
        _ => None,
    };
    (median(&samples, bytes), raw)
}

/// The median of `rates` (sorted in place), `None` if empty.
fn middle(rates: &mut [f64]) -> Option<f64> {
    rates.sort_by(f64::total_cmp);
    let n = rates.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(rates[n / 2]),
        _ => Some(f64::midpoint(rates[n / 2 - 1], rates[n / 2])),
    }
}

fn tree_cases(c: &mut Criterion, dir: &Path, scale: Scale) -> Results {
    let mut small = Values::new(MIB, scale);
    let mut large = Values::new(16 * MIB, scale);
    let mut stores = [
        Store::new(dir, "none-1", Durability::None),
        Store::new(dir, "sync-1", Durability::Sync),
        Store::new(dir, "none-16", Durability::None),
        Store::new(dir, "sync-16", Durability::Sync),
    ];
    let [none_1, sync_1, none_16, sync_16] = &mut stores;
    let mut g = c.benchmark_group("blobs");
    configure(&mut g);
    let mut out = Results::new();
    let w = write_case(&mut g, "write_1MiB_none", none_1, &mut small);
    out.push(("write 1 MiB None", true, w, None));
    let w = write_case(&mut g, "write_1MiB_sync", sync_1, &mut small);
    out.push(("write 1 MiB Sync", true, w, None));
    let w = write_case(&mut g, "write_16MiB_none", none_16, &mut large);
    out.push(("write 16 MiB None", true, w, None));
    let w = write_case(&mut g, "write_16MiB_sync", sync_16, &mut large);
    out.push(("write 16 MiB Sync", true, w, None));
    // The reads are of the `None` trees; the `Sync` ones are not needed again.
    for store in [&mut *sync_1, &mut *sync_16] {
        std::fs::remove_dir_all(&store.dir).expect("remove a tree");
    }
    let (r, raw) = read_case(&mut g, "read_1MiB", none_1, &mut small);
    out.push(("read 1 MiB", false, r, raw));
    let (r, raw) = read_case(&mut g, "read_16MiB", none_16, &mut large);
    out.push(("read 16 MiB", false, r, raw));
    g.finish();
    out
}

fn blobs(c: &mut Criterion) {
    let scale = Scale::from_args();
    let dir = bench_dir();
    let device = device(c, dir.path(), scale);
    let results = tree_cases(c, dir.path(), scale);
    let show = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.0}"));
    let write = best(device.write_qd4, device.write_qd1);
    eprintln!("\nblobs against the device (MiB/s, medians of the criterion samples):");
    eprintln!(
        "device seq write: qd4 {}, qd1 {} -> {}; qd4 with one fdatasync per {} MiB: {}",
        show(device.write_qd4),
        show(device.write_qd1),
        show(write),
        scale.per_iter / MIB,
        show(device.write_qd4_synced),
    );
    let ratio = |rate: f64, dev: Option<f64>| {
        dev.map_or_else(|| "-".into(), |d| format!("{:.2}", rate / d))
    };
    for (label, is_write, rate, raw) in results {
        let Some(rate) = rate else {
            eprintln!("{label}: -");
            continue;
        };
        if is_write {
            // Against the unsynced rate (partly the disk's cache) and the synced one (what
            // a durable write can reach); Sync writes also against an fdatasync per value.
            let per_value = device
                .synced_write
                .iter()
                .find(|(v, _)| label.contains(&format!(" {} MiB ", v / MIB)))
                .map(|&(_, r)| r)
                .filter(|_| label.ends_with("Sync"));
            eprintln!(
                "{label}: {rate:.0} MiB/s = {} of device {}, {} of device synced {}{}",
                ratio(rate, write),
                show(write),
                ratio(rate, device.write_qd4_synced),
                show(device.write_qd4_synced),
                per_value.map_or_else(String::new, |p| format!(
                    ", {} of device with an fdatasync per value {p:.0}",
                    ratio(rate, Some(p))
                )),
            );
        } else {
            // Against the same blob file read raw in the same iterations (the better of
            // queue depth 4 and 1).
            let device = raw.map(|(qd4, qd1)| qd4.max(qd1));
            eprintln!(
                "{label}: {rate:.0} MiB/s = {} of the blob file read raw {} (qd4 {}, qd1 {})",
                ratio(rate, device),
                show(device),
                show(raw.map(|r| r.0)),
                show(raw.map(|r| r.1)),
            );
        }
    }
    eprintln!(
        "device, one pass: extending write qd4 {:.0} MiB/s",
        device.extending_write_qd4
    );
    for (value, rate) in device.synced_write {
        eprintln!(
            "device, one pass: write + fdatasync every {} MiB {rate:.0} MiB/s",
            value / MIB
        );
    }
}

criterion_group!(benches, blobs);
criterion_main!(benches);
