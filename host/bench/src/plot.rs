//! The throughput matrix as an SVG: GB/s against chunk size, one panel per
//! directory, one line per target and operation; and the remote backends
//! against native clients (`--remote --plot`), one panel per backend and load.

use std::path::Path;

use plotters::prelude::*;

use crate::remote::Pair;
use crate::stats::Stat;
use crate::workloads::size_label;
use crate::{CHUNK_SIZES, Results, Row};

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// Write the plot to `path`.
pub fn write_svg(r: &Results, path: &Path) -> Result<(), String> {
    let width = 520 * r.media.len() as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, r.media.len()));
    for (panel, medium) in panels.iter().zip(&r.media) {
        let rows: Vec<_> = r
            .throughput
            .iter()
            .filter(|x| x.medium == medium.label)
            .collect();
        let top = rows
            .iter()
            .flat_map(|row| row.per_target.iter().map(|s| s.max))
            .fold(0.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("put/get throughput, {}", medium.label),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(-0.2f64..(CHUNK_SIZES.len() as f64 - 0.8), 0.0..top.max(0.1))
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_labels(CHUNK_SIZES.len())
            .x_label_formatter(&|x| {
                let i = x.round() as usize;
                CHUNK_SIZES
                    .get(i)
                    .map(|s| size_label(*s))
                    .unwrap_or_default()
            })
            .x_desc("chunk size")
            .y_desc("GB/s (median)")
            .draw()
            .map_err(|e| e.to_string())?;
        let mut color = 0;
        for (t, target) in r.targets.iter().enumerate() {
            for op in ["put", "get"] {
                let points: Vec<(f64, f64)> = CHUNK_SIZES
                    .iter()
                    .enumerate()
                    .filter_map(|(i, size)| {
                        let case = format!("{op} {}", size_label(*size));
                        let row = rows.iter().find(|x| x.case == case)?;
                        Some((i as f64, row.per_target[t].median))
                    })
                    .collect();
                let style = PALETTE[color % PALETTE.len()];
                color += 1;
                let dashed = op == "get";
                let line = LineSeries::new(
                    points.clone(),
                    style.stroke_width(if dashed { 1 } else { 2 }),
                );
                chart
                    .draw_series(line)
                    .map_err(|e| e.to_string())?
                    .label(format!("{target} {op}"))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], style.stroke_width(2))
                    });
                chart
                    .draw_series(points.iter().map(|p| Circle::new(*p, 3, style.filled())))
                    .map_err(|e| e.to_string())?;
            }
        }
        draw_legend(&mut chart)?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One panel of a bar plot: groups of bars (one bar per side, the native
/// baseline first), each with its min–max range and, where there is one,
/// the target a kvwasm bar must stay under.
struct BarPanel<'a> {
    title: String,
    y_desc: &'static str,
    groups: Vec<BarGroup<'a>>,
}

/// One x position of a [`BarPanel`].
struct BarGroup<'a> {
    label: String,
    bars: Vec<(&'a str, &'a Stat)>,
    target: Option<f64>,
}

/// A panel of either plot: f64 axes on the SVG backend.
type Panel<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The series legend, top left, as every panel draws it.
fn draw_legend(chart: &mut Panel<'_>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// The pairs of `kvwasm bench --remote` grouped into panels, in order:
/// one per native client and load (`save 96 × 1 MiB` and `restore with
/// prefetch 96 × 1 MiB` share the panel `96 × 1 MiB`); each operation's
/// target is its ratio times the native client's median.
fn remote_panels(pairs: &[Pair]) -> Vec<BarPanel<'_>> {
    let mut panels: Vec<BarPanel> = Vec::new();
    for pair in pairs {
        let (op, load) = match pair.case.strip_prefix("save ") {
            Some(load) => ("save", load),
            None => (
                "restore",
                pair.case
                    .strip_prefix("restore with prefetch ")
                    .unwrap_or(&pair.case),
            ),
        };
        let title = format!("{load}: {}", pair.native_label);
        let panel = match panels.iter().position(|p| p.title == title) {
            Some(i) => &mut panels[i],
            None => {
                panels.push(BarPanel {
                    title,
                    y_desc: "ms (median; bar: min–max)",
                    groups: Vec::new(),
                });
                panels.last_mut().expect("just pushed")
            }
        };
        let group = match panel.groups.iter().position(|g| g.label == op) {
            Some(i) => &mut panel.groups[i],
            None => {
                panel.groups.push(BarGroup {
                    label: op.into(),
                    bars: vec![(pair.native_label.as_str(), &pair.native)],
                    target: pair.target.map(|t| t * pair.native.median),
                });
                panel.groups.last_mut().expect("just pushed")
            }
        };
        group.bars.push((pair.kvwasm_label.as_str(), &pair.kvwasm));
    }
    panels
}

/// The remote comparison as an SVG: one panel per backend and load, a bar
/// per side (median ms, lower is better) with its min–max range.
pub fn write_remote_svg(pairs: &[Pair], path: &Path) -> Result<(), String> {
    write_bar_svg(&remote_panels(pairs), path)
}

