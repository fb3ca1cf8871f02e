//! Parent mode: runs every (regime, thread count, engine) in its own child process, in the
//! order the regimes need (buffered peers before bfkv's equal-footprint run), dropping the
//! page cache before each, then the device-limit check.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bfkv_workload::runner::BoxError;
use bfkv_workload::{Distribution, Phase};

use crate::child::{dist_name, phase_name, Job};
use crate::results::{DeviceCheck, Failure, Report, RunResult, RESULT_PREFIX};
use crate::{device, engines, memory};

/// When the parent started, for progress lines.
static START: OnceLock<Instant> = OnceLock::new();

/// What the parent runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Records per run.
    pub records: u64,
    /// Seconds per timed phase.
    pub secs: f64,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Engines to run (names from `engines::ALL`).
    pub engines: Vec<String>,
    /// Regimes to run (1, 2).
    pub regimes: Vec<u8>,
    /// Whether to run the device-limit check.
    pub device: bool,
    /// The regime-1 cache and the buffered peers' own caches (bytes).
    pub cache: usize,
    /// bfkv's cache in the device-limit check (bytes).
    pub device_cache: usize,
    /// Size of the `pread` probe file (bytes).
    pub probe_bytes: u64,
    /// Repetitions of every child (the report shows medians).
    pub runs: usize,
    /// Parent directory of the databases and the probe file.
    pub dir: PathBuf,
}

/// The phases after the load, in the order every Zipf run uses (`docs/workloads.md` runs C, A, E
/// first; B and F follow).
pub const PHASES: [Phase; 5] = [Phase::C, Phase::A, Phase::E, Phase::B, Phase::F];

