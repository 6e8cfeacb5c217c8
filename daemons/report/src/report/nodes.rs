//! A node stream's section: each node's busy CPU share and memory in use, round by round (the `node_samples`
//! table).

use std::collections::BTreeMap;

use canopy_store::{NodeSampleRow, Select, StreamRow};

use super::plot::{Chart, Figure, Line};
use super::{Context, Section};

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx
        .reader
        .node_samples(Select::all().stream(stream.stream_id).late(false))?;
    let nodes = rows
        .iter()
        .map(|r| r.node_id.as_str())
        .collect::<std::collections::BTreeSet<_>>();
    let figure = |part: &str, title: &str, y_label: &str, value: fn(&NodeSampleRow) -> Option<f64>| Figure {
        id: format!("nodes:{}:{part}", stream.name),
        title: format!("{}: {title}", stream.name),
        x_label: "round".into(),
        y_label: y_label.into(),
        chart: Chart::Lines(per_node(&rows, value)),
    };
    Ok(Section {
        anchor: format!("nodes-{}", stream.stream_id),
        title: format!("Nodes: {}", stream.name),
        intro: format!(
            "Each node's sample of each round (node_samples table, stream {}): the share of its CPUs' time not idle, \
             and the memory in use. A node whose agent ran no such sampler has no line.",
            stream.stream_id
        ),
        facts: vec![("nodes".into(), nodes.len().to_string())],
        figures: vec![
            figure("cpu", "CPU busy per node", "CPU busy (% of all CPUs)", |r| {
                r.cpu_idle_share.map(|idle| 100.0 * (1.0 - idle))
            }),
            figure("memory", "memory used per node", "memory used (MiB)", |r| {
                r.mem_used_bytes.map(|b| b as f64 / (1024.0 * 1024.0))
            }),
        ],
        tables: Vec::new(),
    })
}

/// A line per node (by its host name and id) of `value` over the rounds; nodes without values have none.
fn per_node(rows: &[NodeSampleRow], value: fn(&NodeSampleRow) -> Option<f64>) -> Vec<Line> {
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        if let Some(v) = value(r).filter(|v| v.is_finite()) {
            let label = if r.hostname.is_empty() {
                r.node_id.clone()
            } else {
                format!("{} ({})", r.node_id, r.hostname)
            };
            lines.entry(label).or_default().push((r.round as f64, v));
        }
    }
    lines
        .into_iter()
        .map(|(label, points)| Line { label, points })
        .collect()
}
