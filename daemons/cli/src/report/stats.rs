//! A stats stream's section: its top events' time per round, each a mean line over its min–max band across the
//! ranks (ToM's figures of time per event per round with its spread), from the `stats` table.

use canopy_store::{Select, StreamRow, Word};

use super::data::{bands, display_unit, metric_label, plain_stats, time_metric, top_stats_events};
use super::plot::{Chart, Figure};
use super::{Context, Section};

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx.reader.stats(Select::all().stream(stream.stream_id))?;
    let mut section = Section {
        anchor: format!("stats-{}", stream.stream_id),
        title: format!("Stats: {}", stream.name),
        intro: format!(
            "The events with the largest total mean over the rounds (stats table, stream {}): the line is the mean \
             over the ranks each round, the shaded band runs from the least to the largest rank's value.",
            stream.stream_id
        ),
        ..Section::default()
    };
    let Some(metric) = time_metric(rows.iter().map(|r| &r.metric)) else {
        section.facts.push(("rows".into(), "none stored".into()));
        return Ok(section);
    };
    let top = top_stats_events(&rows, metric, ctx.top);
    let events = plain_stats(&rows, metric)
        .map(|r| r.id)
        .collect::<std::collections::HashSet<_>>()
        .len();
    section.facts.push(("metric".into(), metric.word().to_string()));
    section
        .facts
        .push(("events".into(), format!("{events} (top {} shown)", top.len())));
    section.figures.push(Figure {
        id: format!("stats:{}", stream.name),
        title: format!(
            "{}: top {} events by mean {} per round",
            stream.name,
            top.len(),
            metric_label(metric)
        ),
        x_label: "round".into(),
        y_label: format!("{} per rank ({})", metric_label(metric), display_unit(metric)),
        chart: Chart::Bands(bands(&rows, metric, &top, &ctx.names)),
    });
    Ok(section)
}