/// `kvwasm bench --scale`'s rows (native, kvwasm) as panels: open latency,
/// the slowest opens, idle memory per handle and calls over all handles,
/// with issue 17's targets.
fn scale_panels(rows: &[Row]) -> Vec<BarPanel<'_>> {
    let group = |case: &str, label: &str, target: Option<f64>| {
        let row = rows.iter().find(|r| r.case == case)?;
        Some(BarGroup {
            label: label.into(),
            bars: vec![
                ("native", &row.per_target[0]),
                ("kvwasm", &row.per_target[1]),
            ],
            target,
        })
    };
    fn panel<'a>(
        title: &str,
        y_desc: &'static str,
        groups: Vec<Option<BarGroup<'a>>>,
    ) -> BarPanel<'a> {
        BarPanel {
            title: title.into(),
            y_desc,
            groups: groups.into_iter().flatten().collect(),
        }
    }
    let idle = Some(16.0);
    let calls = rows
        .iter()
        .filter(|r| r.case.contains(", round-robin over "))
        .map(|r| {
            let label = r.case.split(", round-robin").next().unwrap_or(&r.case);
            group(&r.case, label, None)
        })
        .collect();
    let panels = [
        panel(
            "open, warm artifact cache",
            "ms (median of runs; bar: min–max)",
            vec![
                group("open p50", "p50", None),
                group("open p99", "p99", Some(0.5)),
                group("open p99, thread CPU time", "p99 CPU", Some(0.5)),
            ],
        ),
        panel(
            "library load and the slowest open",
            "ms (median of runs; bar: min–max)",
            vec![
                group(
                    "library load (dlopen + kv_store_get_vtable)",
                    "library load",
                    None,
                ),
                group("open max", "max", Some(5.0)),
                group("open max, thread CPU time", "max CPU", Some(5.0)),
                group(
                    "open max, all but the first of each backend",
                    "max, not first",
                    Some(5.0),
                ),
            ],
        ),
        panel(
            "resident memory per idle handle",
            "KiB (median of runs; bar: min–max)",
            vec![
                group(
                    "resident memory per idle handle, after open",
                    "after open",
                    idle,
                ),
                group(
                    "resident memory per idle handle, after one put + get",
                    "after put+get",
                    idle,
                ),
                rows.iter()
                    .find(|r| {
                        r.case
                            .starts_with("resident memory per idle handle, after a manifest")
                    })
                    .and_then(|r| group(&r.case, "released", idle)),
            ],
        ),
        panel(
            "calls over every handle",
            "ns per call (median of runs)",
            calls,
        ),
    ];
    panels
        .into_iter()
        .filter(|p| !p.groups.is_empty())
        .collect()
}

/// The `--scale` figures as an SVG (docs/benchmarks-scale.svg).
pub fn write_scale_svg(rows: &[Row], path: &Path) -> Result<(), String> {
    write_bar_svg(&scale_panels(rows), path)
}

