//! The peers section of `docs/benchmarks.md`: machine facts, engine settings, and tables of
//! throughput, footprint, disk traffic and bfkv/peer ratios, from a [`Report`].

use std::fmt::Write as _;

use crate::results::{PhaseResult, Report, RunResult};

/// Marks the start of the generated section in `docs/benchmarks.md`.
pub const BEGIN: &str = "<!-- peers:begin -->";
/// Marks its end.
pub const END: &str = "<!-- peers:end -->";

/// Phase rows of every Zipf table, in table order.
pub const PHASE_ROWS: [&str; 6] = ["load", "C", "A", "E", "B", "F"];

/// A phase's name in tables.
pub fn phase_label(phase: &str) -> String {
    match phase {
        "load" => "load".into(),
        p => format!("YCSB-{p}"),
    }
}

/// `doc` with the text between the markers replaced by `section` (markers kept), or with
/// the markers and `section` appended if the markers are missing. Nothing else changes.
pub fn replace_section(doc: &str, section: &str) -> String {
    let body = format!("{BEGIN}\n{}\n{END}", section.trim_end());
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{body}{}", &doc[..b], &doc[e + END.len()..])
        }
        _ => {
            let sep = if doc.is_empty() || doc.ends_with("\n\n") {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{doc}{sep}{body}\n")
        }
    }
}

/// Operations per second, short: `1.23M`, `456k`, `12.3k`, `987`.
pub fn fmt_rate(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e5 {
        format!("{:.0}k", x / 1e3)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Bytes as MiB: one decimal under 10 MiB, none above.
pub fn fmt_mib(bytes: u64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    if m < 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.0}")
    }
}

/// A Markdown table.
pub fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    s += &line(header);
    s += &format!("|{}\n", "---|".repeat(header.len()));
    for r in rows {
        let mut cells = r.clone();
        cells.resize(header.len(), String::new());
        s += &line(&cells);
    }
    s
}

/// The runs of one (regime, engine, threads), merged: per phase, the repetition with the
/// median throughput (all of its figures), so tables show one consistent measurement.
pub fn merged(runs: &[&RunResult]) -> Option<RunResult> {
    let first = (*runs.first()?).clone();
    let phases = first
        .phases
        .iter()
        .map(|p| {
            let mut reps: Vec<&PhaseResult> =
                runs.iter().filter_map(|r| r.phase(&p.phase)).collect();
            reps.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
            reps[reps.len() / 2].clone()
        })
        .collect();
    Some(RunResult { phases, ..first })
}

/// The merged run of `engine` in `regime` at `threads`, if any ran.
pub fn find(report: &Report, regime: u8, engine: &str, threads: usize) -> Option<RunResult> {
    let runs: Vec<&RunResult> = report
        .runs
        .iter()
        .filter(|r| r.regime == regime && r.engine == engine && r.threads == threads)
        .collect();
    merged(&runs)
}

/// Engines (in `order`) that have a run in `regime` at `threads`, with their merged runs.
pub fn engines_in(report: &Report, regime: u8, threads: usize, order: &[&str]) -> Vec<RunResult> {
    order
        .iter()
        .filter_map(|e| find(report, regime, e, threads))
        .collect()
}

