//! `peers`: bfkv against Microsoft's `bf-tree`, RocksDB, redb, fjall, LMDB and sled on the
//! `docs/workloads.md` phases, one process per engine and run, with honest memory accounting
//! (issue 6). `cargo run --release -p peers -- --all`; see `bench/peers/README.md`.
#![deny(unsafe_op_in_unsafe_fn)]

mod charts;
mod child;
mod device;
mod engines;
mod machine;
mod memory;
mod parent;
mod report;
mod results;

use std::path::{Path, PathBuf};

use bfkv_workload::runner::BoxError;
use clap::Parser;

use crate::results::Report;

/// Command line of both the parent (no `--engine`) and its children (`--engine`).
#[derive(Parser, Debug)]
#[command(about = "bfkv against its peers on the docs/workloads.md phases (issue 6)")]
struct Args {
    /// Run everything: all engines, both regimes, 1 and 2 threads, the device check (the
    /// default when no filter is given). Writes the results into docs/.
    #[arg(long)]
    all: bool,
    /// A short trial: 500k records, 3 s phases; results go to target/peers/, not docs/.
    #[arg(long)]
    quick: bool,
    /// Seconds per timed phase (default 10; 3 with --quick).
    #[arg(long)]
    duration: Option<f64>,
    /// Records loaded (default 5,000,000; 500,000 with --quick).
    #[arg(long)]
    records: Option<u64>,
    /// Engines to run, comma-separated (bfkv, bf-tree, rocksdb, rocksdb-buffered, redb,
    /// fjall, lmdb, sled).
    #[arg(long, value_delimiter = ',')]
    engines: Option<Vec<String>>,
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Only this regime: 1 (equal budget, direct I/O) or 2 (equal footprint).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    regime: Option<u8>,
    /// Skip the device-limit check.
    #[arg(long)]
    no_device: bool,
    /// Repetitions of every process (tables show the median).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Directory for the databases and the pread probe file (default target/peers-data).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Re-draw the report and charts from a results file instead of running.
    #[arg(long)]
    from_json: Option<PathBuf>,
    /// Child mode: the engine to run in this process.
    #[arg(long, hide = true)]
    engine: Option<String>,
    /// Child mode: the regime to report.
    #[arg(long, hide = true, default_value_t = 1)]
    regime_tag: u8,
    /// Child mode: the engine's cache in bytes.
    #[arg(long, hide = true)]
    cache: Option<usize>,
    /// Child mode: phases after the load.
    #[arg(long, hide = true)]
    phase_plan: Option<String>,
    /// Child mode: key distribution (`zipf:0.9`, `uniform`).
    #[arg(long, hide = true)]
    dist: Option<String>,
}

/// The largest power of two not above `x`, at least 1 MiB.
fn pow2_at_most(x: f64) -> usize {
    let mut p = 1usize << 20;
    while ((p * 2) as f64) <= x {
        p *= 2;
    }
    p
}

/// The cache that makes the raw data `ratio` times larger (a power of two, for bf-tree):
/// 32 MiB for 5M records at 5x, as `docs/workloads.md` sets it.
fn cache_for(records: u64, ratio: f64) -> usize {
    let raw = records as f64 * (bfkv_workload::KEY_LEN + bfkv_workload::VALUE_LEN) as f64;
    // Nearest power of two of raw/ratio: 160 MB / 5 = 32 MB lands on 32 MiB.
    let target = raw / ratio;
    let below = pow2_at_most(target);
    if target / below as f64 > (2 * below) as f64 / target {
        below * 2
    } else {
        below
    }
}

/// Child mode.
fn child(args: &Args, engine: &str) -> Result<(), BoxError> {
    let records = args.records.ok_or("child needs --records")?;
    let job = child::Job {
        engine: engine.into(),
        regime: args.regime_tag,
        threads: args
            .threads
            .as_ref()
            .and_then(|t| t.first().copied())
            .unwrap_or(1),
        cache: args.cache.ok_or("child needs --cache")?,
        records,
        phases: parent::parse_phases(args.phase_plan.as_deref().unwrap_or(""))?,
        dist: parent::parse_dist(args.dist.as_deref().unwrap_or("zipf"))?,
        secs: args.duration.unwrap_or(10.0),
        dir: args.dir.clone().ok_or("child needs --dir")?,
    };
    child::run(&job)
}

