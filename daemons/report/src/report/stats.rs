//! A stats stream's section: its top events' time per round, each a mean line over its min–max band across the
//! ranks (ToM's figures of time per event per round with its spread), from the `stats` table.

use canopy_store::{Select, StreamRow, Word};

use super::data::{
    bands, display_unit, metric_label, mpi_share, plain_stats, round_durations, time_metric, top_stats_events,
};
use super::plot::{Chart, Figure, Line};
use super::{Context, Section};

/// Rounds a stream needs before its first is taken for start-up and left out of its figure.
const STEADY_AFTER: usize = 3;

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
    let asked = ctx.metric.filter(|m| rows.iter().any(|r| r.metric == *m));
    let Some(metric) = asked.or_else(|| time_metric(rows.iter().map(|r| &r.metric))) else {
        section.facts.push(("rows".into(), "none stored".into()));
        return Ok(section);
    };
    if let Some(m) = ctx.metric.filter(|m| *m != metric) {
        section
            .facts
            .push(("--metric".into(), format!("{} is not in this stream", m.word())));
    }
    // The first round holds the start-up (MPI_Init, reading the input): ranked and drawn with the rest, it sets
    // the scale and squashes every iteration. With rounds enough to tell, it is left out of the figure.
    let rounds: std::collections::BTreeSet<u64> = plain_stats(&rows, metric).map(|r| r.round).collect();
    let rows = match rounds.first() {
        Some(&first) if rounds.len() >= STEADY_AFTER => {
            section
                .facts
                .push(("start-up".into(), format!("round {first} left out of the figure")));
            rows.into_iter().filter(|r| r.round != first).collect()
        }
        _ => rows,
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
    // How time per iteration evolves, and how much of it is MPI.
    let rounds = ctx.reader.rounds(Select::all().stream(stream.stream_id))?;
    let durations = round_durations(&rounds);
    if durations.len() >= 2 {
        section.figures.push(per_round(
            format!("iterations:{}", stream.name),
            format!("{}: time per round (between the ranks' first dumps)", stream.name),
            "seconds",
            "time per round",
            &durations,
        ));
        let covered: std::collections::BTreeMap<u64, u32> =
            rounds.iter().map(|r| (r.round, r.covered)).collect();
        let share = mpi_share(&rows, &ctx.names, &durations, &covered);
        if !share.is_empty() {
            let mean = share.iter().map(|(_, s)| s).sum::<f64>() / share.len() as f64;
            section
                .facts
                .push(("time in MPI".into(), format!("{mean:.1}% of a round, on average")));
            section.figures.push(per_round(
                format!("mpi-share:{}", stream.name),
                format!("{}: share of each round a rank spends in MPI (mean)", stream.name),
                "% of the round",
                "MPI",
                &share,
            ));
        }
    }
    Ok(section)
}

/// A figure of one line over the rounds.
fn per_round(id: String, title: String, y_label: &str, label: &str, values: &[(u64, f64)]) -> Figure {
    Figure {
        id,
        title,
        x_label: "round".into(),
        y_label: y_label.into(),
        chart: Chart::Lines(vec![Line {
            label: label.into(),
            points: values.iter().map(|(r, y)| (*r as f64, *y)).collect(),
        }]),
    }
}
