//! The throughput matrix as an SVG: GB/s against chunk size, one panel per
//! directory, one line per target and operation.

use std::path::Path;

use plotters::prelude::*;

use crate::workloads::size_label;
use crate::{CHUNK_SIZES, Results};

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
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