/// Bar panels side by side; a target is a red line over its group.
fn write_bar_svg(panels: &[BarPanel], path: &Path) -> Result<(), String> {
    if panels.is_empty() {
        return Err("no results to plot".into());
    }
    let width = 520 * panels.len() as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        let sides = panel.groups.iter().map(|g| g.bars.len()).max().unwrap_or(1);
        let top = panel
            .groups
            .iter()
            .flat_map(|g| g.bars.iter().map(|(_, s)| s.max).chain(g.target))
            .fold(0.0f64, f64::max)
            * 1.25;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(
                -0.5f64..(panel.groups.len() as f64 - 0.5),
                0.0..top.max(0.1),
            )
            .map_err(|e| e.to_string())?;
        let labels: Vec<&str> = panel.groups.iter().map(|g| g.label.as_str()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(labels.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() > 0.01 || i < 0.0 {
                    return String::new();
                }
                labels
                    .get(i as usize)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            })
            .y_desc(panel.y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        let slot = 0.8 / sides as f64;
        for side in 0..sides {
            let style = PALETTE[side % PALETTE.len()];
            let bars: Vec<(f64, &Stat)> = panel
                .groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    let x = i as f64 - 0.4 + slot * side as f64;
                    g.bars.get(side).map(|(_, stat)| (x, *stat))
                })
                .collect();
            let label = panel.groups[0].bars.get(side).map_or("", |(l, _)| l);
            chart
                .draw_series(bars.iter().map(|(x, s)| {
                    Rectangle::new([(*x, 0.0), (x + slot * 0.9, s.median)], style.filled())
                }))
                .map_err(|e| e.to_string())?
                .label(label.to_owned())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], style.filled())
                });
            chart
                .draw_series(bars.iter().map(|(x, s)| {
                    let mid = x + slot * 0.45;
                    PathElement::new(vec![(mid, s.min), (mid, s.max)], BLACK.stroke_width(1))
                }))
                .map_err(|e| e.to_string())?;
        }
        let targets: Vec<(f64, f64)> = panel
            .groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| Some((i as f64, g.target?)))
            .collect();
        if !targets.is_empty() {
            let red = RED.stroke_width(2);
            chart
                .draw_series(
                    targets
                        .iter()
                        .map(|&(x, y)| PathElement::new(vec![(x - 0.45, y), (x + 0.45, y)], red)),
                )
                .map_err(|e| e.to_string())?
                .label("target (kvwasm at most)")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], red));
        }
        draw_legend(&mut chart)?;
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(case: &str, native: &str, kvwasm: &str) -> Pair {
        Pair {
            case: case.into(),
            native_label: native.into(),
            native: Stat::new(vec![1.0, 2.0, 3.0]),
            kvwasm_label: kvwasm.into(),
            kvwasm: Stat::new(vec![2.0, 4.0, 6.0]),
            target: Some(1.3),
            native_cpu: crate::remote::Cpu {
                client: Stat::new(vec![1.0]),
                server: None,
                client_faults: Stat::new(vec![1.0]),
            },
            kvwasm_cpu: crate::remote::Cpu {
                client: Stat::new(vec![1.0]),
                server: None,
                client_faults: Stat::new(vec![1.0]),
            },
        }
    }

    /// Every load of every backend gets a panel, with save and restore
    /// grouped and the native client's bar first; all of them are drawn.
    #[test]
    fn remote_pairs_become_one_panel_per_backend_and_load() {
        let pairs = [
            pair("save 96 × 1 MiB", "redis crate", "kvwasm (redis)"),
            pair("save 96 × 1 MiB", "redis crate", "kvwasm (redis-batched)"),
            pair(
                "restore with prefetch 96 × 1 MiB",
                "redis crate",
                "kvwasm (redis)",
            ),
            pair("save 4096 × 4 KiB", "redis crate", "kvwasm (redis)"),
            pair("save 96 × 1 MiB", "reqwest", "kvwasm (s3)"),
        ];
        let panels = remote_panels(&pairs);
        let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "96 × 1 MiB: redis crate",
                "4096 × 4 KiB: redis crate",
                "96 × 1 MiB: reqwest"
            ]
        );
        let bars = |p: &BarPanel, op: usize| -> Vec<String> {
            p.groups[op]
                .bars
                .iter()
                .map(|(l, _)| l.to_string())
                .collect()
        };
        assert_eq!(panels[0].groups.len(), 2);
        assert_eq!(panels[0].groups[0].label, "save");
        assert_eq!(
            bars(&panels[0], 0),
            ["redis crate", "kvwasm (redis)", "kvwasm (redis-batched)"]
        );
        assert_eq!(panels[0].groups[1].label, "restore");
        assert_eq!(bars(&panels[0], 1), ["redis crate", "kvwasm (redis)"]);
        // The target is the ratio over the native client's median (2.0).
        assert_eq!(panels[0].groups[0].target, Some(1.3 * 2.0));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("remote.svg");
        write_remote_svg(&pairs, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in titles.iter().chain(&["kvwasm (redis-batched)", "restore"]) {
            assert!(svg.contains(text), "{text} missing from the plot");
        }
        assert!(write_remote_svg(&[], &path).is_err());
    }

    /// The scale rows become four panels, the targets on the
    /// groups they bound; cases the run did not have leave no empty group.
    #[test]
    fn scale_rows_become_panels_with_their_targets() {
        let row = |case: &str| Row {
            medium: "scale".into(),
            case: case.into(),
            unit: crate::Unit::Millis,
            per_target: vec![Stat::new(vec![1.0]), Stat::new(vec![2.0])],
        };
        let rows = [
            row("open p50"),
            row("open p99"),
            row("open max"),
            row("open max, all but the first of each backend"),
            row("resident memory per idle handle, after open"),
            row(
                "resident memory per idle handle, after a manifest and 1500 ms idle (kvwasm: instance released)",
            ),
            row("put 4 KiB, round-robin over 1000 handles"),
        ];
        let panels = scale_panels(&rows);
        let groups = |p: &BarPanel| -> Vec<(String, Option<f64>)> {
            p.groups
                .iter()
                .map(|g| (g.label.clone(), g.target))
                .collect()
        };
        assert_eq!(
            groups(&panels[0]),
            [("p50".into(), None), ("p99".into(), Some(0.5))]
        );
        assert_eq!(
            groups(&panels[1]),
            [
                ("max".into(), Some(5.0)),
                ("max, not first".into(), Some(5.0))
            ]
        );
        assert_eq!(
            groups(&panels[2]),
            [
                ("after open".into(), Some(16.0)),
                ("released".into(), Some(16.0))
            ]
        );
        assert_eq!(groups(&panels[3]), [("put 4 KiB".into(), None)]);
        assert_eq!(panels[3].groups[0].bars[1].0, "kvwasm");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scale.svg");
        write_scale_svg(&rows, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in [
            "library load and the slowest open",
            "resident memory per idle handle",
            "target (kvwasm at most)",
        ] {
            assert!(svg.contains(text), "{text} missing from the plot");
        }
        assert!(write_scale_svg(&[], &path).is_err());
    }
}
