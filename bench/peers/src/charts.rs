//! Charts of a [`Report`] with `plotters`, each as SVG and PNG under `docs/charts/`:
//! grouped bars of throughput per phase and engine (one chart per regime and thread count),
//! and a radar of lookup / scan / update per engine normalised to the best (the paper's
//! Figure 1 style).

use std::path::{Path, PathBuf};

use bfkv_workload::runner::BoxError;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::report::{engines_in, fmt_rate, phase_label, thread_counts, PHASE_ROWS};
use crate::results::{Report, RunResult};

/// Chart size in pixels.
const BAR_SIZE: (u32, u32) = (1000, 520);
/// Radar size in pixels.
const RADAR_SIZE: (u32, u32) = (640, 600);

/// The radar's axes: (phase, label).
const RADAR_AXES: [(&str, &str); 3] = [
    ("C", "lookup (YCSB-C)"),
    ("E", "scan (YCSB-E)"),
    ("A", "update (YCSB-A)"),
];

/// A fixed colour per engine, so charts agree with each other.
fn colour(engine: &str) -> RGBColor {
    match engine {
        "bfkv" => RGBColor(214, 39, 40),
        "bf-tree" => RGBColor(255, 127, 14),
        "rocksdb" => RGBColor(31, 119, 180),
        "rocksdb-buffered" => RGBColor(23, 190, 207),
        "redb" => RGBColor(44, 160, 44),
        "fjall" => RGBColor(148, 103, 189),
        "lmdb" => RGBColor(140, 86, 75),
        "sled" => RGBColor(127, 127, 127),
        _ => RGBColor(0, 0, 0),
    }
}

/// Turns a plotters error into ours.
fn err<E: std::fmt::Debug>(e: E) -> BoxError {
    format!("chart: {e:?}").into()
}

/// Finds a TrueType font on this system (DejaVu Sans first) and registers it as
/// `sans-serif` for the PNG and SVG backends. `None` if there is none: no charts then.
pub fn register_font() -> Option<PathBuf> {
    let preferred = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
    let path = if preferred.is_file() {
        preferred.to_path_buf()
    } else {
        find_ttf(Path::new("/usr/share/fonts"), 4)?
    };
    let bytes = std::fs::read(&path).ok()?;
    // plotters keeps fonts for the whole process; this one is loaded once per run.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).ok()?;
    Some(path)
}

/// The first `.ttf` file under `dir`, at most `depth` levels down.
fn find_ttf(dir: &Path, depth: usize) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in &entries {
        if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("ttf")) {
            return Some(p.clone());
        }
    }
    if depth == 0 {
        return None;
    }
    entries
        .iter()
        .filter(|p| p.is_dir())
        .find_map(|p| find_ttf(p, depth - 1))
}

/// Draws every chart of `report` into `dir`; returns the files written (stem paths).
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for threads in thread_counts(report) {
        for regime in [1u8, 2] {
            let runs = engines_in(report, regime, threads, &crate::engines::ALL);
            if runs.is_empty() {
                continue;
            }
            let title = format!(
                "Regime {regime} ({}), {threads} thread{}: ops/s (log scale)",
                if regime == 1 {
                    "equal budget, direct I/O"
                } else {
                    "equal footprint"
                },
                if threads == 1 { "" } else { "s" }
            );
            let stem = dir.join(format!("peers-r{regime}-t{threads}"));
            svg_and_png(&stem, BAR_SIZE, &Bars { title, runs: &runs })?;
            written.push(stem);
            let title = format!(
                "Regime {regime}, {threads} thread{}: share of the best",
                if threads == 1 { "" } else { "s" }
            );
            let stem = dir.join(format!("peers-radar-r{regime}-t{threads}"));
            svg_and_png(&stem, RADAR_SIZE, &Radar { title, runs: &runs })?;
            written.push(stem);
        }
    }
    Ok(written)
}

