//! Child mode: one engine, one thread count, one phase plan in this process; the result is
//! printed as one JSON line for the parent.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bfkv_workload::runner::{self, BoxError, RunSpec, Stop, Workload};
use bfkv_workload::{Distribution, Phase};

use crate::engines;
use crate::memory;
use crate::results::{PhaseResult, RunResult, RESULT_PREFIX};

/// What the parent asks a child to run.
#[derive(Debug, Clone)]
pub struct Job {
    /// Engine name.
    pub engine: String,
    /// Regime the run belongs to (reported back).
    pub regime: u8,
    /// Worker threads.
    pub threads: usize,
    /// The engine's cache (bytes).
    pub cache: usize,
    /// Records to load.
    pub records: u64,
    /// Phases after the load, in order.
    pub phases: Vec<Phase>,
    /// Record choice of the phases.
    pub dist: Distribution,
    /// Seconds per phase after the load.
    pub secs: f64,
    /// Parent directory of the database.
    pub dir: PathBuf,
}

/// The name a phase has in results and tables.
pub fn phase_name(p: Phase) -> String {
    match p {
        Phase::Load => "load".into(),
        p => p.letter().to_string(),
    }
}

/// Words for a distribution.
pub fn dist_name(d: Distribution) -> String {
    match d {
        Distribution::Uniform => "uniform".into(),
        Distribution::Zipf(theta) => format!("zipf {theta}"),
    }
}

/// Runs `job` and prints its result line.
pub fn run(job: &Job) -> Result<(), BoxError> {
    let result = measure(job)?;
    println!("{RESULT_PREFIX}{}", serde_json::to_string(&result)?);
    Ok(())
}

/// Loads the records, runs the phases and measures each.
fn measure(job: &Job) -> Result<RunResult, BoxError> {
    std::fs::create_dir_all(&job.dir)?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("{}-", job.engine))
        .tempdir_in(&job.dir)?;
    let engine = engines::open(&job.engine, dir.path(), job.cache)?;
    let spec = RunSpec {
        dist: job.dist,
        ..RunSpec::new(job.records, job.threads)
    };
    let next_insert = Arc::new(AtomicU64::new(job.records));
    let mut plan = vec![(
        Phase::Load,
        Stop {
            ops: u64::MAX,
            time: None,
        },
    )];
    let timed = Stop {
        ops: u64::MAX,
        time: Some(Duration::from_secs_f64(job.secs.max(0.1))),
    };
    plan.extend(job.phases.iter().map(|&p| (p, timed)));
    let mut peak_reset = true;
    let mut phases = Vec::new();
    for (phase, stop) in plan {
        peak_reset &= memory::reset_peak_rss();
        let out = runner::run(
            engine.as_ref(),
            Workload::Phase(phase),
            spec,
            stop,
            &next_insert,
        )?;
        let status = memory::status().unwrap_or_default();
        let page_cache = memory::dir_resident(dir.path())?;
        let mapped = memory::mapped_resident(dir.path());
        eprintln!(
            "  {} {}t {}: {:.0} ops/s",
            job.engine,
            job.threads,
            phase_name(phase),
            out.ops_per_sec()
        );
        phases.push(PhaseResult {
            phase: phase_name(phase),
            ops: out.ops,
            secs: out.elapsed.as_secs_f64(),
            ops_per_sec: out.ops_per_sec(),
            peak_rss: status.peak_rss,
            page_cache,
            mapped,
            footprint: memory::footprint(status.peak_rss, page_cache, mapped),
            read_bytes: out.proc_io.map(|io| io.0),
            write_bytes: out.proc_io.map(|io| io.1),
            engine_pages: out.leaf_io,
            disk_bytes: memory::dir_disk_bytes(dir.path())?,
            log_bytes: memory::dir_log_bytes(dir.path())?,
        });
    }
    // Closing (a checkpoint for some engines) is not measured.
    drop(engine);
    Ok(RunResult {
        engine: job.engine.clone(),
        regime: job.regime,
        threads: job.threads,
        records: job.records,
        cache: job.cache as u64,
        dist: dist_name(job.dist),
        peak_reset,
        phases,
    })
}