/// The thread counts that appear in `report`, ascending.
pub fn thread_counts(report: &Report) -> Vec<usize> {
    let mut t: Vec<usize> = report.runs.iter().map(|r| r.threads).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// One row per phase: the phase label, then `cell(run, phase)` for every run (`-` where
/// the run lacks the phase).
fn phase_table(runs: &[RunResult], cell: &dyn Fn(&RunResult, &PhaseResult) -> String) -> String {
    let mut header = vec!["phase".to_string()];
    header.extend(runs.iter().map(|r| r.engine.clone()));
    let rows: Vec<Vec<String>> = PHASE_ROWS
        .iter()
        .filter(|p| runs.iter().any(|r| r.phase(p).is_some()))
        .map(|p| {
            let mut row = vec![phase_label(p)];
            row.extend(
                runs.iter()
                    .map(|r| r.phase(p).map_or("-".into(), |ph| cell(r, ph))),
            );
            row
        })
        .collect();
    table(&header, &rows)
}

/// bfkv's ops/s divided by each peer's, per phase.
fn ratio_table(runs: &[RunResult]) -> Option<String> {
    let bfkv = runs.iter().find(|r| r.engine == "bfkv")?;
    let peers: Vec<&RunResult> = runs.iter().filter(|r| r.engine != "bfkv").collect();
    if peers.is_empty() {
        return None;
    }
    let mut header = vec!["bfkv / peer".to_string()];
    header.extend(peers.iter().map(|r| r.engine.clone()));
    let rows: Vec<Vec<String>> = PHASE_ROWS
        .iter()
        .filter_map(|p| {
            let b = bfkv.phase(p)?.ops_per_sec;
            let mut row = vec![phase_label(p)];
            row.extend(peers.iter().map(|r| {
                r.phase(p).map_or("-".into(), |ph| {
                    let x = b / ph.ops_per_sec;
                    if x < 1.0 {
                        format!("**{x:.2}**")
                    } else {
                        format!("{x:.2}")
                    }
                })
            }));
            Some(row)
        })
        .collect();
    Some(table(&header, &rows))
}

/// Every place where a peer beat bfkv: `(regime, threads, phase, peer, peer / bfkv)`.
pub fn behind(report: &Report) -> Vec<(u8, usize, String, String, f64)> {
    let mut out = Vec::new();
    for regime in [1u8, 2] {
        for threads in thread_counts(report) {
            let runs = engines_in(report, regime, threads, &crate::engines::ALL);
            let Some(bfkv) = runs.iter().find(|r| r.engine == "bfkv") else {
                continue;
            };
            for p in PHASE_ROWS {
                let Some(b) = bfkv.phase(p) else { continue };
                for peer in runs.iter().filter(|r| r.engine != "bfkv") {
                    if let Some(ph) = peer.phase(p) {
                        if ph.ops_per_sec > b.ops_per_sec {
                            let x = ph.ops_per_sec / b.ops_per_sec;
                            out.push((regime, threads, p.to_string(), peer.engine.clone(), x));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The tables of one regime at one thread count.
fn regime_block(s: &mut String, report: &Report, regime: u8, threads: usize) {
    let runs = engines_in(report, regime, threads, &crate::engines::ALL);
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "#### {threads} thread{}\n",
        if threads == 1 { "" } else { "s" }
    );
    let caches: Vec<String> = runs
        .iter()
        .map(|r| match r.cache {
            0 => format!("{} none", r.engine),
            c => format!("{} {} MiB", r.engine, fmt_mib(c)),
        })
        .collect();
    let _ = writeln!(s, "Caches: {}.\n", caches.join(", "));
    let _ = writeln!(s, "Throughput (ops/s):\n");
    s.push_str(&phase_table(&runs, &|_, p| fmt_rate(p.ops_per_sec)));
    if let Some(t) = ratio_table(&runs) {
        let _ = writeln!(
            s,
            "\nbfkv's throughput over each peer's (below 1 in bold):\n"
        );
        s.push_str(&t);
    }
    let _ = writeln!(
        s,
        "\nFootprint, MiB: peak RSS + the engine's file pages in the page cache (mapped pages counted once):\n"
    );
    s.push_str(&phase_table(&runs, &|_, p| {
        format!(
            "{} ({} + {})",
            fmt_mib(p.footprint),
            fmt_mib(p.peak_rss),
            fmt_mib(p.footprint - p.peak_rss)
        )
    }));
    let _ = writeln!(
        s,
        "\nDisk reads / writes per operation, 4 KiB units (`/proc/self/io` of the engine's process):\n"
    );
    s.push_str(&phase_table(
        &runs,
        &|_, p| match (p.reads_per_op(), p.writes_per_op()) {
            (Some(r), Some(w)) => format!("{r:.3} / {w:.3}"),
            _ => "-".into(),
        },
    ));
    let _ = writeln!(
        s,
        "\nOn disk after the phase, MiB: allocated blocks of all the engine's files, log included (in parentheses: the log, bfkv's `wal/` and RocksDB's `*.log`; the others keep none beside their data files):\n"
    );
    s.push_str(&phase_table(&runs, &|_, p| match p.log_bytes {
        0 => fmt_mib(p.disk_bytes),
        log => format!("{} ({} log)", fmt_mib(p.disk_bytes), fmt_mib(log)),
    }));
    let _ = writeln!(
        s,
        "\n![throughput, regime {regime}, {threads} thread(s)](charts/peers-r{regime}-t{threads}.svg)\n"
    );
}

/// The whole generated section.
pub fn section(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Peer comparison (`bench/peers`)\n");
    let _ = writeln!(
        s,
        "Generated by `cargo run --release -p peers -- --all` (this section is rewritten by each run; see `bench/peers/README.md`). {} records of 16-byte keys and 16-byte values (`docs/workloads.md`), Zipf 0.9, load then YCSB C, A, E, B, F for {} s each, one process per engine and thread count, {}. Whole run: {:.1} min.\n",
        report.records,
        report.phase_secs,
        if report.page_cache_dropped {
            "OS page cache dropped before every process"
        } else {
            "**the OS page cache could not be dropped** (not root)"
        },
        report.wall_secs / 60.0
    );
    let _ = writeln!(s, "### Machine\n");
    let rows: Vec<Vec<String>> = report
        .machine
        .iter()
        .map(|(k, v)| vec![k.clone(), v.clone()])
        .collect();
    s.push_str(&table(&["".into(), "".into()], &rows));
    let _ = writeln!(s, "\n### Engines and settings\n");
    let rows: Vec<Vec<String>> = report
        .engines
        .iter()
        .map(|(e, v, st)| vec![e.clone(), v.clone(), st.clone()])
        .collect();
    s.push_str(&table(
        &["engine".into(), "version".into(), "settings".into()],
        &rows,
    ));
    let _ = writeln!(
        s,
        "\nEvery write is its own operation (its own transaction in redb and LMDB); none waits for an fsync. \
Each phase's footprint is the process's peak RSS during the phase (`VmHWM`, reset through `/proc/self/clear_refs` at the phase's start{}) plus the pages of the engine's files resident in the page cache at the phase's end (`mincore`), minus the resident pages of those files mapped into the process (counted in both). \
Disk traffic comes from `/proc/self/io` (`read_bytes`, `write_bytes`: what reached the block layer, direct I/O included).\n",
        if report.runs.iter().all(|r| r.peak_reset) { "" } else { "; **the reset failed for some runs, whose peaks include earlier phases**" }
    );
    let threads = thread_counts(report);
    let regimes = [
        (
            1u8,
            format!("### Regime 1: equal budget ({} MiB), direct I/O\n", fmt_mib(report.cache)),
            String::new(),
        ),
        (
            2u8,
            "### Regime 2: equal footprint\n".to_string(),
            format!(
                "The buffered peers run first, each with its own cache at {} MiB (LMDB has none); bfkv then gets a cache equal to the smallest footprint any of them reached in any phase at the same thread count.\n",
                fmt_mib(report.cache)
            ),
        ),
    ];
    for (regime, heading, intro) in regimes {
        let _ = writeln!(s, "{heading}");
        if !intro.is_empty() {
            let _ = writeln!(s, "{intro}");
        }
        for &t in &threads {
            regime_block(&mut s, report, regime, t);
        }
    }
    let _ = writeln!(s, "### Lookup / scan / update\n");
    let _ = writeln!(
        s,
        "YCSB-C (lookup), YCSB-E (scan) and YCSB-A (update-heavy) throughput per engine, each axis normalised to the best engine on it.\n"
    );
    for &t in &threads {
        for regime in [1u8, 2] {
            if !engines_in(report, regime, t, &crate::engines::ALL).is_empty() {
                let _ = writeln!(
                    s,
                    "![radar, regime {regime}, {t} thread(s)](charts/peers-radar-r{regime}-t{t}.svg)"
                );
            }
        }
    }
    device_block(&mut s, report);
    let lagging = behind(report);
    let _ = writeln!(s, "\n### Where bfkv is behind\n");
    if lagging.is_empty() {
        let _ = writeln!(
            s,
            "Nowhere in this run: bfkv has the highest throughput in every phase of both regimes."
        );
    } else {
        let rows: Vec<Vec<String>> = lagging
            .iter()
            .map(|(r, t, p, e, x)| {
                vec![
                    r.to_string(),
                    t.to_string(),
                    phase_label(p),
                    e.clone(),
                    format!("{x:.2}x"),
                ]
            })
            .collect();
        s.push_str(&table(
            &[
                "regime".into(),
                "threads".into(),
                "phase".into(),
                "faster peer".into(),
                "peer / bfkv".into(),
            ],
            &rows,
        ));
    }
    if !report.failures.is_empty() {
        let _ = writeln!(s, "\n### Runs that failed\n");
        for f in &report.failures {
            let _ = writeln!(
                s,
                "- {} (regime {}, {} threads): {}",
                f.engine, f.regime, f.threads, f.error
            );
        }
    }
    let _ = writeln!(s, "\nRaw results: `docs/charts/peers.json`.");
    s
}

/// The device-limit check's table.
fn device_block(s: &mut String, report: &Report) {
    if report.device.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n### Device limit: uniform reads, data 10x the cache (bfkv only)\n"
    );
    let _ = writeln!(
        s,
        "bfkv runs phase U (100 % reads, uniform keys) after its load with a cache of a tenth of the raw data; the harness then measures random `O_DIRECT` `pread`s of one bfkv page (its default size) on a 1 GiB file in the same directory with the same number of threads for the same time. The device allows `pread IOPS / (bfkv's leaf-page reads per op)` ops/s; the share is bfkv's ops/s over that (the issue asks for >= 80 %).\n"
    );
    let rows: Vec<Vec<String>> = report
        .device
        .iter()
        .map(|d| {
            vec![
                d.threads.to_string(),
                fmt_mib(d.cache),
                fmt_mib(d.data_bytes),
                fmt_rate(d.bfkv_ops_per_sec),
                format!("{:.3}", d.reads_per_op),
                fmt_rate(d.pread_iops),
                fmt_rate(d.pread_iops / d.reads_per_op.max(1e-9)),
                format!("{:.0} %", d.share * 100.0),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            "threads".into(),
            "cache MiB".into(),
            "data file MiB".into(),
            "bfkv ops/s".into(),
            "reads/op".into(),
            "pread IOPS".into(),
            "device limit ops/s".into(),
            "share".into(),
        ],
        &rows,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_replacement_keeps_everything_else() {
        let doc = "# B\n\n## A\ntext\n";
        let once = replace_section(doc, "new 1");
        assert_eq!(
            once,
            format!("# B\n\n## A\ntext\n\n{BEGIN}\nnew 1\n{END}\n")
        );
        let twice = replace_section(&(once.clone() + "\n## Z\nafter\n"), "new 2\n");
        assert_eq!(
            twice,
            format!("# B\n\n## A\ntext\n\n{BEGIN}\nnew 2\n{END}\n\n## Z\nafter\n")
        );
        // Markers in the wrong order are not trusted: append instead of cutting text out.
        let odd = format!("{END}\nkeep\n{BEGIN}\n");
        assert!(replace_section(&odd, "x").starts_with(&odd));
    }

    /// A one-phase run of `engine` at `ops_per_sec`.
    fn run(engine: &str, regime: u8, phase: &str, ops_per_sec: f64) -> RunResult {
        RunResult {
            engine: engine.into(),
            regime,
            threads: 1,
            records: 1,
            cache: 1 << 20,
            dist: "zipf 0.9".into(),
            peak_reset: true,
            phases: vec![PhaseResult {
                phase: phase.into(),
                ops: 1,
                secs: 1.0,
                ops_per_sec,
                peak_rss: 0,
                page_cache: 0,
                mapped: 0,
                footprint: 0,
                read_bytes: None,
                write_bytes: None,
                engine_pages: None,
                disk_bytes: (2 * ops_per_sec as u64) << 20,
                log_bytes: if engine == "bfkv" { 1 << 20 } else { 0 },
            }],
        }
    }

    #[test]
    fn repetitions_merge_to_the_median_and_laggards_are_listed() {
        let report = Report {
            runs: vec![
                run("bfkv", 1, "C", 100.0),
                run("bfkv", 1, "C", 300.0),
                run("bfkv", 1, "C", 200.0),
                run("rocksdb", 1, "C", 250.0),
                run("bf-tree", 1, "C", 150.0),
                run("lmdb", 2, "C", 90.0),
                run("bfkv", 2, "C", 80.0),
            ],
            ..Report::default()
        };
        let bfkv = find(&report, 1, "bfkv", 1).unwrap();
        assert_eq!(bfkv.phase("C").unwrap().ops_per_sec, 200.0);
        let lag = behind(&report);
        assert_eq!(lag.len(), 2, "{lag:?}");
        assert_eq!((lag[0].0, lag[0].3.as_str()), (1, "rocksdb"));
        assert!((lag[0].4 - 1.25).abs() < 1e-9);
        assert_eq!((lag[1].0, lag[1].3.as_str()), (2, "lmdb"));
        let text = section(&report);
        assert!(text.contains("| YCSB-C | 200 | 150 | 250 |"), "{text}");
        assert!(text.contains("**0.80**"), "{text}");
        // The disk table, in MiB (the fixture's files take 2 MiB per op/s).
        assert!(
            text.contains("| YCSB-C | 400 (1.0 log) | 300 | 500 |"),
            "{text}"
        );
    }

    #[test]
    fn numbers_format_for_tables() {
        assert_eq!(fmt_rate(1_234_567.0), "1.23M");
        assert_eq!(fmt_rate(456_789.0), "457k");
        assert_eq!(fmt_rate(12_345.0), "12.3k");
        assert_eq!(fmt_rate(987.4), "987");
        assert_eq!(fmt_rate(f64::NAN), "-");
        assert_eq!(fmt_mib(5 << 19), "2.5");
        assert_eq!(fmt_mib(300 << 20), "300");
        let t = table(&["a".into(), "b".into()], &[vec!["1".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 |  |\n");
    }
}
