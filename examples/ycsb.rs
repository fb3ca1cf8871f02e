//! The bfkv demo: YCSB on a dataset larger than the cache.
//!
//! `cargo run --release --example ycsb` loads 1M records (16-byte keys and values) into a
//! temporary directory with a 4 MiB cache, runs YCSB A, B, C, E and F (Zipf 0.9, 2 threads,
//! 8 s each) and prints throughput, latency percentiles, the cache hit ratio and disk pages
//! read and written per operation. `--help` lists the options; workloads and record format
//! are those of `docs/workloads.md` (crate `bfkv-workload`).
//!
//! Every value read back is checked against the record it belongs to, so a wrong answer
//! fails the run instead of inflating its throughput.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, IoBackend, Stats, Tree};
use bfkv_workload::engines::Bfkv;
use bfkv_workload::runner::{self, BoxError, Latency, Outcome, RunSpec, Stop, Workload};
use bfkv_workload::{Distribution, Phase, KEY_LEN};
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// YCSB workloads against bfkv on a dataset larger than its cache.
#[derive(Parser, Debug, Clone)]
#[command(
    about = "YCSB workloads against bfkv on a dataset larger than its cache",
    long_about = None
)]
struct Args {
    /// Workloads to run after the load, in order: letters of A B C E F U, comma-separated.
    /// A letter given again draws operations of its own, not those of its last run.
    #[arg(short, long, default_value = "A,B,C,E,F", value_delimiter = ',', value_parser = parse_phases)]
    workloads: Vec<Phase>,
    /// Records loaded before the workloads.
    #[arg(short = 'n', long, default_value_t = 1_000_000)]
    records: u64,
    /// Key size in bytes (>= 8): 8 bytes of the record's hash, then zeros.
    #[arg(long, default_value_t = KEY_LEN)]
    key_size: usize,
    /// Value size in bytes (>= 16; 100 is the large-value variant).
    #[arg(long, default_value_t = 16)]
    value_size: usize,
    /// Record choice: `zipf` (θ = 0.9), `zipf:<θ>` or `uniform`.
    #[arg(short, long, default_value = "zipf", value_parser = parse_distribution)]
    distribution: Distribution,
    /// Worker threads.
    #[arg(short, long, default_value_t = 2)]
    threads: usize,
    /// Cache (circular buffer) size: bytes, or with a K/M/G suffix (binary units).
    #[arg(short, long, default_value = "4M", value_parser = parse_size)]
    cache_size: usize,
    /// When writes become durable (default: what `Config` gives a user, `buffered`).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Buffered)]
    durability: DurabilityArg,
    /// Page-store backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    io_backend: BackendArg,
    /// Log kept past where replay starts before a checkpoint moves it
    /// (`Config::checkpoint_log_bytes`; default: `Config`'s).
    #[arg(long, value_parser = parse_size)]
    checkpoint_log: Option<usize>,
    /// Log segment file size (default: `Config`'s).
    #[arg(long, value_parser = parse_size)]
    log_segment: Option<usize>,
    /// Write buffered leaves back once writes have paused this many milliseconds, or `off`
    /// (`Config::idle_write_back`; default: `Config`'s, 50).
    #[arg(long, value_parser = parse_idle)]
    idle_write_back: Option<Idle>,
    /// Leaf page size: bytes, or with a K suffix (default: `Config`'s, 8 KiB).
    #[arg(long, value_parser = parse_size)]
    page_size: Option<usize>,
    /// Seconds per workload (ignored with --ops).
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Operations per workload, split over the threads (instead of --duration).
    #[arg(long)]
    ops: Option<u64>,
    /// Directory for the database (default: a temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the operation streams.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the results as JSON on stdout (progress and notes go to stderr).
    #[arg(long)]
    json: bool,
}

/// `--durability` values.
#[derive(ValueEnum, Debug, Clone, Copy)]
enum DurabilityArg {
    /// No log; durable at flush/close.
    None,
    /// Log written to the OS, synced in the background.
    Buffered,
    /// Log synced before a write returns.
    Sync,
}

/// `--io-backend` values.
#[derive(ValueEnum, Debug, Clone, Copy)]
enum BackendArg {
    /// `io_uring` on Linux.
    Auto,
    /// `io_uring`.
    Uring,
    /// pread/pwrite.
    Pread,
}

