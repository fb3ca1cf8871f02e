//! bfkv against Microsoft's `bf-tree` 0.5.7, side by side: same records, same operations,
//! same cache size, both on direct I/O (bfkv: `io_uring` + `O_DIRECT`, no log; bf-tree:
//! `IoUringBlocking`, no WAL), one process per engine and thread count.
//!
//! ```sh
//! cargo run --release --example vs_bftree                    # 5M records, 32 MiB cache, 1 and 2 threads
//! cargo run --release --example vs_bftree -- -n 2000000 -c 1G -w L,C,update,insert   # data fits in cache
//! cargo run --release --example vs_bftree -- -w C,A --warmup 8  # each phase measured after 8 s untimed
//! ```
//!
//! The parent process re-runs itself once per (engine, threads, repetition) with `--engine`,
//! alternating the engines, and prints the medians; the ratio column is the median of each
//! repetition's bfkv / bf-tree ops/s. Disk traffic per
//! operation comes from `/proc/self/io` for both engines (4 KiB units, direct I/O counted)
//! and, for bfkv, also from its own leaf-page counters.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bfkv::Durability;
use bfkv_workload::engines::{Bfkv, MsBfTree};
use bfkv_workload::runner::{self, BoxError, Engine, RunSpec, Stop, Workload};
use bfkv_workload::{Phase, DEFAULT_THETA};
use clap::Parser;

/// bfkv vs bf-tree 0.5.7 on the docs/workloads.md phases.
#[derive(Parser, Debug, Clone)]
#[command(about = "bfkv vs Microsoft's bf-tree 0.5.7, side by side", long_about = None)]
struct Args {
    /// Records loaded.
    #[arg(short = 'n', long, default_value_t = 5_000_000)]
    records: u64,
    /// Cache bytes for both engines (a power of two: bf-tree requires it); K/M/G suffixes.
    #[arg(short, long, default_value = "32M", value_parser = parse_size)]
    cache_size: usize,
    /// Thread counts to run, comma-separated.
    #[arg(short, long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Phases after the load, in order: A B C E F U (Zipf 0.9; U uniform), `insert` (new
    /// records) or `update` (Zipf overwrites). The load always runs first.
    #[arg(short, long, default_value = "C,A,E,U", value_delimiter = ',', value_parser = parse_work)]
    workloads: Vec<Workload>,
    /// Seconds per phase after the load.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Operations per phase instead of a duration.
    #[arg(long)]
    ops: Option<u64>,
    /// Seconds each phase after the load first runs untimed, on its own operation stream,
    /// as the Bf-Tree paper warms up before it measures (0: measure from a cold cache).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Repetitions per engine and thread count (the table shows medians).
    #[arg(short, long, default_value_t = 2)]
    runs: usize,
    /// Parent directory for the databases (default: the system temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The peer: `bf-tree` (file-backed, direct I/O) or `bf-tree-cache-only` (its in-memory
    /// mode, for data that fits in the cache).
    #[arg(long, default_value = "bf-tree")]
    peer: String,
    /// bfkv's read-promotion percentage (default: bfkv's own default, 100; bf-tree's is 30).
    #[arg(long)]
    bfkv_promotion: Option<u8>,
    /// bfkv's leaf page size in bytes (default: bfkv's own default, 8 KiB).
    #[arg(long)]
    bfkv_page_size: Option<usize>,
    /// Internal: run one engine in this process and print raw results.
    #[arg(long, hide = true)]
    engine: Option<String>,
}

/// Mixed into the seed of warm-up runs, so they draw a different operation stream.
const WARMUP_SEED: u64 = 0x5741_524d;

/// Parses a phase letter, `insert` or `update`.
fn parse_work(s: &str) -> Result<Workload, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "insert" => Ok(Workload::Insert),
        "update" => Ok(Workload::Update),
        one => {
            let mut chars = one.chars();
            match (chars.next().and_then(Phase::from_letter), chars.next()) {
                (Some(p), None) if p != Phase::Load => Ok(Workload::Phase(p)),
                _ => Err(format!(
                    "`{s}`: expected one of A B C E F U, insert, update"
                )),
            }
        }
    }
}

/// Parses `4096`, `64K`, `32M`, `1G`.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{s}` is not a size like 4096, 64K, 32M or 1G"))
}

