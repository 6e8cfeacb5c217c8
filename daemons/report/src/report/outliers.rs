//! An outliers stream's section: the top ranks' scores over the rounds, a line per rank (those with the largest
//! summed score), and which ranks and events come back most often (the `outliers` and `outlier_events` tables).

use std::collections::{BTreeMap, HashMap};

use canopy_store::{Select, StreamRow};

use super::data::top_ids;
use super::plot::{Chart, Figure, Line};
use super::{Context, Section};

/// A kept rank: its group (all ranks, an application's, or a class) and who it is.
type Who = (u64, String, u32);

/// A rank as `app:rank`, with its class when the stream scores ranks against their class.
fn label(who: &Who, by_class: bool) -> String {
    let (class, app, rank) = who;
    let rank = if app.is_empty() {
        rank.to_string()
    } else {
        format!("{app}:{rank}")
    };
    if by_class {
        format!("{rank} (class {class:016x})")
    } else {
        rank
    }
}

/// Whether the stream's parameters ask for scores within each class (`"within": "class"`).
fn within_class(params: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(params)
        .ok()
        .and_then(|v| v.get("within")?.as_str().map(|w| w == "class"))
        .unwrap_or(false)
}

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let select = || Select::all().stream(stream.stream_id).late(false);
    let by_class = within_class(&stream.params);
    let rows = ctx.reader.outliers(select())?;
    let events = ctx.reader.outlier_events(select())?;
    let mut section = Section {
        anchor: format!("outliers-{}", stream.stream_id),
        title: format!("Outliers: {}", stream.name),
        intro: format!(
            "The ranks farthest from the others (outliers table, stream {}): a rank's score is the sum over its \
             events of its distance from the event's mean in standard deviations beyond the stream's margin (one \
             by default), each weighted by the event's share; a line per rank with the largest summed score, drawn \
             at the rounds it was among the top.",
            stream.stream_id
        ),
        ..Section::default()
    };
    if rows.is_empty() {
        section.facts.push(("rows".into(), "none stored".into()));
        return Ok(section);
    }
    // Ranks numbered in order of first appearance, so top_ids can rank them by summed score.
    let mut index: HashMap<Who, u64> = HashMap::new();
    let mut whos: Vec<Who> = Vec::new();
    let mut lines: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &rows {
        let who = (r.class_id, r.app.clone(), r.rank);
        let i = *index.entry(who.clone()).or_insert_with(|| {
            whos.push(who);
            whos.len() as u64 - 1
        });
        lines.entry(i).or_default().push((r.round as f64, r.score));
    }
    let shown = top_ids(
        rows.iter()
            .map(|r| (index[&(r.class_id, r.app.clone(), r.rank)], r.score)),
        ctx.top,
    );
    let rounds = rows
        .iter()
        .map(|r| r.round)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    // The rank most often first in its group, and the event that most often weighs most in a first rank's score.
    let mut firsts: HashMap<u64, usize> = HashMap::new();
    for r in rows.iter().filter(|r| r.position == 0) {
        *firsts
            .entry(index[&(r.class_id, r.app.clone(), r.rank)])
            .or_default() += 1;
    }
    let mut first_events: HashMap<u64, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.position == 0 && e.event_position == 0) {
        *first_events.entry(e.event_id).or_default() += 1;
    }
    let most = |counts: &HashMap<u64, usize>| {
        counts
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(id, n)| (*id, *n))
    };
    section.facts.push(("rounds".into(), rounds.to_string()));
    section.facts.push((
        "ranks kept".into(),
        format!("{} (top {} shown)", whos.len(), shown.len()),
    ));
    if let Some((i, n)) = most(&firsts) {
        section.facts.push((
            "most often first".into(),
            format!("{} ({n} of {rounds} rounds)", label(&whos[i as usize], by_class)),
        ));
    }
    if let Some((id, n)) = most(&first_events) {
        section.facts.push((
            "weighs most in the first's score".into(),
            format!("{} ({n} rounds)", ctx.names.of(id)),
        ));
    }
    section.figures.push(Figure {
        id: format!("outliers:{}", stream.name),
        title: format!(
            "{}: scores of the top {} ranks per round",
            stream.name,
            shown.len()
        ),
        x_label: "round".into(),
        y_label: "score (standard deviations)".into(),
        chart: Chart::Lines(
            shown
                .iter()
                .map(|i| Line {
                    label: label(&whos[*i as usize], by_class),
                    points: lines[i].clone(),
                })
                .collect(),
        ),
    });
    Ok(section)
}