/// Parses a workload list such as `A,C,E`.
fn parse_phases(s: &str) -> Result<Phase, String> {
    let mut chars = s.trim().chars();
    match (chars.next().and_then(Phase::from_letter), chars.next()) {
        (Some(p), None) if p != Phase::Load => Ok(p),
        _ => Err(format!("`{s}` is not one of A B C E F U")),
    }
}

/// Parses `zipf`, `zipf:<θ>` or `uniform`.
fn parse_distribution(s: &str) -> Result<Distribution, String> {
    match s.split_once(':') {
        _ if s == "uniform" => Ok(Distribution::Uniform),
        _ if s == "zipf" => Ok(Distribution::Zipf(bfkv_workload::DEFAULT_THETA)),
        Some(("zipf", t)) => match t.parse::<f64>() {
            Ok(theta) if theta > 0.0 && theta < 1.0 => Ok(Distribution::Zipf(theta)),
            _ => Err(format!("θ must be a number in (0, 1), got `{t}`")),
        },
        _ => Err(format!("`{s}`: expected zipf, zipf:<θ> or uniform")),
    }
}

/// Parses `4096`, `64K`, `32M`, `1G`.
fn parse_size(s: &str) -> Result<usize, String> {
    let s = s
        .trim()
        .trim_end_matches(['B', 'b'])
        .trim_end_matches(['i']);
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 10),
        Some((i, 'M' | 'm')) => (&s[..i], 20),
        Some((i, 'G' | 'g')) => (&s[..i], 30),
        _ => (s, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{s}` is not a size like 4096, 64K, 32M or 1G"))
}

/// An `--idle-write-back` value: the pause, or none (off).
#[derive(Debug, Clone, Copy)]
struct Idle(Option<Duration>);

/// Parses `off` or a number of milliseconds.
fn parse_idle(s: &str) -> Result<Idle, String> {
    if s.trim() == "off" {
        return Ok(Idle(None));
    }
    s.trim()
        .parse::<u64>()
        .map(|ms| Idle(Some(Duration::from_millis(ms))))
        .map_err(|_| format!("`{s}`: expected `off` or milliseconds"))
}

/// What one phase measured.
struct PhaseResult {
    /// Phase letter.
    phase: Phase,
    /// Operations, wall time and latency percentiles, from the runner.
    outcome: Outcome,
    /// Counter deltas over the phase.
    stats: Stats,
}

impl PhaseResult {
    /// Share of lookups answered from memory, if there were any.
    fn hit_ratio(&self) -> Option<f64> {
        let total = self.stats.cache_hits + self.stats.cache_misses;
        (total > 0).then(|| self.stats.cache_hits as f64 / total as f64)
    }

    /// A counter per operation.
    fn per_op(&self, n: u64) -> f64 {
        n as f64 / self.outcome.ops.max(1) as f64
    }

    /// Latency percentiles in microseconds: median, 99th and 99.9th.
    fn micros(&self) -> (f64, f64, f64) {
        let l = self.outcome.latency.unwrap_or(Latency {
            p50: 0,
            p99: 0,
            p999: 0,
        });
        let us = |ns: u64| ns as f64 / 1e3;
        (us(l.p50), us(l.p99), us(l.p999))
    }
}

/// Counter deltas `after - before` for the fields the report uses.
fn stats_delta(before: &Stats, after: &Stats) -> Stats {
    let mut d = *after;
    d.cache_hits -= before.cache_hits;
    d.cache_misses -= before.cache_misses;
    d.promotions -= before.promotions;
    d.merges -= before.merges;
    d.evictions -= before.evictions;
    d.pages_read -= before.pages_read;
    d.pages_written -= before.pages_written;
    d.splits -= before.splits;
    d
}

/// Runs one phase through the shared runner and returns what it measured. `earlier` counts
/// the runs of the same phase before it: each gets operations of its own (the streams are
/// seeded per phase), instead of replaying the last one's, whose records the cache now holds.
fn run_phase(
    engine: &Bfkv,
    args: &Args,
    phase: Phase,
    earlier: usize,
    next_insert: &Arc<AtomicU64>,
) -> Result<PhaseResult, BoxError> {
    let spec = RunSpec {
        dist: args.distribution,
        seed: args
            .seed
            .wrapping_add((earlier as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        value_len: args.value_size,
        key_len: args.key_size,
        timed: true,
        ..RunSpec::new(args.records, args.threads.max(1))
    };
    let (stop, bar_len, timed_bar) = match (phase, args.ops) {
        (Phase::Load, _) => (
            Stop {
                ops: u64::MAX,
                time: None,
            },
            args.records,
            false,
        ),
        (_, Some(n)) => (Stop { ops: n, time: None }, n, false),
        (_, None) => {
            let d = Duration::from_secs_f64(args.duration.max(0.1));
            let stop = Stop {
                ops: u64::MAX,
                time: Some(d),
            };
            (stop, d.as_millis() as u64, true)
        }
    };
    let bar = progress_bar(phase, bar_len, args.json);
    let done = AtomicU64::new(0);
    let before = engine.0.stats();
    let start = Instant::now();
    let outcome = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            runner::run_with_progress(
                engine,
                Workload::Phase(phase),
                spec,
                stop,
                next_insert,
                &done,
            )
        });
        while !runner.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            let pos = if timed_bar {
                start.elapsed().as_millis() as u64
            } else {
                done.load(Ordering::Relaxed)
            };
            bar.set_position(pos.min(bar_len));
            bar.set_message(format!("{} ops", done.load(Ordering::Relaxed)));
        }
        runner
            .join()
            .unwrap_or_else(|_| Err("the runner panicked".into()))
    });
    bar.finish_and_clear();
    Ok(PhaseResult {
        phase,
        outcome: outcome?,
        stats: stats_delta(&before, &engine.0.stats()),
    })
}

/// The progress bar of one phase (hidden with `--json`).
fn progress_bar(phase: Phase, len: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let name = if phase == Phase::Load {
        "load".to_string()
    } else {
        format!("YCSB-{}", phase.letter())
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix:>7} [{elapsed_precise}] {wide_bar} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(name);
    bar
}

/// Total size of the regular files directly in `dir`.
/// What the tree's directory holds on disk: its data and checkpoint files (their lengths),
/// and its log (the blocks the `wal/` files occupy: segments are allocated ahead).
#[derive(Clone, Copy)]
struct Disk {
    data: u64,
    log: u64,
}

impl Disk {
    fn of(dir: &Path) -> Disk {
        Disk {
            data: files_in(dir).map(|m| m.len()).sum(),
            log: files_in(&dir.join("wal")).map(|m| allocated(&m)).sum(),
        }
    }
}

fn files_in(dir: &Path) -> impl Iterator<Item = std::fs::Metadata> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(std::fs::Metadata::is_file)
}

#[cfg(unix)]
fn allocated(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(m) * 512
}

#[cfg(not(unix))]
fn allocated(m: &std::fs::Metadata) -> u64 {
    m.len()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Peak resident set of this process in bytes (Linux; 0 elsewhere).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0)
}

/// Prints the results as an aligned table.
fn print_table(results: &[PhaseResult]) {
    println!(
        "{:<7} {:>10} {:>11} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8}",
        "phase", "ops", "ops/s", "p50 µs", "p99 µs", "p99.9 µs", "hit %", "reads/op", "writes/op"
    );
    for r in results {
        let name = match r.phase {
            Phase::Load => "load".to_string(),
            p => format!("YCSB-{}", p.letter()),
        };
        let hit = r
            .hit_ratio()
            .map_or("-".into(), |h| format!("{:.1}", h * 100.0));
        let (p50, p99, p999) = r.micros();
        println!(
            "{:<7} {:>10} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>8.3} {:>8.3}",
            name,
            r.outcome.ops,
            r.outcome.ops_per_sec(),
            p50,
            p99,
            p999,
            hit,
            r.per_op(r.stats.pages_read),
            r.per_op(r.stats.pages_written),
        );
    }
}

/// Prints the results as one JSON object.
fn print_json(args: &Args, results: &[PhaseResult], disk: [Disk; 3]) {
    let distribution = match args.distribution {
        Distribution::Uniform => "\"uniform\"".to_string(),
        Distribution::Zipf(t) => format!("\"zipf:{t}\""),
    };
    let phases: Vec<String> = results
        .iter()
        .map(|r| {
            let (p50, p99, p999) = r.micros();
            format!(
                concat!(
                    "{{\"phase\":\"{}\",\"ops\":{},\"seconds\":{:.3},\"ops_per_sec\":{:.1},",
                    "\"p50_us\":{:.2},\"p99_us\":{:.2},\"p999_us\":{:.2},\"hit_ratio\":{},",
                    "\"pages_read_per_op\":{:.4},\"pages_written_per_op\":{:.4},",
                    "\"evictions\":{},\"merges\":{},\"promotions\":{},\"splits\":{}}}"
                ),
                r.phase.letter(),
                r.outcome.ops,
                r.outcome.elapsed.as_secs_f64(),
                r.outcome.ops_per_sec(),
                p50,
                p99,
                p999,
                r.hit_ratio().map_or("null".into(), |h| format!("{h:.4}")),
                r.per_op(r.stats.pages_read),
                r.per_op(r.stats.pages_written),
                r.stats.evictions,
                r.stats.merges,
                r.stats.promotions,
                r.stats.splits,
            )
        })
        .collect();
    println!(
        concat!(
            "{{\"records\":{},\"key_size\":{},\"value_size\":{},\"distribution\":{},",
            "\"threads\":{},\"cache_size\":{},\"durability\":\"{:?}\",",
            "\"disk_bytes_after_load\":{},\"disk_bytes_after_workloads\":{},",
            "\"disk_bytes_at_end\":{},\"log_bytes_after_load\":{},",
            "\"log_bytes_after_workloads\":{},\"log_bytes_at_end\":{},\"peak_rss\":{},",
            "\"phases\":[{}]}}"
        ),
        args.records,
        args.key_size,
        args.value_size,
        distribution,
        args.threads,
        args.cache_size,
        args.durability,
        disk[0].data,
        disk[1].data,
        disk[2].data,
        disk[0].log,
        disk[1].log,
        disk[2].log,
        peak_rss(),
        phases.join(",")
    );
}

/// Opens the tree, runs the load and the workloads, prints the report.
fn run(args: &Args) -> Result<(), BoxError> {
    if args.key_size < 8 || args.value_size < 16 {
        return Err("--key-size must be >= 8 and --value-size >= 16".into());
    }
    let temp;
    let dir = if let Some(d) = &args.dir {
        d.clone()
    } else {
        temp = tempfile::tempdir()?;
        temp.path().to_path_buf()
    };
    let durability = match args.durability {
        DurabilityArg::None => Durability::None,
        DurabilityArg::Buffered => Durability::Buffered,
        DurabilityArg::Sync => Durability::Sync,
    };
    let backend = match args.io_backend {
        BackendArg::Auto => IoBackend::Auto,
        BackendArg::Uring => IoBackend::IoUring,
        BackendArg::Pread => IoBackend::Pread,
    };
    let mut config = Config::new(&dir)
        .cache_size(args.cache_size)
        .durability(durability)
        .io_backend(backend);
    if let Some(bytes) = args.checkpoint_log {
        config = config.checkpoint_log_bytes(bytes as u64);
    }
    if let Some(bytes) = args.log_segment {
        config = config.log_segment_size(bytes as u64);
    }
    if let Some(bytes) = args.page_size {
        config = config.page_size(bytes);
    }
    if let Some(Idle(pause)) = args.idle_write_back {
        config = config.idle_write_back(pause);
    }
    let engine = Bfkv(Tree::open(config)?);
    let raw = args.records * (args.key_size + args.value_size) as u64;
    eprintln!(
        "bfkv YCSB: {} records ({} B keys, {} B values, {:.0} MiB raw), cache {:.1} MiB, {} threads, {:?}, durability {:?}, in {}",
        args.records,
        args.key_size,
        args.value_size,
        raw as f64 / f64::from(1 << 20),
        args.cache_size as f64 / f64::from(1 << 20),
        args.threads,
        args.distribution,
        args.durability,
        dir.display()
    );
    let next_insert = Arc::new(AtomicU64::new(args.records));
    let mut results = vec![run_phase(&engine, args, Phase::Load, 0, &next_insert)?];
    let after_load = Disk::of(&dir);
    for (i, &phase) in args.workloads.iter().enumerate() {
        let before = args.workloads[..i].iter().filter(|&&p| p == phase).count();
        results.push(run_phase(&engine, args, phase, before, &next_insert)?);
    }
    let before_close = Disk::of(&dir);
    let page_size = engine.0.page_size();
    engine.0.close()?;
    let at_end = Disk::of(&dir);
    if args.json {
        print_json(args, &results, [after_load, before_close, at_end]);
    } else {
        print_table(&results);
        println!(
            "disk: {:.1} MiB data + {:.1} MiB log after load, {:.1} + {:.1} MiB after the workloads, {:.1} + {:.1} MiB after close; peak RSS {:.1} MiB; reads/writes are {} KiB leaf pages per operation",
            mib(after_load.data),
            mib(after_load.log),
            mib(before_close.data),
            mib(before_close.log),
            mib(at_end.data),
            mib(at_end.log),
            peak_rss() as f64 / f64::from(1 << 20),
            page_size >> 10,
        );
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("ycsb: {e}");
        std::process::exit(1);
    }
}
