//! A histogram stream's section: for its top events, the histogram of every round side by side as a heat map
//! (round across, the metric's value up, the ranks in each bin as colour), from the `histograms` table.

use std::collections::BTreeSet;

use canopy_store::{Select, StreamRow, Word};

use super::data::{
    display_unit, heat_cells, merge_rounds, metric_label, plain_bins, time_metric, top_histogram_events,
};
use super::plot::{Chart, Figure};
use super::{Context, Section};

/// The most columns a heat map draws: beyond, consecutive rounds are merged, so a long run's page stays small.
const COLUMNS: usize = 200;

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx.reader.histograms(Select::all().stream(stream.stream_id))?;
    let mut section = Section {
        anchor: format!("histogram-{}", stream.stream_id),
        title: format!("Histograms: {}", stream.name),
        intro: format!(
            "Each round's histogram of an event, over the rounds (histograms table, stream {}): a column per round, \
             a cell per bin between its bounds (which follow the ranks' range round by round), coloured by the \
             ranks in it. The events are those whose bins hold the most time.",
            stream.stream_id
        ),
        ..Section::default()
    };
    let Some(metric) = time_metric(rows.iter().map(|r| &r.metric)) else {
        section.facts.push(("rows".into(), "none stored".into()));
        return Ok(section);
    };
    let bins = plain_bins(&rows, metric)
        .map(|r| r.bin)
        .max()
        .map_or(0, |b| b + 1);
    section.facts.push(("metric".into(), metric.word().to_string()));
    section.facts.push(("bins".into(), bins.to_string()));
    // A stream broken down by application has a histogram per application of each event, each between its
    // application's own bounds: a heat map each.
    let apps: BTreeSet<Option<&str>> = plain_bins(&rows, metric).map(|r| r.app.as_deref()).collect();
    for id in top_histogram_events(&rows, metric, ctx.top) {
        for &app in &apps {
            let cells = merge_rounds(&heat_cells(&rows, metric, id, app, true), COLUMNS);
            if cells.is_empty() {
                continue;
            }
            let name = match app {
                Some(app) if apps.len() > 1 => format!("{app}: {}", ctx.names.of(id)),
                _ => ctx.names.of(id),
            };
            let merged = match cells.first().map(|c| c.rounds) {
                Some(n) if n > 1 => format!(" ({n} rounds per column, counts added)"),
                _ => String::new(),
            };
            section.figures.push(Figure {
                id: format!("histogram:{}:{name}", stream.name),
                title: format!(
                    "{}: {name}, ranks per {} bin{merged}",
                    stream.name,
                    metric_label(metric)
                ),
                x_label: "round".into(),
                y_label: format!("{} ({})", metric_label(metric), display_unit(metric)),
                chart: Chart::Heat(cells),
            });
        }
    }
    Ok(section)
}
