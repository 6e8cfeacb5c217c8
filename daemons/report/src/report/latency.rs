//! A latency stream's section: each workflow key's end-to-end latency per step as a line, and each
//! application's mean transfer and compute time per step, stacked, from the `latency` and `latency_apps` tables.

use std::collections::BTreeMap;

use canopy_store::{LatencyAppRow, LatencyRow, Select, StreamRow};

use super::data::{Names, Stack};
use super::plot::{Chart, Figure, Line};
use super::{Context, Section};

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let select = Select::all().stream(stream.stream_id).late(false);
    let steps = ctx.reader.latency(select)?;
    let apps = ctx.reader.latency_apps(select)?;
    let mut facts = vec![("steps completed".to_string(), steps.len().to_string())];
    if !steps.is_empty() {
        let mut ms: Vec<f64> = steps.iter().map(|s| s.latency_ns as f64 / 1e6).collect();
        ms.sort_by(f64::total_cmp);
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        facts.push((
            "latency".to_string(),
            format!(
                "mean {mean:.3} ms, min {:.3} ms, max {:.3} ms",
                ms[0],
                ms[ms.len() - 1]
            ),
        ));
    }
    Ok(Section {
        anchor: format!("latency-{}", stream.stream_id),
        title: format!("Latency: {}", stream.name),
        intro: format!(
            "The end-to-end latency of each workflow step (latency table, stream {}): the latest stop minus the \
             earliest start over every rank of every application, a line per key; below, per step, each \
             application's mean exclusive time per rank in transfer events and in the rest (latency_apps).",
            stream.stream_id
        ),
        facts,
        figures: figures(&stream.name, &steps, &apps, &ctx.names),
        tables: Vec::new(),
    })
}

/// The two figures: latency per step (a line per key) and transfer and compute per application, stacked.
pub fn figures(stream: &str, steps: &[LatencyRow], apps: &[LatencyAppRow], names: &Names) -> Vec<Figure> {
    let mut by_key: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for s in steps {
        by_key
            .entry(s.key_id)
            .or_default()
            .push((s.step as f64, s.latency_ns as f64 / 1e6));
    }
    let lines = by_key
        .into_iter()
        .map(|(key, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line {
                label: names.of(key),
                points,
            }
        })
        .collect();
    let stack = Stack::from_points(apps.iter().flat_map(|a| {
        [
            (a.step, format!("{} transfer", a.app), a.transfer_us / 1000.0),
            (a.step, format!("{} compute", a.app), a.compute_us / 1000.0),
        ]
    }));
    vec![
        Figure {
            id: format!("latency:{stream}"),
            title: format!("{stream}: end-to-end latency per step"),
            x_label: "step".into(),
            y_label: "latency (ms)".into(),
            chart: Chart::Lines(lines),
        },
        Figure {
            id: format!("latency:{stream}:apps"),
            title: format!("{stream}: transfer and compute per application"),
            x_label: "step".into(),
            y_label: "mean time per rank (ms)".into(),
            chart: Chart::Stacked { stack, outline: None },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_figures_draw_a_point_per_step_and_a_band_per_application_part() {
        let key = canopy_wire::event_id("exchange");
        let steps: Vec<LatencyRow> = (0..20u64)
            .map(|s| LatencyRow {
                stream_id: 1,
                round: s,
                key_id: key,
                step: s,
                latency_ns: 30_000_000 + s * 100_000,
                start_unix_ns: 0,
                start_app: "simulation".into(),
                start_rank: 0,
                stop_unix_ns: 0,
                stop_app: "analysis".into(),
                stop_rank: 0,
                late: false,
            })
            .collect();
        let apps: Vec<LatencyAppRow> = (0..20u64)
            .flat_map(|s| {
                ["analysis", "simulation"].map(|app| LatencyAppRow {
                    stream_id: 1,
                    round: s,
                    key_id: key,
                    step: s,
                    app: app.into(),
                    ranks: 1,
                    transfer_us: 100.0,
                    compute_us: 30_000.0,
                    late: false,
                })
            })
            .collect();
        let names = Names::new(vec![(key, "exchange".into())]);
        let figs = figures("lat", &steps, &apps, &names);
        let line = figs[0].svg().unwrap();
        let points: Vec<usize> = line
            .split("<polyline")
            .skip(1)
            .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
            .map(|pts| pts.split_whitespace().count())
            .collect();
        assert!(points.contains(&20), "no line of 20 points: {points:?}");
        assert!(line.contains("exchange") && line.contains("latency (ms)"));
        let stacked = figs[1].svg().unwrap();
        for label in ["analysis transfer", "analysis compute", "simulation compute"] {
            assert!(stacked.contains(label), "{label} missing");
        }
        assert!(stacked.matches("<polygon").count() >= 4, "no stacked bands");
    }
}