/// Runs everything `opts` asks for. Failed children are recorded, not fatal.
pub fn run(opts: &Options) -> Result<Report, BoxError> {
    let started = *START.get_or_init(Instant::now);
    let mut report = Report {
        phase_secs: opts.secs,
        records: opts.records,
        cache: opts.cache as u64,
        page_cache_dropped: true,
        ..Report::default()
    };
    if !memory::drop_page_cache() {
        eprintln!("peers: cannot drop the page cache (not root?); going on without it");
        report.page_cache_dropped = false;
    }
    let wanted = |e: &str| opts.engines.iter().any(|w| w == e);
    for &threads in &opts.threads {
        if opts.regimes.contains(&2) {
            for e in engines::BUFFERED.iter().filter(|e| wanted(e)) {
                run_job(opts, &mut report, job(opts, e, 2, threads, opts.cache));
            }
            if wanted("bfkv") {
                match equal_footprint(&report.runs, threads) {
                    Some(cache) => {
                        run_job(opts, &mut report, job(opts, "bfkv", 2, threads, cache));
                    }
                    None => eprintln!(
                        "peers: no buffered peer finished at {threads} threads; skipping bfkv's equal-footprint run"
                    ),
                }
            }
        }
        if opts.regimes.contains(&1) {
            for e in engines::DIRECT.iter().filter(|e| wanted(e)) {
                run_job(opts, &mut report, job(opts, e, 1, threads, opts.cache));
            }
        }
        if opts.device && wanted("bfkv") {
            device_check(opts, &mut report, threads);
        }
    }
    // The probe file is a gigabyte of scratch; a later run rewrites it in seconds.
    let _ = std::fs::remove_file(probe_path(opts));
    report.wall_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The job for `engine` in `regime` at `threads` with `cache` bytes, on the Zipf phases.
fn job(opts: &Options, engine: &str, regime: u8, threads: usize, cache: usize) -> Job {
    Job {
        engine: engine.into(),
        regime,
        threads,
        // LMDB has no cache of its own: the page cache is all it uses.
        cache: if engine == "lmdb" { 0 } else { cache },
        records: opts.records,
        phases: PHASES.to_vec(),
        dist: Distribution::Zipf(bfkv_workload::DEFAULT_THETA),
        secs: opts.secs,
        dir: opts.dir.clone(),
    }
}

/// bfkv's cache in regime 2: the smallest footprint any buffered peer reached in any phase
/// at `threads` threads, rounded down to a MiB.
pub fn equal_footprint(runs: &[RunResult], threads: usize) -> Option<usize> {
    let smallest = runs
        .iter()
        .filter(|r| r.regime == 2 && r.threads == threads && r.engine != "bfkv")
        .flat_map(|r| r.phases.iter().map(|p| p.footprint))
        .min()?;
    Some(((smallest >> 20).max(1) << 20) as usize)
}

/// Runs `job` `opts.runs` times, recording each result or failure.
fn run_job(opts: &Options, report: &mut Report, job: Job) {
    for rep in 0..opts.runs.max(1) {
        if !memory::drop_page_cache() {
            report.page_cache_dropped = false;
        }
        eprintln!(
            "peers: {} regime {} {}t cache {} MiB, run {} ({:.0} s since start)",
            job.engine,
            job.regime,
            job.threads,
            job.cache >> 20,
            rep + 1,
            START.get_or_init(Instant::now).elapsed().as_secs_f64()
        );
        match spawn(&job) {
            Ok(r) => report.runs.push(r),
            Err(e) => {
                eprintln!("peers: {} failed: {e}", job.engine);
                report.failures.push(Failure {
                    engine: job.engine.clone(),
                    regime: job.regime,
                    threads: job.threads,
                    error: e.to_string(),
                });
            }
        }
    }
}

/// Where the `pread` probe file lives: beside the databases.
fn probe_path(opts: &Options) -> PathBuf {
    opts.dir.join("pread-probe.dat")
}

/// bfkv's uniform reads with data 10x its cache, then raw `pread` at the same threads.
fn device_check(opts: &Options, report: &mut Report, threads: usize) {
    let job = Job {
        phases: vec![Phase::U],
        dist: Distribution::Uniform,
        ..job(opts, "bfkv", 0, threads, opts.device_cache)
    };
    let before = report.runs.len();
    run_job(opts, report, job);
    let probe = probe_path(opts);
    let iops = device::prepare_file(&probe, opts.probe_bytes).and_then(|()| {
        memory::drop_page_cache();
        // One read per bfkv leaf page, the unit of its page reads per operation.
        device::pread_iops(
            &probe,
            threads,
            opts.secs,
            bfkv::Config::in_memory().get_page_size(),
        )
    });
    match iops {
        Ok(iops) => {
            eprintln!("peers: pread {threads}t: {iops:.0} IOPS");
            for r in &report.runs[before..] {
                if let Some(check) = DeviceCheck::new(r, iops) {
                    report.device.push(check);
                }
            }
        }
        Err(e) => report.failures.push(Failure {
            engine: "pread probe".into(),
            regime: 0,
            threads,
            error: e.to_string(),
        }),
    }
}

/// The command line that makes a child run `job`.
pub fn child_args(job: &Job) -> Vec<String> {
    let phases: Vec<String> = job.phases.iter().map(|&p| phase_name(p)).collect();
    vec![
        "--engine".into(),
        job.engine.clone(),
        "--regime-tag".into(),
        job.regime.to_string(),
        "--threads".into(),
        job.threads.to_string(),
        "--cache".into(),
        job.cache.to_string(),
        "--records".into(),
        job.records.to_string(),
        "--phase-plan".into(),
        phases.join(","),
        "--dist".into(),
        dist_name(job.dist).replace(' ', ":"),
        "--duration".into(),
        job.secs.to_string(),
        "--dir".into(),
        job.dir.display().to_string(),
    ]
}

/// Runs `job` in a child process (this executable again) and parses its result line. A
/// child that outlives a generous bound is killed: a hung engine must not stop the rest.
fn spawn(job: &Job) -> Result<RunResult, BoxError> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(child_args(job))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let stderr = child.stderr.take().ok_or("no child stderr")?;
    let out_reader = std::thread::spawn(move || result_line(stdout));
    let err_reader = std::thread::spawn(move || tail_of(stderr));
    let limit = Duration::from_secs(1800)
        + Duration::from_secs_f64(job.secs * (job.phases.len() as f64) * 4.0);
    let status = wait_with_limit(&mut child, limit)?;
    let line = out_reader.join().map_err(|_| "stdout reader panicked")?;
    let tail = err_reader.join().map_err(|_| "stderr reader panicked")?;
    match (status, line) {
        (Some(s), Some(line)) if s.success() => Ok(serde_json::from_str(&line)?),
        (None, _) => Err(format!("killed after {} s; stderr: {tail}", limit.as_secs()).into()),
        (Some(s), _) => Err(format!("exited with {s}; stderr: {tail}").into()),
    }
}

