//! The soak chart: one SVG, one panel per figure over time (RSS and
//! descriptors per instance, Redis memory and keys, streams, admission
//! rate against the configured one), the end of the load marked.

use std::fmt::Write as _;

use super::{Sample, SoakArgs};

const W: f64 = 900.0;
const PANEL_H: f64 = 120.0;
const GAP: f64 = 34.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// A line: its name and points (t in s, value).
type Series = (String, Vec<(f64, f64)>);

pub fn render(a: &SoakArgs, samples: &[Sample]) -> String {
    let n = a.server_pids.len();
    let per = |f: &dyn Fn(&Sample, usize) -> Option<f64>, name: &str| -> Vec<Series> {
        (0..n)
            .map(|i| {
                let pts = samples
                    .iter()
                    .filter_map(|s| f(s, i).map(|v| (s.t, v)))
                    .collect();
                (format!("{name} {}", i + 1), pts)
            })
            .collect()
    };
    let one = |f: &dyn Fn(&Sample) -> Option<f64>, name: &str| -> Vec<Series> {
        vec![(
            name.to_owned(),
            samples
                .iter()
                .filter_map(|s| f(s).map(|v| (s.t, v)))
                .collect(),
        )]
    };
    let panels: Vec<(&str, Vec<Series>, Option<f64>)> = vec![
        (
            "RSS per instance (MiB)",
            per(
                &|s, i| s.rss_kib.get(i).map(|k| *k as f64 / 1024.0),
                "instance",
            ),
            None,
        ),
        (
            "open descriptors per instance",
            per(&|s, i| s.fds.get(i).map(|v| *v as f64), "instance"),
            None,
        ),
        (
            "Redis used_memory (MiB)",
            one(&|s| Some(s.used_memory as f64 / 1_048_576.0), "used_memory"),
            None,
        ),
        ("Redis keys", one(&|s| Some(s.keys as f64), "keys"), None),
        (
            "streams open (per instance) and waiting",
            {
                let mut v = per(
                    &|s, i| s.streams.get(i).copied().filter(|x| x.is_finite()),
                    "streams",
                );
                v.extend(one(&|s| Some(s.waiting as f64), "waiting"));
                v
            },
            None,
        ),
        (
            "admitted per second (dashed: configured)",
            one(&|s| (s.t > 0.0).then_some(s.admit_rate), "admitted/s"),
            Some(a.configured_rate),
        ),
    ];
    let t_max = samples.iter().map(|s| s.t).fold(1.0, f64::max);
    let h = 40.0 + panels.len() as f64 * (PANEL_H + GAP);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="20" font-size="14">Soak: {n} instances on one Redis, {} min load, then the drain</text>"#,
        a.duration_secs / 60
    );
    let plot_w = W - LEFT - RIGHT;
    let x = |t: f64| LEFT + t / t_max * plot_w;
    for (k, (title, series, reference)) in panels.iter().enumerate() {
        let top = 40.0 + k as f64 * (PANEL_H + GAP) + 16.0;
        let mut y_max = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, v)| *v))
            .chain(*reference)
            .fold(0.0, f64::max);
        if y_max <= 0.0 {
            y_max = 1.0;
        }
        y_max *= 1.1;
        let y = |v: f64| top + PANEL_H - v / y_max * PANEL_H;
        let _ = write!(
            svg,
            r##"<text x="{LEFT}" y="{}" font-weight="bold">{title}</text><rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="end">{}</text><text x="{}" y="{}" text-anchor="end">0</text>"##,
            top - 4.0,
            LEFT - 4.0,
            top + 10.0,
            fmt(y_max),
            LEFT - 4.0,
            top + PANEL_H,
        );
        let load_x = x(a.duration_secs as f64);
        let _ = write!(
            svg,
            r##"<line x1="{load_x:.1}" y1="{top}" x2="{load_x:.1}" y2="{}" stroke="#888" stroke-dasharray="2,3"/>"##,
            top + PANEL_H
        );
        if let Some(r) = reference {
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#555" stroke-dasharray="6,4"/>"##,
                y(*r),
                LEFT + plot_w,
                y(*r)
            );
        }
        for (j, (name, pts)) in series.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let path: Vec<String> = pts
                .iter()
                .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/><text x="{}" y="{}" fill="{color}">{name}</text>"#,
                path.join(" "),
                LEFT + plot_w + 8.0,
                top + 14.0 + j as f64 * 14.0
            );
        }
    }
    let bottom = h - 6.0;
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="{bottom}">0 s</text><text x="{}" y="{bottom}" text-anchor="end">{:.0} s (dotted line: end of the load)</text></svg>"#,
        LEFT + plot_w,
        t_max
    );
    svg
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