/// A chart that can be drawn on any plotters backend.
trait Chart {
    /// Draws the chart on `root`.
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), BoxError>;
}

/// Draws `chart` into `<stem>.svg` and `<stem>.png`.
fn svg_and_png(stem: &Path, size: (u32, u32), chart: &impl Chart) -> Result<(), BoxError> {
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    chart.draw(SVGBackend::new(&svg, size).into_drawing_area())?;
    chart.draw(BitMapBackend::new(&png, size).into_drawing_area())
}

/// Grouped bars: one group per phase, one bar per engine, log-scale ops/s.
struct Bars<'a> {
    /// Caption.
    title: String,
    /// One engine each.
    runs: &'a [RunResult],
}

impl Chart for Bars<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), BoxError> {
        bars(root, &self.title, self.runs)
    }
}

/// The radar of lookup / scan / update.
struct Radar<'a> {
    /// Caption.
    title: String,
    /// One engine each.
    runs: &'a [RunResult],
}

impl Chart for Radar<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), BoxError> {
        radar(root, &self.title, self.runs)
    }
}

/// Draws [`Bars`].
fn bars<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    runs: &[RunResult],
) -> Result<(), BoxError> {
    root.fill(&WHITE).map_err(err)?;
    let phases: Vec<&str> = PHASE_ROWS
        .iter()
        .copied()
        .filter(|p| runs.iter().any(|r| r.phase(p).is_some()))
        .collect();
    let values = runs
        .iter()
        .flat_map(|r| r.phases.iter().map(|p| p.ops_per_sec))
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= 0.0 {
        return Ok(());
    }
    // Whole decades below and above, so the log axis has round ends.
    let y0 = 10f64.powf(lo.log10().floor());
    let y1 = 10f64.powf(hi.log10().ceil());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..phases.len() as f64, (y0..y1).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc("ops/s")
        .y_label_formatter(&|v| fmt_rate(*v))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let width = 0.8 / runs.len().max(1) as f64;
    for (i, run) in runs.iter().enumerate() {
        let c = colour(&run.engine);
        let rects = phases.iter().enumerate().filter_map(|(pi, p)| {
            let v = run.phase(p)?.ops_per_sec.max(y0);
            let x = pi as f64 + 0.1 + i as f64 * width;
            Some(Rectangle::new([(x, y0), (x + width * 0.9, v)], c.filled()))
        });
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(run.engine.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], c.filled()));
    }
    for (pi, p) in phases.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(pi as f64 + 0.5, y0));
        let style =
            TextStyle::from(("sans-serif", 16).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(phase_label(p), (px, py + 8), style))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The point at `share` (0..1) along radar axis `i` of `n` (axis 0 points up).
fn radar_point(i: usize, n: usize, share: f64) -> (f64, f64) {
    let angle = std::f64::consts::FRAC_PI_2 - i as f64 * std::f64::consts::TAU / n as f64;
    (share * angle.cos(), share * angle.sin())
}

/// Each engine's lookup / scan / update throughput as a share of the best engine's.
pub fn radar_shares(runs: &[RunResult]) -> Vec<(String, Vec<f64>)> {
    let best: Vec<f64> = RADAR_AXES
        .iter()
        .map(|(p, _)| {
            runs.iter()
                .filter_map(|r| r.phase(p).map(|x| x.ops_per_sec))
                .fold(0f64, f64::max)
        })
        .collect();
    runs.iter()
        .filter(|r| RADAR_AXES.iter().all(|(p, _)| r.phase(p).is_some()))
        .map(|r| {
            let shares = RADAR_AXES
                .iter()
                .zip(&best)
                .map(|((p, _), b)| r.phase(p).map_or(0.0, |x| x.ops_per_sec / b.max(1e-9)))
                .collect();
            (r.engine.clone(), shares)
        })
        .collect()
}