/// One phase's result as the child prints it and the parent reads it.
#[derive(Debug, Clone, Default)]
struct Row {
    /// Workload name.
    name: String,
    /// Operations per second.
    ops_per_sec: f64,
    /// 4 KiB units read / written per op (`/proc/self/io`).
    proc_rw: (f64, f64),
    /// Leaf pages read / written per op (engine counters; NaN if none).
    leaf_rw: (f64, f64),
}

/// Child mode: loads and runs every phase on one engine, printing one tab-separated line
/// per phase on stdout.
fn child(args: &Args, engine_name: &str) -> Result<(), BoxError> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base)?;
    let bfkv = match engine_name {
        "bfkv" => Some(Bfkv::open(
            dir.path(),
            args.cache_size,
            Durability::None,
            args.bfkv_promotion,
            args.bfkv_page_size,
        )?),
        _ => None,
    };
    let peer: Option<MsBfTree> = match engine_name {
        "bfkv" => None,
        "bf-tree" => Some(MsBfTree::open(dir.path(), args.cache_size)?),
        "bf-tree-cache-only" => Some(MsBfTree::open_cache_only(args.cache_size)?),
        other => return Err(format!("unknown engine {other}").into()),
    };
    let engine: &dyn Engine = match (&bfkv, &peer) {
        (Some(b), _) => b,
        (_, Some(p)) => p,
        _ => return Err("no engine".into()),
    };
    let threads = args.threads.first().copied().unwrap_or(1);
    let spec = RunSpec::new(args.records, threads);
    let stop = match args.ops {
        Some(ops) => Stop { ops, time: None },
        None => Stop {
            ops: u64::MAX,
            time: Some(Duration::from_secs_f64(args.duration.max(0.1))),
        },
    };
    let next_insert = Arc::new(AtomicU64::new(args.records));
    let load_stop = Stop {
        ops: u64::MAX,
        time: None,
    };
    let mut work = vec![(Workload::Phase(Phase::Load), load_stop)];
    work.extend(args.workloads.iter().map(|&w| (w, stop)));
    for (w, stop) in work {
        if args.warmup > 0.0 && w != Workload::Phase(Phase::Load) {
            // A seed of its own: replaying the timed stream would warm exactly the records
            // the timed run then asks for, which favours whichever engine caches more.
            let warm = RunSpec {
                seed: spec.seed ^ WARMUP_SEED,
                ..spec
            };
            let warm_stop = Stop {
                ops: u64::MAX,
                time: Some(Duration::from_secs_f64(args.warmup.min(86_400.0))),
            };
            runner::run(engine, w, warm, warm_stop, &next_insert)?;
        }
        let out = runner::run(engine, w, spec, stop, &next_insert)?;
        // `BFKV_CENSUS=1` (in a build with `RUSTFLAGS="--cfg bfkv_internals"`): where bfkv's cache is after each
        // phase, on stderr.
        #[cfg(any(fuzzing, bfkv_internals))]
        if let (Some(b), Some(_)) = (&bfkv, std::env::var_os("BFKV_CENSUS")) {
            eprintln!("census after {}:\n{}", w.name(), b.0.census());
        }
        let (pr, pw) = out.proc_pages_per_op().unwrap_or((f64::NAN, f64::NAN));
        let (lr, lw) = out.leaf_pages_per_op().unwrap_or((f64::NAN, f64::NAN));
        println!(
            "{}\t{:.1}\t{pr:.4}\t{pw:.4}\t{lr:.4}\t{lw:.4}",
            w.name(),
            out.ops_per_sec()
        );
    }
    Ok(())
}

/// Parses the child's output.
fn parse_rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let num = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok());
            Some(Row {
                name: (*f.first()?).to_string(),
                ops_per_sec: num(1)?,
                proc_rw: (num(2)?, num(3)?),
                leaf_rw: (num(4)?, num(5)?),
            })
        })
        .collect()
}

/// Median of `xs` (NaN if empty).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => f64::midpoint(xs[n / 2 - 1], xs[n / 2]),
    }
}

