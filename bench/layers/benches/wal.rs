//! Write-ahead log throughput: `Sync` append+commit with 1, 2 and 4 threads (group commit
//! must keep fsyncs per operation below 0.6 at 4 threads), and `Buffered` append+commit and
//! bare append. Records are a 16-byte key and a 100-byte value.
//!
//! Run: `cd bench/layers && cargo bench --bench wal`. The log lives under
//! `target/bench-data/` (or `$BFKV_BENCH_DIR`), on the same file system as the data file
//! would be; fsyncs per operation are printed after each group (`wal-stats:` lines).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bfkv::internals::WalBench;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const VALUE: [u8; 100] = [0x5a; 100];

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("BFKV_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"));
    std::fs::create_dir_all(&base).expect("bench dir");
    base
}

/// `iters` operations spread over `threads` threads, each an append and, if `commit`, a
/// commit; wall time.
fn run(wal: &WalBench, threads: u64, iters: u64, commit: bool) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut key = [0u8; 16];
                key[0] = t as u8;
                for i in (t..iters).step_by(threads as usize) {
                    key[8..].copy_from_slice(&i.to_le_bytes());
                    let appended = wal.append(&key, Some(&VALUE)).expect("append");
                    if commit {
                        wal.commit(appended).expect("commit");
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed();
    // Keep the disk footprint to the active segment, as checkpoints would.
    wal.release_before(wal.next_lsn()).expect("release");
    elapsed
}

fn report(name: &str, wal: &WalBench) {
    let s = wal.stats();
    if s.appends == 0 {
        return; // filtered out
    }
    println!(
        "wal-stats: {name}: {} ops, {} fsyncs, {:.3} fsyncs/op, {:.3} writes/op",
        s.appends,
        s.syncs,
        s.syncs as f64 / s.appends.max(1) as f64,
        s.writes as f64 / s.appends.max(1) as f64
    );
}

fn sync_commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("wal_sync_append_commit");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(4));
    for threads in [1u64, 2, 4] {
        let dir = tempfile::tempdir_in(bench_dir()).expect("tempdir");
        let wal = WalBench::open(dir.path(), true, 64 << 20).expect("open");
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| run(&wal, threads, iters, true))
        });
        report(&format!("sync {threads} threads"), &wal);
    }
    g.finish();
}

fn buffered(c: &mut Criterion) {
    let mut g = c.benchmark_group("wal_buffered");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(3));
    for (name, threads, commit) in [
        ("append_commit_1_thread", 1u64, true),
        ("append_commit_4_threads", 4, true),
        ("append_only_1_thread", 1, false),
    ] {
        let dir = tempfile::tempdir_in(bench_dir()).expect("tempdir");
        let wal = WalBench::open(dir.path(), false, 64 << 20).expect("open");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| run(&wal, threads, iters, commit))
        });
        report(&format!("buffered {name}"), &wal);
    }
    g.finish();
}

criterion_group!(benches, sync_commit, buffered);
criterion_main!(benches);