/// Draws [`Radar`]: rings at 25 % steps, one axis per operation, one polygon per engine.
fn radar<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    runs: &[RunResult],
) -> Result<(), BoxError> {
    root.fill(&WHITE).map_err(err)?;
    let n = RADAR_AXES.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .build_cartesian_2d(-1.45f64..1.45, -1.1f64..1.35)
        .map_err(err)?;
    let grey = RGBColor(200, 200, 200);
    for ring in [0.25, 0.5, 0.75, 1.0] {
        let mut pts: Vec<(f64, f64)> = (0..n).map(|i| radar_point(i, n, ring)).collect();
        pts.push(pts[0]);
        chart
            .draw_series(std::iter::once(PathElement::new(pts, grey)))
            .map_err(err)?;
    }
    for (i, (_, label)) in RADAR_AXES.iter().enumerate() {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, 0.0), radar_point(i, n, 1.0)],
                grey,
            )))
            .map_err(err)?;
        let (x, y) = radar_point(i, n, 1.12);
        let style = TextStyle::from(("sans-serif", 16).into_font())
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart
            .draw_series(std::iter::once(Text::new(label.to_string(), (x, y), style)))
            .map_err(err)?;
    }
    for (engine, shares) in radar_shares(runs) {
        let c = colour(&engine);
        let mut pts: Vec<(f64, f64)> = shares
            .iter()
            .enumerate()
            .map(|(i, s)| radar_point(i, n, *s))
            .collect();
        chart
            .draw_series(std::iter::once(Polygon::new(
                pts.clone(),
                c.mix(0.12).filled(),
            )))
            .map_err(err)?;
        pts.push(pts[0]);
        chart
            .draw_series(std::iter::once(PathElement::new(pts, c.stroke_width(3))))
            .map_err(err)?
            .label(engine)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::PhaseResult;

    fn run(engine: &str, c: f64, e: f64, a: f64) -> RunResult {
        let phase = |name: &str, v: f64| PhaseResult {
            phase: name.into(),
            ops: v as u64,
            secs: 1.0,
            ops_per_sec: v,
            peak_rss: 1 << 20,
            page_cache: 0,
            mapped: 0,
            footprint: 1 << 20,
            read_bytes: Some(0),
            write_bytes: Some(0),
            engine_pages: None,
            disk_bytes: 0,
            log_bytes: 0,
        };
        RunResult {
            engine: engine.into(),
            regime: 1,
            threads: 1,
            records: 1,
            cache: 1 << 20,
            dist: "zipf 0.9".into(),
            peak_reset: true,
            phases: vec![
                phase("load", 1000.0),
                phase("C", c),
                phase("E", e),
                phase("A", a),
            ],
        }
    }

    #[test]
    fn radar_normalises_each_axis_to_its_best() {
        let runs = [
            run("bfkv", 100.0, 10.0, 50.0),
            run("sled", 50.0, 20.0, 50.0),
        ];
        let shares = radar_shares(&runs);
        assert_eq!(shares[0], ("bfkv".to_string(), vec![1.0, 0.5, 1.0]));
        assert_eq!(shares[1], ("sled".to_string(), vec![0.5, 1.0, 1.0]));
        let (x, y) = radar_point(0, 3, 1.0);
        assert!(x.abs() < 1e-12 && (y - 1.0).abs() < 1e-12);
    }

    #[test]
    fn charts_are_written_as_svg_and_png() {
        if register_font().is_none() {
            eprintln!("no TrueType font on this system: chart test skipped");
            return;
        }
        let report = Report {
            runs: vec![run("bfkv", 1e6, 2e4, 5e5), run("lmdb", 2e6, 3e4, 1e5)],
            ..Report::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let stems = write_all(&report, dir.path()).unwrap();
        assert_eq!(stems.len(), 2);
        for stem in stems {
            let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
            assert!(svg.contains("lmdb") && svg.contains("YCSB-C"), "{stem:?}");
            let png = std::fs::read(stem.with_extension("png")).unwrap();
            assert_eq!(&png[1..4], b"PNG");
        }
    }
}