/// Parent mode: run (or load) the report, then write it out.
fn parent(args: &Args) -> Result<(), BoxError> {
    let root = parent::workspace_root();
    let filtered = args.engines.is_some()
        || args.threads.is_some()
        || args.regime.is_some()
        || args.no_device
        || args.records.is_some();
    // Only a complete run at the documented size replaces the committed results.
    let to_docs = !args.quick && !filtered;
    let report = match &args.from_json {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => {
            let records = args.records.unwrap_or(if args.quick {
                500_000
            } else {
                bfkv_workload::DEFAULT_RECORDS
            });
            let dir = args
                .dir
                .clone()
                .unwrap_or_else(|| root.join("target/peers-data"));
            std::fs::create_dir_all(&dir)?;
            let opts = parent::Options {
                records,
                secs: args.duration.unwrap_or(if args.quick { 3.0 } else { 10.0 }),
                threads: args.threads.clone().unwrap_or_else(|| vec![1, 2]),
                engines: args
                    .engines
                    .clone()
                    .unwrap_or_else(|| engines::ALL.iter().map(|s| s.to_string()).collect()),
                regimes: args.regime.map_or_else(|| vec![1, 2], |r| vec![r]),
                device: !args.no_device,
                cache: cache_for(records, 5.0),
                device_cache: cache_for(records, 10.0),
                probe_bytes: 1 << 30,
                runs: args.runs,
                dir: dir.clone(),
            };
            // Before the run: the load average is the one the run starts under, and the
            // commit the one its binaries were built from.
            let facts = machine::facts(&dir);
            let mut report = parent::run(&opts)?;
            report.machine = facts;
            let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
            report.engines = engines::ALL
                .iter()
                .filter(|e| opts.engines.iter().any(|w| w == *e))
                .map(|e| {
                    (
                        e.to_string(),
                        machine::version(&lock, e),
                        engines::settings(e).to_string(),
                    )
                })
                .collect();
            report
        }
    };
    let out = if to_docs || args.from_json.is_some() {
        root.join("docs")
    } else {
        root.join("target/peers")
    };
    write(&report, &out, to_docs || args.from_json.is_some())
}

/// Writes the JSON, the charts and the Markdown section under `out` (`docs/` or a scratch
/// directory); into `docs/benchmarks.md` itself only if `into_benchmarks`.
fn write(report: &Report, out: &Path, into_benchmarks: bool) -> Result<(), BoxError> {
    let charts_dir = out.join("charts");
    std::fs::create_dir_all(&charts_dir)?;
    std::fs::write(
        charts_dir.join("peers.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    match charts::register_font() {
        Some(font) => {
            let n = charts::write_all(report, &charts_dir)?.len();
            eprintln!(
                "peers: {n} charts (SVG + PNG, font {}) in {}",
                font.display(),
                charts_dir.display()
            );
        }
        None => eprintln!(
            "peers: no TrueType font found (apt install fonts-dejavu-core); charts skipped"
        ),
    }
    let section = report::section(report);
    if into_benchmarks {
        let path = out.join("benchmarks.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, report::replace_section(&doc, &section))?;
        eprintln!("peers: wrote the peers section of {}", path.display());
    } else {
        let path = out.join("peers-section.md");
        std::fs::write(&path, &section)?;
        eprintln!(
            "peers: wrote {} (docs/ is only rewritten by a full run)",
            path.display()
        );
    }
    println!("{section}");
    Ok(())
}

fn main() {
    let args = Args::parse();
    let result = match &args.engine {
        Some(engine) => child(&args, engine),
        None => parent(&args),
    };
    if let Err(e) = result {
        eprintln!("peers: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_follow_the_workload_ratios() {
        assert_eq!(cache_for(5_000_000, 5.0), 32 << 20);
        assert_eq!(cache_for(5_000_000, 10.0), 16 << 20);
        assert_eq!(cache_for(500_000, 5.0), 4 << 20);
        assert_eq!(cache_for(10, 5.0), 1 << 20);
        assert_eq!(pow2_at_most(3.0 * (1 << 20) as f64), 2 << 20);
    }
}
