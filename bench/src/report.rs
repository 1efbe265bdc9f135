//! What `flint-load --report DIR` writes: HDR histogram interval logs (the V2 log format with
//! compressed V2 histograms, readable by HdrHistogram's `HistogramLogProcessor` and
//! HistogramLogAnalyzer; values are microseconds) and `index.html`, a self-contained page with
//! the summary, a latency percentile plot and a throughput-over-time plot drawn as inline SVG.

use std::fmt::Write as _;
use std::path::Path;
use std::time::SystemTime;

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;

use crate::load::{RunResult, BUCKET};

/// One run in a report (a ramp has several).
#[derive(Debug)]
pub struct Section<'a> {
    /// Its name (also the log file's stem: letters, digits, `-` and `_`).
    pub name: String,
    /// What it measured.
    pub run: &'a RunResult,
}

/// Writes `run`'s interval histograms as an HDR interval log (V2, deflate-compressed).
pub fn hlog(run: &RunResult, tag: &str, started: SystemTime) -> Result<String, String> {
    let mut out = Vec::new();
    let mut serializer = V2DeflateSerializer::new();
    let mut writer = IntervalLogWriterBuilder::new()
        .add_comment("flint-load: task latency in microseconds, one histogram per second")
        .with_start_time(started)
        .with_base_time(started)
        .begin_log_with(&mut out, &mut serializer)
        .map_err(|e| format!("cannot write the log header: {e}"))?;
    writer
        .write_comment(
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"",
        )
        .map_err(|e| e.to_string())?;
    let tag = Tag::new(tag);
    for interval in &run.intervals {
        writer
            .write_histogram(&interval.histogram, interval.start, interval.length, tag)
            .map_err(|e| format!("cannot write a histogram: {e}"))?;
    }
    drop(writer);
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Writes `DIR/index.html` and `DIR/NAME.hlog` for every section; returns the page's path.
pub fn write(
    dir: &Path,
    title: &str,
    command: &str,
    sections: &[Section<'_>],
    ramp: Option<&str>,
    started: SystemTime,
) -> Result<std::path::PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut html = page_head(title, command);
    if let Some(ramp) = ramp {
        html.push_str(ramp);
    }
    summary_table(&mut html, dir, sections, started)?;
    plots(&mut html, sections);
    html.push_str(
        "<p>Latency is from just before a job's submit (closed loop) or from a task's intended \
         send time (open loop) to its result on the driver's loop. The <code>.hlog</code> files \
         are HdrHistogram interval logs (values in microseconds).</p>\n</body></html>\n",
    );
    let page = dir.join("index.html");
    std::fs::write(&page, html).map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    Ok(page)
}

/// The page's head and title, with the command that ran.
fn page_head(title: &str, command: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>\
         body{{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;\
         text-align:right}}th{{background:#f4f4f4}}code{{background:#f4f4f4;padding:2px 4px}}\
         svg{{background:#fff;border:1px solid #ddd;margin:.5em 0}}</style></head><body>\n\
         <h1>{t}</h1>\n<p><code>{c}</code></p>\n",
        t = escape(title),
        c = escape(command)
    );
    html
}

/// The table of every section's counts and latency percentiles; writes each section's
/// `NAME.hlog` into `dir`, which the table links to.
fn summary_table(
    html: &mut String,
    dir: &Path,
    sections: &[Section<'_>],
    started: SystemTime,
) -> Result<(), String> {
    html.push_str(
        "<table><tr><th>run</th><th>tasks</th><th>succeeded</th><th>failed</th><th>offered/s</th>\
         <th>tasks/s</th><th>p50 us</th><th>p90 us</th><th>p99 us</th><th>p99.9 us</th>\
         <th>max us</th><th>HDR log</th></tr>\n",
    );
    for section in sections {
        let s = &section.run.summary;
        let l = &s.latency_us;
        let log_name = format!("{}.hlog", section.name);
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><a href=\"{log_name}\">{log_name}</a>\
             </td></tr>",
            escape(&section.name),
            s.tasks,
            s.succeeded,
            s.failed,
            section
                .run
                .offered_per_s
                .map_or("-".to_string(), |r| format!("{r:.0}")),
            s.tasks_per_s,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        );
        let log = hlog(section.run, &section.name, started)?;
        let path = dir.join(&log_name);
        std::fs::write(&path, log).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    html.push_str("</table>\n");
    Ok(())
}

/// The latency-by-percentile and throughput-over-time charts of all sections.
fn plots(html: &mut String, sections: &[Section<'_>]) {
    let series: Vec<(String, &Histogram<u64>)> = sections
        .iter()
        .map(|s| (s.name.clone(), &s.run.histogram))
        .collect();
    html.push_str("<h2>Latency by percentile</h2>\n");
    html.push_str(&percentile_plot(&series));
    html.push_str("<h2>Throughput over time</h2>\n");
    let timelines: Vec<(String, Vec<(f64, f64)>)> = sections
        .iter()
        .map(|s| (s.name.clone(), throughput_points(&s.run.timeline)))
        .collect();
    html.push_str(&chart(
        "results per second (100 ms buckets)",
        "seconds since measurement start",
        "tasks/s",
        &timelines,
        Scale::Linear,
        Scale::Linear,
    ));
}

/// Results per second for each 100 ms bucket, at the bucket's middle.
pub fn throughput_points(timeline: &[u64]) -> Vec<(f64, f64)> {
    let bucket_s = BUCKET.as_secs_f64();
    timeline
        .iter()
        .enumerate()
        .map(|(i, &n)| ((i as f64 + 0.5) * bucket_s, n as f64 / bucket_s))
        .collect()
}

/// The HDR percentile plot: latency (log scale) against percentile, with the x axis stretched
/// as `1 / (1 - p)` so the tail gets room.
pub fn percentile_plot(series: &[(String, &Histogram<u64>)]) -> String {
    let points: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, h)| {
            let mut points = Vec::new();
            if !h.is_empty() {
                for v in h.iter_quantiles(4) {
                    let q = v.quantile_iterated_to();
                    if q >= 1.0 {
                        break;
                    }
                    points.push((1.0 / (1.0 - q), v.value_iterated_to().max(1) as f64));
                }
                points.push((1e6, h.max().max(1) as f64));
            }
            (name.clone(), points)
        })
        .collect();
    chart(
        "latency (us) by percentile",
        "percentile",
        "latency us",
        &points,
        Scale::Percentile,
        Scale::Log,
    )
}

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// As is.
    Linear,
    /// log10.
    Log,
    /// log10 of `1 / (1 - p)`, labelled as percentiles.
    Percentile,
}

impl Scale {
    fn map(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log | Scale::Percentile => v.max(1e-12).log10(),
        }
    }

    fn ticks(self, lo: f64, hi: f64) -> Vec<(f64, String)> {
        match self {
            Scale::Percentile => [
                (1.0, "0%"),
                (2.0, "50%"),
                (10.0, "90%"),
                (100.0, "99%"),
                (1e3, "99.9%"),
                (1e4, "99.99%"),
                (1e5, "99.999%"),
                (1e6, "max"),
            ]
            .iter()
            .map(|&(v, label): &(f64, &str)| (v.log10(), label.to_string()))
            .filter(|(v, _)| *v <= hi + 1e-9)
            .collect(),
            Scale::Log => {
                let mut ticks = Vec::new();
                let mut exp = lo.floor() as i32;
                while f64::from(exp) <= hi.ceil() {
                    let value = 10f64.powi(exp);
                    ticks.push((f64::from(exp), human(value)));
                    exp += 1;
                }
                ticks
            }
            Scale::Linear => {
                let span = (hi - lo).max(1e-9);
                let raw = span / 5.0;
                let magnitude = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 5.0, 10.0]
                    .iter()
                    .map(|m| m * magnitude)
                    .find(|s| *s >= raw)
                    .unwrap_or(magnitude * 10.0);
                let mut ticks = Vec::new();
                let mut v = (lo / step).floor() * step;
                while v <= hi + step * 1e-9 {
                    ticks.push((v, human(v)));
                    v += step;
                }
                ticks
            }
        }
    }
}

/// 1234567 as `1.2M`, 0.5 as `0.5`.
fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A chart's size and margins around its plot area, in pixels.
const CHART_W: f64 = 900.0;
const CHART_H: f64 = 420.0;
const CHART_LEFT: f64 = 70.0;
const CHART_RIGHT: f64 = 170.0;
const CHART_TOP: f64 = 30.0;
const CHART_BOTTOM: f64 = 50.0;

/// A line chart of `series` as inline SVG.
pub fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    x_scale: Scale,
    y_scale: Scale,
) -> String {
    let mapped: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, pts)| {
            pts.iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| (x_scale.map(x), y_scale.map(y)))
                .collect()
        })
        .collect();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_W}\" height=\"{CHART_H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"{}\" y=\"18\" \
         text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        (CHART_LEFT + CHART_W - CHART_RIGHT) / 2.0,
        escape(title)
    );
    let Some(mut plot) = Plot::around(&mapped) else {
        svg.push_str("<text x=\"100\" y=\"100\">no data</text></svg>\n");
        return svg;
    };
    plot.fit(x_scale, y_scale);
    let x_ticks = x_scale.ticks(plot.x0, plot.x1);
    let y_ticks = y_scale.ticks(plot.y0, plot.y1);
    if let Some(top) = y_ticks.last() {
        plot.y1 = plot.y1.max(top.0);
    }
    draw_grid(&mut svg, &plot, &x_ticks, &y_ticks);
    draw_frame(&mut svg, x_label, y_label);
    draw_series(&mut svg, &plot, series, &mapped);
    svg.push_str("</svg>\n");
    svg
}

