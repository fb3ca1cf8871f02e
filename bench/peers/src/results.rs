//! What a run measured, as the child prints it (one JSON line) and the parent stores it
//! (`docs/charts/peers.json`).

use serde::{Deserialize, Serialize};

/// The line prefix of a child's result on its stdout (engines may print their own lines).
pub const RESULT_PREFIX: &str = "PEERS-RESULT ";

/// One phase of one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseResult {
    /// Phase name: `load`, `A`, `B`, `C`, `E`, `F` or `U`.
    pub phase: String,
    /// Operations completed.
    pub ops: u64,
    /// Wall seconds.
    pub secs: f64,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Peak RSS of the process during the phase (bytes).
    pub peak_rss: u64,
    /// The engine's files' pages in the OS page cache at the phase's end (bytes).
    pub page_cache: u64,
    /// Pages of its files mapped into the process and resident (counted by both of the
    /// above; subtracted once from the footprint).
    pub mapped: u64,
    /// Peak RSS + page cache - mapped (bytes).
    pub footprint: u64,
    /// Bytes the process read from storage during the phase (`/proc/self/io`).
    pub read_bytes: Option<u64>,
    /// Bytes the process wrote to storage during the phase (`/proc/self/io`).
    pub write_bytes: Option<u64>,
    /// Leaf pages the engine itself counted reading and writing (bfkv only).
    pub engine_pages: Option<(u64, u64)>,
    /// Allocated bytes of the engine's files at the phase's end.
    pub disk_bytes: u64,
    /// The part of `disk_bytes` that is the engine's write-ahead log
    /// (`memory::dir_log_bytes`; 0 in results recorded before it was measured).
    #[serde(default)]
    pub log_bytes: u64,
}

impl PhaseResult {
    /// 4 KiB units read from storage per operation.
    pub fn reads_per_op(&self) -> Option<f64> {
        Some(self.read_bytes? as f64 / 4096.0 / self.ops.max(1) as f64)
    }

    /// 4 KiB units written to storage per operation.
    pub fn writes_per_op(&self) -> Option<f64> {
        Some(self.write_bytes? as f64 / 4096.0 / self.ops.max(1) as f64)
    }
}

/// One child process: one engine, one thread count, one phase plan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// Engine name (`bfkv`, `rocksdb`, ...).
    pub engine: String,
    /// Regime: 1 (equal budget, direct I/O), 2 (equal footprint) or 0 (device check).
    pub regime: u8,
    /// Worker threads.
    pub threads: usize,
    /// Records loaded.
    pub records: u64,
    /// The engine's own cache size (bytes; 0 for LMDB, which has none).
    pub cache: u64,
    /// `zipf 0.9` or `uniform`.
    pub dist: String,
    /// Whether the peak RSS could be reset at every phase start (else peaks include earlier
    /// phases).
    pub peak_reset: bool,
    /// The phases, in the order run.
    pub phases: Vec<PhaseResult>,
}

impl RunResult {
    /// The phase named `name`, if it ran.
    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.phases.iter().find(|p| p.phase == name)
    }
}

/// The device-limit check at one thread count: bfkv's uniform reads against raw `pread`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceCheck {
    /// Threads (of bfkv and of the pread probe).
    pub threads: usize,
    /// bfkv's cache (bytes).
    pub cache: u64,
    /// bfkv's data file after the load (bytes).
    pub data_bytes: u64,
    /// bfkv's uniform-read throughput (ops/s).
    pub bfkv_ops_per_sec: f64,
    /// Leaf pages bfkv read per operation (its own counter).
    pub reads_per_op: f64,
    /// 4 KiB `O_DIRECT` random `pread`s per second on a 1 GiB file, same threads.
    pub pread_iops: f64,
    /// `bfkv_ops_per_sec / (pread_iops / reads_per_op)`: the share of the device limit.
    pub share: f64,
}

impl DeviceCheck {
    /// The check from its measurements.
    pub fn new(run: &RunResult, pread_iops: f64) -> Option<DeviceCheck> {
        let u = run.phase("U")?;
        let (pages_read, _) = u.engine_pages?;
        let reads_per_op = pages_read as f64 / u.ops.max(1) as f64;
        let limit = pread_iops / reads_per_op.max(1e-9);
        Some(DeviceCheck {
            threads: run.threads,
            cache: run.cache,
            data_bytes: run.phase("load").map_or(0, |l| l.disk_bytes),
            bfkv_ops_per_sec: u.ops_per_sec,
            reads_per_op,
            pread_iops,
            share: u.ops_per_sec / limit,
        })
    }
}

/// A child that failed: kept in the report instead of stopping the whole comparison.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Failure {
    /// Engine name.
    pub engine: String,
    /// Regime.
    pub regime: u8,
    /// Threads.
    pub threads: usize,
    /// What went wrong (the child's last stderr lines).
    pub error: String,
}

/// Everything one `peers` invocation measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Report {
    /// Machine facts, as `(name, value)` lines.
    pub machine: Vec<(String, String)>,
    /// Engine versions and settings, as `(engine, version, settings)`.
    pub engines: Vec<(String, String, String)>,
    /// Seconds per timed phase.
    pub phase_secs: f64,
    /// Records per run.
    pub records: u64,
    /// The regime-1 cache (bytes).
    pub cache: u64,
    /// Whether the page cache could be dropped before every child.
    pub page_cache_dropped: bool,
    /// Every successful child.
    pub runs: Vec<RunResult>,
    /// The device-limit checks.
    pub device: Vec<DeviceCheck>,
    /// Children that failed.
    pub failures: Vec<Failure>,
    /// Wall seconds of the whole invocation.
    pub wall_secs: f64,
}
