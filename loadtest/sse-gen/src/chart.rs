//! A hand-written SVG of one crowd run over time: waiting users and open
//! streams, admissions per second, admission-to-ready and rank-update lag
//! per pass, and the server's Redis commands per second and CPU.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::Value;

#[derive(clap::Args, Clone, Debug)]
pub struct ChartArgs {
    /// A crowd report (JSON) from `sse-gen crowd`.
    #[arg(long)]
    pub report: PathBuf,
    #[arg(long, default_value = "sse-gen.svg")]
    pub out: PathBuf,
    #[arg(long)]
    pub title: Option<String>,
}

const W: f64 = 960.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const PANEL_H: f64 = 150.0;
const GAP: f64 = 48.0;
const TOP: f64 = 56.0;

struct Series {
    label: String,
    color: &'static str,
    points: Vec<(f64, f64)>,
    kind: Kind,
}

#[derive(PartialEq)]
enum Kind {
    Line,
    Dashed,
    Bars,
    Dots,
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_num(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

struct Chart {
    svg: String,
    tmax: f64,
    marks: Vec<(f64, &'static str)>,
    shade: Option<(f64, f64)>,
}

impl Chart {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.tmax).clamp(0.0, 1.0) * (W - LEFT - RIGHT)
    }

    fn panel(
        &mut self,
        i: usize,
        title: &str,
        unit: &str,
        series: &[Series],
        ymax_hint: Option<f64>,
    ) {
        let y0 = TOP + i as f64 * (PANEL_H + GAP);
        let data_max = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        let ymax = nice_max(ymax_hint.unwrap_or(data_max).max(1e-9));
        let y = |v: f64| y0 + PANEL_H - (v / ymax).clamp(0.0, 1.0) * PANEL_H;
        let (x0, x1) = (LEFT, W - RIGHT);
        let s = &mut String::new();
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="{:.1}" class="title">{}</text>"#,
            y0 - 10.0,
            esc(title)
        );
        if let Some((a, b)) = self.shade {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{y0}" width="{:.1}" height="{PANEL_H}" fill="#eef3fb"/>"##,
                self.x(a),
                (self.x(b) - self.x(a)).max(0.0)
            );
        }
        for k in 0..=4 {
            let v = ymax * k as f64 / 4.0;
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#ddd"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#,
                x0 - 6.0,
                yy + 4.0,
                fmt_num(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="14" y="{:.1}" class="tick" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
            y0 + PANEL_H / 2.0,
            y0 + PANEL_H / 2.0,
            esc(unit)
        );
        // time ticks
        let step = nice_max(self.tmax / 8.0);
        let mut t = 0.0;
        while t <= self.tmax + 1e-9 {
            let xx = self.x(t);
            let _ = writeln!(
                s,
                r#"<text x="{xx:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"#,
                y0 + PANEL_H + 14.0,
                if step >= 1.0 {
                    format!("{t:.0}")
                } else {
                    format!("{t:.1}")
                }
            );
            t += step;
        }
        for (m, (t, label)) in self.marks.iter().enumerate() {
            let xx = self.x(*t);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{y0}" x2="{xx:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="3,3"/>"##,
                y0 + PANEL_H
            );
            if i == 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" class="mark">{}</text>"#,
                    xx + 3.0,
                    y0 + 10.0 + 11.0 * m as f64,
                    esc(label)
                );
            }
        }
        let plot_w = x1 - x0;
        for (k, se) in series.iter().enumerate() {
            match se.kind {
                Kind::Bars => {
                    let bw = (plot_w / self.tmax * 0.8).clamp(1.0, 12.0);
                    for (t, v) in &se.points {
                        let _ = writeln!(
                            s,
                            r#"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="{}" opacity="0.8"/>"#,
                            self.x(*t) - bw / 2.0,
                            y(*v),
                            y0 + PANEL_H - y(*v),
                            se.color
                        );
                    }
                }
                Kind::Dots => {
                    for (t, v) in &se.points {
                        let _ = writeln!(
                            s,
                            r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{}"/>"#,
                            self.x(*t),
                            y(*v),
                            se.color
                        );
                    }
                }
                Kind::Line | Kind::Dashed => {
                    if se.points.is_empty() {
                        continue;
                    }
                    let dash = if se.kind == Kind::Dashed {
                        r#" stroke-dasharray="6,3""#
                    } else {
                        ""
                    };
                    // A gap of more than 3 s in the data breaks the line.
                    let mut runs: Vec<Vec<String>> = vec![Vec::new()];
                    let mut last: Option<f64> = None;
                    for (t, v) in &se.points {
                        if last.is_some_and(|l| t - l > 3.0) {
                            runs.push(Vec::new());
                        }
                        last = Some(*t);
                        if let Some(run) = runs.last_mut() {
                            run.push(format!("{:.1},{:.1}", self.x(*t), y(*v)));
                        }
                    }
                    for run in runs.iter().filter(|r| !r.is_empty()) {
                        if run.len() == 1 {
                            let (px, py) = run[0].split_once(',').unwrap_or(("0", "0"));
                            let _ = writeln!(
                                s,
                                r#"<circle cx="{px}" cy="{py}" r="2" fill="{}"/>"#,
                                se.color
                            );
                            continue;
                        }
                        let _ = writeln!(
                            s,
                            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"{dash}/>"#,
                            run.join(" "),
                            se.color
                        );
                    }
                }
            }
            let ly = y0 + 12.0 + k as f64 * 16.0;
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="12" height="4" fill="{}"/>"#,
                x1 + 10.0,
                ly - 4.0,
                se.color
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{ly:.1}" class="legend">{}</text>"#,
                x1 + 26.0,
                esc(&se.label)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
        );
        self.svg.push_str(s);
    }
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