/// The ranges a chart plots, in scale units.
struct Plot {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Plot {
    /// The ranges of the points; `None` without any.
    fn around(mapped: &[Vec<(f64, f64)>]) -> Option<Plot> {
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in mapped.iter().flatten() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        (x0 <= x1).then_some(Plot { x0, x1, y0, y1 })
    }

    /// Widens the ranges to what the scales show: from 0 (linear), whole decades (log), at
    /// least 2 on a percentile axis; never empty.
    fn fit(&mut self, x_scale: Scale, y_scale: Scale) {
        match x_scale {
            Scale::Percentile => {
                self.x0 = 0.0;
                self.x1 = self.x1.max(2.0);
            }
            Scale::Linear => self.x0 = self.x0.min(0.0),
            Scale::Log => {
                self.x0 = self.x0.floor();
                self.x1 = self.x1.ceil().max(self.x0 + 1.0);
            }
        }
        match y_scale {
            Scale::Linear => self.y0 = self.y0.min(0.0),
            Scale::Log => {
                self.y0 = self.y0.floor();
                self.y1 = self.y1.ceil().max(self.y0 + 1.0);
            }
            Scale::Percentile => {}
        }
        if self.x1 - self.x0 < 1e-9 {
            self.x1 = self.x0 + 1.0;
        }
        if self.y1 - self.y0 < 1e-9 {
            self.y1 = self.y0 + 1.0;
        }
    }

