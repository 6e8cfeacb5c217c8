//! A passthrough stream's section, the per-rank view: which ranks are imbalanced. Each rank's time in the top
//! events over the whole run (the `samples` table, summed per rank in SQL), as a table of ranks by events, a
//! figure stacking the events rank by rank, and the ranks holding the extremes of the heaviest event.

use std::collections::{BTreeMap, HashMap};

use canopy_store::StreamRow;

use super::data::{Stack, top_ids};
use super::plot::{Chart, Figure};
use super::{Context, Section, TextTable};

/// One rank's events (exclusive µs and calls by event) and its time in every event.
type RankEvents = (HashMap<u64, (f64, u64)>, f64);

/// Ranks the table lists at most: beyond, those with the most time, then the least.
const TABLE_RANKS: usize = 64;

/// Events the per-rank table and figure show at most.
const EVENTS: usize = 6;

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let totals = ctx.reader.rank_totals(stream.stream_id)?;
    let mut section = Section {
        anchor: format!("ranks-{}", stream.stream_id),
        title: format!("Per rank: {}", stream.name),
        intro: format!(
            "Each rank's exclusive time in the events that take the most over the run, summed over the rounds \
             (samples table, stream {}): where the ranks differ is where the run waits.",
            stream.stream_id
        ),
        ..Section::default()
    };
    if totals.is_empty() {
        section.facts.push(("rows".into(), "none stored".into()));
        return Ok(section);
    }
    let top = top_ids(
        totals.iter().map(|t| (t.event_id, t.excl_us)),
        ctx.top.min(EVENTS),
    );
    // Per rank (application, rank): each event's exclusive µs and calls, and the rank's time in every event.
    let mut ranks: BTreeMap<(String, u32), RankEvents> = BTreeMap::new();
    for t in &totals {
        let (events, all) = ranks.entry((t.app.clone(), t.rank)).or_default();
        events.insert(t.event_id, (t.excl_us, t.calls));
        *all += t.excl_us;
    }
    let several_apps = ranks
        .keys()
        .map(|(app, _)| app)
        .collect::<std::collections::HashSet<_>>()
        .len()
        > 1;
    let who = |(app, rank): &(String, u32)| match several_apps {
        true => format!("{app} rank {rank}"),
        false => format!("rank {rank}"),
    };
    section.facts.push(("ranks".into(), ranks.len().to_string()));
    if let Some(&heaviest) = top.first() {
        let of = |k: &(String, u32)| ranks[k].0.get(&heaviest).map_or(0.0, |(us, _)| *us);
        let mean = ranks.keys().map(of).sum::<f64>() / ranks.len() as f64;
        let name = ctx.names.of(heaviest);
        let most = ranks.keys().max_by(|a, b| of(a).total_cmp(&of(b)).then(b.cmp(a)));
        let least = ranks.keys().min_by(|a, b| of(a).total_cmp(&of(b)).then(a.cmp(b)));
        if let (Some(most), Some(least)) = (most, least)
            && mean > 0.0
        {
            section.facts.push((
                format!("most in {name}"),
                format!(
                    "{}: {}, {:.2}× the mean",
                    who(most),
                    seconds(of(most)),
                    of(most) / mean
                ),
            ));
            section.facts.push((
                format!("least in {name}"),
                format!(
                    "{}: {}, {:.2}× the mean",
                    who(least),
                    seconds(of(least)),
                    of(least) / mean
                ),
            ));
        }
    }
    // The table: every rank up to TABLE_RANKS; past it the half with the most time and the half with the least.
    let mut order: Vec<&(String, u32)> = ranks.keys().collect();
    if order.len() > TABLE_RANKS {
        order.sort_by(|a, b| ranks[*b].1.total_cmp(&ranks[*a].1).then(a.cmp(b)));
        let mut kept: Vec<&(String, u32)> = order[..TABLE_RANKS / 2].to_vec();
        kept.extend_from_slice(&order[order.len() - TABLE_RANKS / 2..]);
        kept.sort();
        section.facts.push((
            "table".into(),
            format!(
                "the {} ranks with the most time and the {} with the least, of {}",
                TABLE_RANKS / 2,
                TABLE_RANKS / 2,
                ranks.len()
            ),
        ));
        order = kept;
    }
    let mut head = vec!["rank".to_string(), "all events".to_string()];
    head.extend(top.iter().map(|id| ctx.names.of(*id)));
    let rows = order
        .iter()
        .map(|key| {
            let (events, all) = &ranks[*key];
            let mut row = vec![who(key), seconds(*all)];
            row.extend(top.iter().map(|id| match events.get(id) {
                Some((us, calls)) => format!("{} ({calls} calls)", seconds(*us)),
                None => "-".to_string(),
            }));
            row
        })
        .collect();
    section.tables.push(TextTable {
        caption: "Exclusive time per rank over the run, in the events with the most".into(),
        head,
        rows,
    });
    // The figure: the events stacked rank by rank, in rank order (application, then rank).
    // One application: x is the rank. Several: their ranks side by side, in order.
    let positions: HashMap<&(String, u32), u64> = ranks
        .keys()
        .enumerate()
        .map(|(i, k)| (k, if several_apps { i as u64 } else { u64::from(k.1) }))
        .collect();
    let points = ranks.iter().flat_map(|(key, (events, _))| {
        let x = positions[key];
        top.iter().map(move |id| {
            let secs = events.get(id).map_or(0.0, |(us, _)| us / 1e6);
            (x, ctx.names.of(*id), secs)
        })
    });
    section.figures.push(Figure {
        id: format!("ranks:{}", stream.name),
        title: format!(
            "{}: exclusive time per rank in the top events, over the run",
            stream.name
        ),
        x_label: match several_apps {
            true => "rank (by application, then rank)".into(),
            false => "rank".into(),
        },
        y_label: "seconds".into(),
        chart: Chart::Stacked {
            stack: Stack::from_points(points),
            outline: None,
        },
    });
    Ok(section)
}

/// Microseconds as seconds with three decimals: `1.234 s`.
fn seconds(us: f64) -> String {
    format!("{:.3} s", us / 1e6)
}
