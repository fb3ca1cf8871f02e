//! What the criterion benches share besides the runner: settings from the environment,
//! leaving on a failed run, and the disk-traffic line printed after each benchmark.

use crate::runner::{BoxError, Outcome};

/// Leaves the process with `e`: a failed engine operation invalidates the whole run, and
/// criterion's timing closures cannot return errors.
pub fn or_exit<T>(r: Result<T, BoxError>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("bench: {e}");
        std::process::exit(1)
    })
}

/// A count from the environment variable `name`, or `default` if unset or unparsable.
pub fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Adds `out` to the running total `sum`.
pub fn accumulate(sum: &mut Option<Outcome>, out: &Outcome) {
    let add = |a: Option<(u64, u64)>, b: Option<(u64, u64)>| Some((a?.0 + b?.0, a?.1 + b?.1));
    *sum = Some(match sum.take() {
        None => *out,
        Some(s) => Outcome {
            ops: s.ops + out.ops,
            elapsed: s.elapsed + out.elapsed,
            leaf_io: add(s.leaf_io, out.leaf_io),
            proc_io: add(s.proc_io, out.proc_io),
            // Percentiles do not add up; a sum of runs has none.
            latency: None,
        },
    });
}

/// Prints throughput and disk traffic per operation of `out`.
pub fn report(group: &str, engine: &str, what: &str, out: &Outcome) {
    let fmt =
        |v: Option<(f64, f64)>| v.map_or("-".to_string(), |(r, w)| format!("{r:.3} r / {w:.3} w"));
    eprintln!(
        "[{group}] {engine} {what}: {:.0} ops/s; disk per op: proc {} (4 KiB); leaf pages {}",
        out.ops_per_sec(),
        fmt(out.proc_pages_per_op()),
        fmt(out.leaf_pages_per_op()),
    );
}