    /// The pixel column of `x`.
    fn px(&self, x: f64) -> f64 {
        CHART_LEFT + (x - self.x0) / (self.x1 - self.x0) * (CHART_W - CHART_LEFT - CHART_RIGHT)
    }

    /// The pixel row of `y`.
    fn py(&self, y: f64) -> f64 {
        CHART_H
            - CHART_BOTTOM
            - (y - self.y0) / (self.y1 - self.y0) * (CHART_H - CHART_TOP - CHART_BOTTOM)
    }
}

/// The tick lines and labels of both axes.
fn draw_grid(svg: &mut String, plot: &Plot, x_ticks: &[(f64, String)], y_ticks: &[(f64, String)]) {
    for (v, label) in x_ticks {
        let x = plot.px(*v);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#eee\"/>\
             <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            CHART_TOP,
            CHART_H - CHART_BOTTOM,
            CHART_H - CHART_BOTTOM + 16.0,
            escape(label)
        );
    }
    for (v, label) in y_ticks {
        let y = plot.py(*v);
        let _ = writeln!(
            svg,
            "<line x1=\"{CHART_LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            CHART_W - CHART_RIGHT,
            CHART_LEFT - 6.0,
            y + 4.0,
            escape(label)
        );
    }
}

/// The plot area's border and the axes' labels.
fn draw_frame(svg: &mut String, x_label: &str, y_label: &str) {
    let _ = writeln!(
        svg,
        "<rect x=\"{CHART_LEFT}\" y=\"{CHART_TOP}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        CHART_W - CHART_LEFT - CHART_RIGHT,
        CHART_H - CHART_TOP - CHART_BOTTOM,
        (CHART_LEFT + CHART_W - CHART_RIGHT) / 2.0,
        CHART_H - 10.0,
        escape(x_label),
        (CHART_TOP + CHART_H - CHART_BOTTOM) / 2.0,
        escape(y_label)
    );
}

