//! The coverage section: for every stream, its ranks round by round, covered and missing by reason, stacked up
//! to the ranks expected (the `rounds` table: `covered` and the `missing_*` columns), and each application's
//! share when several feed a stream (`round_apps`).

use canopy_proto::v1::MissingReason;
use canopy_store::{AppCoverageTotal, MissingCounts, RoundRow, Select, StreamRow, Word};

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
        let missing = missing_words(rows.iter().map(|r| &r.missing));
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
        let apps = ctx.reader.app_coverage(Select::all().stream(stream.stream_id))?;
        if let Some(text) = per_app(&apps) {
            section
                .facts
                .push((format!("{} per application", stream.name), text));
        }
        section.figures.push(figure(stream, &rows));
    }
    Ok(section)
}

/// "analysis 50.0% (sampled_out: 30), sim 100.0%": each application's rank-rounds covered out of those
/// expected, with the reasons for the others; `None` unless more than one application is named.
pub fn per_app(apps: &[AppCoverageTotal]) -> Option<String> {
    if apps.len() < 2 {
        return None;
    }
    let parts: Vec<String> = apps
        .iter()
        .map(|a| {
            let share = if a.expected == 0 {
                100.0
            } else {
                100.0 * a.covered as f64 / a.expected as f64
            };
            let missing: Vec<String> = a
                .missing
                .iter()
                .map(|(reason, n)| format!("{}: {n}", reason.word()))
                .collect();
            if missing.is_empty() {
                format!("{} {share:.1}%", a.app)
            } else {
                format!("{} {share:.1}% ({})", a.app, missing.join(", "))
            }
        })
        .collect();
    Some(parts.join(", "))
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

/// The reasons ranks went missing for, with their rank-rounds (`late: 12`), over the rounds' counts.
fn missing_words<'a>(rounds: impl Iterator<Item = &'a MissingCounts> + Clone) -> Vec<String> {
    MissingReason::WORDS
        .iter()
        .filter_map(|(reason, word)| {
            let n: u64 = rounds.clone().map(|m| u64::from(m.get(*reason))).sum();
            (n > 0).then(|| format!("{word}: {n}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_application_gets_its_share_once_several_feed_the_stream() {
        let total = |app: &str, covered, expected, missing: Vec<(MissingReason, u64)>| AppCoverageTotal {
            app: app.into(),
            covered,
            expected,
            missing,
        };
        let apps = [
            total("analysis", 3, 6, vec![(MissingReason::SampledOut, 3)]),
            total("sim", 6, 6, vec![]),
        ];
        assert_eq!(
            per_app(&apps).unwrap(),
            "analysis 50.0% (sampled_out: 3), sim 100.0%"
        );
        assert_eq!(per_app(&apps[..1]), None);
    }
}