pub fn run(a: ChartArgs) -> anyhow::Result<()> {
    let r: Value =
        serde_json::from_slice(&std::fs::read(&a.report).context("reading the report")?)?;
    let svg = render(&r, a.title.as_deref());
    std::fs::write(&a.out, svg)?;
    println!("chart: {}", a.out.display());
    Ok(())
}

pub fn render(r: &Value, title: Option<&str>) -> String {
    let empty = Vec::new();
    let passes = r["series"]["passes"].as_array().unwrap_or(&empty);
    let timeline = r["series"]["timeline"].as_array().unwrap_or(&empty);
    let ph = &r["phases"];
    let tmax = timeline
        .iter()
        .filter_map(|s| f(&s["t"]))
        .chain(passes.iter().filter_map(|p| f(&p["t"])))
        .fold(1.0f64, f64::max);
    let mut marks = Vec::new();
    if let Some(t) = f(&ph["crowd_started_s"]) {
        marks.push((t, "crowd enters"));
    }
    if let Some(t) = f(&ph["all_open_s"]) {
        marks.push((t, "all open"));
    }
    if let Some(t) = f(&ph["release_s"]) {
        marks.push((t, "admission runs"));
    }
    let shade = match (f(&r["steady"]["from_s"]), f(&r["steady"]["to_s"])) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    let mut c = Chart {
        svg: String::new(),
        tmax,
        marks,
        shade,
    };
    let in_range = |t: f64| t >= 0.0 && t <= tmax;

    // 1. waiting users
    let waiting: Vec<(f64, f64)> = passes
        .iter()
        .filter_map(|p| Some((f(&p["t"])?, f(&p["waiting"])?)))
        .filter(|p| in_range(p.0))
        .collect();
    let open: Vec<(f64, f64)> = timeline
        .iter()
        .filter_map(|s| Some((f(&s["t"])?, f(&s["open"])?)))
        .collect();
    let open_label = if r["mode"] == "poll" {
        "polling buyers"
    } else {
        "open SSE streams"
    };
    c.panel(
        0,
        "Waiting users",
        "users",
        &[
            Series {
                label: "waiting (server)".into(),
                color: "#1f5fbf",
                points: waiting,
                kind: Kind::Line,
            },
            Series {
                label: open_label.into(),
                color: "#e08a00",
                points: open,
                kind: Kind::Dashed,
            },
        ],
        None,
    );

    // 2. admissions per second (per pass, over the gap to the previous pass)
    let mut adm = Vec::new();
    let mut prev: Option<f64> = None;
    for p in passes {
        let Some(t) = f(&p["t"]) else { continue };
        let n = f(&p["admitted"]).unwrap_or(0.0);
        let gap = prev.map_or(1.0, |q| (t - q).max(0.05));
        prev = Some(t);
        if n > 0.0 && in_range(t) {
            adm.push((t, n / gap));
        }
    }
    c.panel(
        1,
        "Admissions per second",
        "admitted/s",
        &[Series {
            label: "admitted / s".into(),
            color: "#2a9d55",
            points: adm,
            kind: Kind::Bars,
        }],
        None,
    );

    // 3. lags per pass
    let pick = |k: &str| -> Vec<(f64, f64)> {
        passes
            .iter()
            .filter_map(|p| Some((f(&p["t"])?, f(&p[k])?)))
            .filter(|p| in_range(p.0))
            .collect()
    };
    let (p50, p99, mx, rank99) = (
        pick("ready_lag_p50"),
        pick("ready_lag_p99"),
        pick("ready_lag_max"),
        pick("rank_lag_p99"),
    );
    let hint = p99
        .iter()
        .chain(rank99.iter())
        .map(|p| p.1)
        .fold(0.0f64, f64::max)
        * 1.2;
    c.panel(
        2,
        "Admission-to-ready lag and rank-update lag, per pass (clipped at 1.2 x the largest p99)",
        "ms",
        &[
            Series {
                label: "ready lag p50".into(),
                color: "#2a9d55",
                points: p50,
                kind: Kind::Line,
            },
            Series {
                label: "ready lag p99".into(),
                color: "#c0392b",
                points: p99,
                kind: Kind::Line,
            },
            Series {
                label: "ready lag max".into(),
                color: "#c0392b",
                points: mx,
                kind: Kind::Dots,
            },
            Series {
                label: "rank update p99".into(),
                color: "#7d3cbf",
                points: rank99,
                kind: Kind::Dashed,
            },
        ],
        Some(hint),
    );

    // 4. Redis commands/s and server CPU
    let mut cmds = Vec::new();
    let mut cpu = Vec::new();
    for w in timeline.windows(2) {
        let (Some(t0), Some(t1)) = (f(&w[0]["t"]), f(&w[1]["t"])) else {
            continue;
        };
        let dt = (t1 - t0).max(1e-3);
        if let (Some(a), Some(b)) = (f(&w[0]["redis_calls"]), f(&w[1]["redis_calls"])) {
            cmds.push((t1, (b - a) / dt));
        }
        if let (Some(a), Some(b)) = (f(&w[0]["server_cpu_s"]), f(&w[1]["server_cpu_s"])) {
            cpu.push((t1, 100.0 * (b - a) / dt));
        }
    }
    // The axis fits the rate once every stream is open (the crowd's enters
    // come before and go off the top).
    let open_at = f(&ph["all_open_s"]).unwrap_or(0.0) + 2.0;
    let cmd_max = cmds
        .iter()
        .filter(|p| p.0 >= open_at)
        .map(|p| p.1)
        .fold(0.0f64, f64::max);
    // CPU scaled onto the commands axis: 200 % (2 cores) = the axis top.
    let top = nice_max(cmd_max);
    let cpu_scaled: Vec<(f64, f64)> = cpu.iter().map(|(t, v)| (*t, v / 200.0 * top)).collect();
    c.panel(
        3,
        &format!(
            "Redis commands per second (the enters go off the top), and server CPU (dashed; axis top = 200 % = {} cmd/s)",
            fmt_num(top)
        ),
        "commands/s",
        &[
            Series {
                label: "redis cmds/s".into(),
                color: "#1f5fbf",
                points: cmds,
                kind: Kind::Line,
            },
            Series {
                label: "server CPU".into(),
                color: "#888",
                points: cpu_scaled,
                kind: Kind::Dashed,
            },
        ],
        Some(top),
    );

    let h = TOP + 4.0 * (PANEL_H + GAP) + 10.0;
    let default_title = format!(
        "waitroom, {} crowd of {} buyers (x: seconds since the generator started; shaded: steady window)",
        r["mode"].as_str().unwrap_or("?"),
        r["users"]
    );
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"#
    );
    out.push_str(
        "<style>.title{font-size:13px;font-weight:bold;fill:#222}.tick{font-size:10px;fill:#555}.legend{font-size:11px;fill:#333}.mark{font-size:10px;fill:#666}.head{font-size:15px;font-weight:bold}</style>\n",
    );
    out.push_str(r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    out.push('\n');
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="24" class="head">{}</text>"#,
        esc(title.unwrap_or(&default_title))
    );
    out.push_str(&c.svg);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_an_empty_report() {
        let svg = super::render(&serde_json::json!({}), None);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn nice() {
        assert_eq!(super::nice_max(15_000.0), 20_000.0);
        assert_eq!(super::nice_max(0.7), 1.0);
    }
}