/// One line per series, with its legend entry.
fn draw_series(
    svg: &mut String,
    plot: &Plot,
    series: &[(String, Vec<(f64, f64)>)],
    mapped: &[Vec<(f64, f64)>],
) {
    for (i, ((name, _), points)) in series.iter().zip(mapped).enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", plot.px(x), plot.py(y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.8\" points=\"{}\"/>\
             <rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{color}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            path.join(" "),
            CHART_W - CHART_RIGHT + 12.0,
            CHART_TOP + 10.0 + i as f64 * 18.0,
            CHART_W - CHART_RIGHT + 28.0,
            CHART_TOP + 15.0 + i as f64 * 18.0,
            escape(name)
        );
    }
}

/// Text safe inside HTML.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use hdrhistogram::serialization::Deserializer;
    use std::time::Duration;

    fn run_with(values: &[u64]) -> RunResult {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        let mut recorder = flint_cli::summary::Recorder::new();
        for &v in values {
            recorder.record(Ok(&[]), Duration::from_micros(v));
        }
        RunResult {
            summary: recorder.summary(values.len() as u64, 0, 0, Duration::from_secs(1)),
            histogram: h.clone(),
            intervals: vec![crate::load::Interval {
                start: Duration::ZERO,
                length: Duration::from_secs(1),
                histogram: h,
            }],
            timeline: vec![5, 7, 9],
            offered_per_s: None,
            saturated: false,
            beside: None,
        }
    }

    #[test]
    fn the_hdr_log_reads_back_with_the_same_counts() {
        let run = run_with(&[10, 20, 30, 4000]);
        let log = hlog(&run, "closed", SystemTime::now()).unwrap();
        let mut histograms = 0;
        for entry in IntervalLogIterator::new(log.as_bytes()) {
            if let LogEntry::Interval(interval) = entry.unwrap() {
                let bytes = base64_decode(interval.encoded_histogram());
                let h: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut std::io::Cursor::new(bytes))
                    .unwrap();
                assert_eq!(h.len(), 4);
                assert!(h.equivalent(h.max(), 4000));
                assert_eq!(interval.tag().map(|t| t.as_str()), Some("closed"));
                histograms += 1;
            }
        }
        assert_eq!(histograms, 1);
    }

    fn base64_decode(text: &str) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0);
        for c in text.bytes().filter(|&c| c != b'=') {
            let v = ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
            acc = (acc << 6) | v;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        out
    }

    #[test]
    fn the_page_has_both_plots_and_links_the_log() {
        let run = run_with(&[10, 20, 30]);
        let dir = std::env::temp_dir().join(format!("flint-report-test-{}", std::process::id()));
        let sections = [Section {
            name: "closed".into(),
            run: &run,
        }];
        let page = write(&dir, "t", "flint-load", &sections, None, SystemTime::now()).unwrap();
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(html.contains("latency (us) by percentile"));
        assert!(html.contains("results per second"));
        assert!(html.matches("<polyline").count() >= 2);
        assert!(html.contains("href=\"closed.hlog\""));
        assert!(dir.join("closed.hlog").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_tick_is_inside_the_plot() {
        let series = vec![(
            "p99".to_string(),
            vec![(2000.0, 250.0), (400_000.0, 480_000.0)],
        )];
        for (x, y) in [
            (Scale::Log, Scale::Log),
            (Scale::Linear, Scale::Linear),
            (Scale::Linear, Scale::Log),
        ] {
            let svg = chart("t", "x", "y", &series, x, y);
            for line in svg.lines().filter(|l| l.starts_with("<line")) {
                let coord = |name: &str| -> f64 {
                    let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                    let end = start + line[start..].find('"').unwrap();
                    line[start..end].parse().unwrap()
                };
                for v in [coord("x1"), coord("x2")] {
                    assert!((69.9..=730.1).contains(&v), "{x:?}/{y:?}: x {v} in {line}");
                }
                for v in [coord("y1"), coord("y2")] {
                    assert!((29.9..=370.1).contains(&v), "{x:?}/{y:?}: y {v} in {line}");
                }
            }
        }
    }

    #[test]
    fn linear_ticks_are_round() {
        let ticks = Scale::Linear.ticks(0.0, 1000.0);
        assert_eq!(ticks.first().unwrap().1, "0");
        assert!(ticks.iter().any(|(_, l)| l == "1k"));
    }
}
