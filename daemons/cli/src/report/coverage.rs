//! The coverage section: for every stream, its ranks round by round, covered and missing by reason, stacked up
//! to the ranks expected (the `rounds` table: `covered` and the `missing_*` columns).

use canopy_proto::v1::MissingReason;
use canopy_store::{RoundRow, Select, StreamRow, Word};

use super::data::Stack;
use super::plot::{Chart, Figure, Line};
use super::{Context, Section};

pub fn section(ctx: &Context<'_>, streams: &[StreamRow]) -> anyhow::Result<Section> {
    let mut section = Section {
        anchor: "coverage".into(),
        title: "Coverage".into(),
        intro: "Every stream's ranks round by round (rounds table): the ranks whose data is in the round's result \
                (covered), and the missing ones by reason (late, lost, stopped, ...), stacked up to the ranks \
                expected (the black line)."
            .into(),
        ..Section::default()
    };
    for stream in streams {
        let rows = ctx.reader.rounds(Select::all().stream(stream.stream_id))?;
        if rows.is_empty() {
            continue;
        }
        let full = rows.iter().filter(|r| r.is_full()).count();
        let missing = missing_words(&rows);
        section.facts.push((
            stream.name.clone(),
            format!(
                "{} rounds, {full} at full coverage{}",
                rows.len(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!("; missing ranks: {}", missing.join(", "))
                }
            ),
        ));
        section.figures.push(figure(stream, &rows));
    }
    Ok(section)
}

/// The figure of one stream's rounds.
pub fn figure(stream: &StreamRow, rows: &[RoundRow]) -> Figure {
    let points = rows.iter().flat_map(|r| {
        let covered = std::iter::once((r.round, "covered".to_string(), f64::from(r.covered)));
        let missing = MissingReason::WORDS.iter().filter_map(move |(reason, word)| {
            let n = r.missing.get(*reason);
            (n > 0).then(|| (r.round, format!("missing: {word}"), f64::from(n)))
        });
        covered.chain(missing)
    });
    let expected = Line {
        label: "expected".into(),
        points: rows
            .iter()
            .map(|r| (r.round as f64, f64::from(r.expected)))
            .collect(),
    };
    Figure {
        id: format!("coverage:{}", stream.name),
        title: format!("{}: ranks per round, covered and missing", stream.name),
        x_label: "round".into(),
        y_label: "ranks".into(),
        chart: Chart::Stacked {
            stack: Stack::from_points(points),
            outline: Some(expected),
        },
    }
}

/// The reasons ranks went missing for, with their rank-rounds (`late: 12`).
fn missing_words(rows: &[RoundRow]) -> Vec<String> {
    MissingReason::WORDS
        .iter()
        .filter_map(|(reason, word)| {
            let n: u64 = rows.iter().map(|r| u64::from(r.missing.get(*reason))).sum();
            (n > 0).then(|| format!("{word}: {n}"))
        })
        .collect()
}