/// Drops the OS page cache between engines where permitted (needs root); both engines use
/// direct I/O, so this only matters for their metadata files.
fn drop_page_cache() -> bool {
    // A failed `sync` only means dirtier caches; the runs are still valid.
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Runs one child and returns its rows.
fn spawn(args: &Args, engine: &str, threads: usize) -> Result<Vec<Row>, BoxError> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--engine", engine, "--threads", &threads.to_string()])
        .args(["--records", &args.records.to_string()])
        .args(["--cache-size", &args.cache_size.to_string()])
        .args(["--duration", &args.duration.to_string()])
        .args(["--warmup", &args.warmup.to_string()]);
    let names: Vec<String> = args.workloads.iter().map(|w| workload_arg(*w)).collect();
    if !names.is_empty() {
        cmd.args(["--workloads", &names.join(",")]);
    }
    if let Some(n) = args.ops {
        cmd.args(["--ops", &n.to_string()]);
    }
    if let Some(p) = args.bfkv_promotion {
        cmd.args(["--bfkv-promotion", &p.to_string()]);
    }
    if let Some(bytes) = args.bfkv_page_size {
        cmd.args(["--bfkv-page-size", &bytes.to_string()]);
    }
    if let Some(d) = &args.dir {
        cmd.arg("--dir").arg(d);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "{engine} ({threads} threads) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(parse_rows(&String::from_utf8_lossy(&out.stdout)))
}

/// The command-line spelling of a workload.
fn workload_arg(w: Workload) -> String {
    match w {
        Workload::Phase(p) => p.letter().to_string(),
        Workload::Insert => "insert".into(),
        Workload::Update => "update".into(),
    }
}

/// Parent mode: every (threads, engine, repetition) in its own process, then the table.
fn parent(args: &Args) -> Result<(), BoxError> {
    let dropped = drop_page_cache();
    println!(
        "bfkv vs {}: {} records (16 B keys, 16 B values), cache {} MiB, Zipf {DEFAULT_THETA}, {} per phase after {} s of warm-up, median of {} runs; page cache dropped between engines: {}",
        args.peer,
        args.records,
        args.cache_size >> 20,
        args.ops
            .map_or(format!("{} s", args.duration), |n| format!("{n} ops")),
        args.warmup,
        args.runs,
        if dropped { "yes" } else { "no (not permitted)" }
    );
    println!(
        "{:>3} {:<9} {:>11} {:>11} {:>6} | {:>15} {:>15} | {:>15}",
        "thr",
        "phase",
        "bfkv op/s",
        "peer op/s",
        "ratio",
        "bfkv io r/w/op",
        "peer io r/w",
        "bfkv leaf r/w"
    );
    for &threads in &args.threads {
        // Runs alternate between the engines (and which goes first), so the device's drift
        // over minutes, which moves either engine by 20-30 %, hits both alike; the ratio
        // column is the median of the per-run ratios.
        let engines = ["bfkv", args.peer.as_str()];
        let mut per_engine: Vec<Vec<Vec<Row>>> = vec![Vec::new(), Vec::new()];
        for run in 0..args.runs.max(1) {
            let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
            for e in order {
                let engine = engines[e];
                drop_page_cache();
                let rows = spawn(args, engine, threads)?;
                let summary: Vec<String> = rows
                    .iter()
                    .map(|r| format!("{} {:.0}", r.name, r.ops_per_sec))
                    .collect();
                eprintln!(
                    "{engine} {threads}t run {}: {}",
                    run + 1,
                    summary.join(", ")
                );
                per_engine[e].push(rows);
            }
        }
        let phases: Vec<String> = per_engine[0][0].iter().map(|r| r.name.clone()).collect();
        for (i, name) in phases.iter().enumerate() {
            let med = |e: usize, f: &dyn Fn(&Row) -> f64| {
                median(
                    per_engine[e]
                        .iter()
                        .filter_map(|r| r.get(i))
                        .map(f)
                        .collect(),
                )
            };
            let (a, b) = (med(0, &|r| r.ops_per_sec), med(1, &|r| r.ops_per_sec));
            let ratio = median(
                per_engine[0]
                    .iter()
                    .zip(&per_engine[1])
                    .filter_map(|(x, y)| Some(x.get(i)?.ops_per_sec / y.get(i)?.ops_per_sec))
                    .collect(),
            );
            println!(
                "{:>3} {:<9} {:>11.0} {:>11.0} {:>6.2} | {:>7.3}/{:<7.3} {:>7.3}/{:<7.3} | {:>7.3}/{:<7.3}",
                threads,
                name,
                a,
                b,
                ratio,
                med(0, &|r| r.proc_rw.0),
                med(0, &|r| r.proc_rw.1),
                med(1, &|r| r.proc_rw.0),
                med(1, &|r| r.proc_rw.1),
                med(0, &|r| r.leaf_rw.0),
                med(0, &|r| r.leaf_rw.1),
            );
        }
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let result = match &args.engine {
        Some(engine) => child(&args, engine),
        None => parent(&args),
    };
    if let Err(e) = result {
        eprintln!("vs_bftree: {e}");
        std::process::exit(1);
    }
}