/// Waits for `child` at most `limit`; kills it after that (`None`).
fn wait_with_limit(
    child: &mut Child,
    limit: Duration,
) -> Result<Option<std::process::ExitStatus>, BoxError> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            // Killing a child that just exited fails harmlessly.
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The child's result line (without its prefix), echoing the rest of its stdout.
fn result_line(stdout: impl Read) -> Option<String> {
    let mut found = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        match line.strip_prefix(RESULT_PREFIX) {
            Some(json) => found = Some(json.to_string()),
            None => println!("{line}"),
        }
    }
    found
}

/// Echoes the child's stderr (its per-phase progress) and keeps the last lines for errors.
fn tail_of(stderr: impl Read) -> String {
    let mut last: Vec<String> = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        eprintln!("{line}");
        last.push(line);
        if last.len() > 8 {
            last.remove(0);
        }
    }
    last.join(" | ")
}

/// Parses `zipf:0.9` / `zipf` / `uniform` (the child's `--dist`).
pub fn parse_dist(s: &str) -> Result<Distribution, String> {
    match s.split_once(':') {
        None if s == "uniform" => Ok(Distribution::Uniform),
        None if s == "zipf" => Ok(Distribution::Zipf(bfkv_workload::DEFAULT_THETA)),
        Some(("zipf", theta)) => theta
            .parse()
            .map(Distribution::Zipf)
            .map_err(|_| format!("bad Zipf θ in `{s}`")),
        _ => Err(format!("`{s}`: expected uniform or zipf[:θ]")),
    }
}

/// Parses a comma-separated phase plan (`C,A,E`, `load` allowed and ignored: every child
/// loads first).
pub fn parse_phases(s: &str) -> Result<Vec<Phase>, String> {
    s.split(',')
        .filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("load"))
        .map(|p| {
            let mut chars = p.trim().chars();
            match (chars.next().and_then(Phase::from_letter), chars.next()) {
                (Some(ph), None) if ph != Phase::Load => Ok(ph),
                _ => Err(format!("`{p}` is not a phase (A B C E F U)")),
            }
        })
        .collect()
}

/// The workspace root (where `docs/` lives), from this crate's location.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::PhaseResult;

    fn run_with(engine: &str, regime: u8, threads: usize, footprints: &[u64]) -> RunResult {
        RunResult {
            engine: engine.into(),
            regime,
            threads,
            records: 10,
            cache: 1 << 20,
            dist: "zipf 0.9".into(),
            peak_reset: true,
            phases: footprints
                .iter()
                .map(|&f| PhaseResult {
                    phase: "C".into(),
                    ops: 1,
                    secs: 1.0,
                    ops_per_sec: 1.0,
                    peak_rss: f,
                    page_cache: 0,
                    mapped: 0,
                    footprint: f,
                    read_bytes: None,
                    write_bytes: None,
                    engine_pages: None,
                    disk_bytes: 0,
                    log_bytes: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn equal_footprint_is_the_smallest_buffered_phase() {
        let runs = vec![
            run_with("redb", 2, 1, &[300 << 20, (120 << 20) + 12345]),
            run_with("lmdb", 2, 1, &[200 << 20]),
            run_with("lmdb", 2, 2, &[50 << 20]),
            run_with("rocksdb", 1, 1, &[10 << 20]),
            run_with("bfkv", 2, 1, &[5 << 20]),
        ];
        assert_eq!(equal_footprint(&runs, 1), Some(120 << 20));
        assert_eq!(equal_footprint(&runs, 2), Some(50 << 20));
        assert_eq!(equal_footprint(&runs, 4), None);
    }

    #[test]
    fn child_arguments_round_trip() {
        let job = Job {
            engine: "sled".into(),
            regime: 2,
            threads: 2,
            cache: 1 << 25,
            records: 1000,
            phases: PHASES.to_vec(),
            dist: Distribution::Zipf(0.9),
            secs: 2.5,
            dir: "/tmp/x".into(),
        };
        let args = child_args(&job);
        let value = |flag: &str| {
            let i = args.iter().position(|a| a == flag).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(parse_phases(&value("--phase-plan")).unwrap(), PHASES);
        assert_eq!(
            parse_dist(&value("--dist")).unwrap(),
            Distribution::Zipf(0.9)
        );
        assert_eq!(parse_dist("uniform").unwrap(), Distribution::Uniform);
        assert!(parse_dist("zipf:x").is_err());
        assert!(parse_phases("C,Q").is_err());
        assert_eq!(parse_phases("load,U").unwrap(), [Phase::U]);
    }
}
