//! A passthrough stream's section, the per-rank view: which ranks are imbalanced. Each rank's time in the top
//! events over the whole run (the `samples` table, summed per rank in SQL), as a table of ranks by events, a
//! figure stacking the events rank by rank, and the ranks holding the extremes of the heaviest event.

use std::collections::{BTreeMap, HashMap, HashSet};

use canopy_store::{RankTotal, StreamRow};

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
    let ranks = Ranks::of(&totals);
    section
        .facts
        .push(("ranks".into(), ranks.by_rank.len().to_string()));
    if let Some(&heaviest) = top.first() {
        section
            .facts
            .extend(ranks.extremes(heaviest, &ctx.names.of(heaviest)));
    }
    let (order, sampled) = ranks.table_order();
    section.facts.extend(sampled);
    section.tables.push(ranks.table(ctx, &order, &top));
    section.figures.push(ranks.figure(ctx, &stream.name, &top));
    Ok(section)
}

/// A rank: its application and its rank in it.
type RankKey = (String, u32);

/// Every rank's events over the run.
struct Ranks {
    /// Per rank (application, rank): each event's exclusive µs and calls, and the rank's time in every event.
    by_rank: BTreeMap<RankKey, RankEvents>,
    /// Whether the ranks belong to more than one application, each then named with its application.
    several_apps: bool,
}

impl Ranks {
    /// The ranks of a stream's per-rank totals, each with its events and its time in all of them.
    fn of(totals: &[RankTotal]) -> Ranks {
        let mut by_rank: BTreeMap<RankKey, RankEvents> = BTreeMap::new();
        for t in totals {
            let (events, all) = by_rank.entry((t.app.clone(), t.rank)).or_default();
            events.insert(t.event_id, (t.excl_us, t.calls));
            *all += t.excl_us;
        }
        let several_apps = by_rank.keys().map(|(app, _)| app).collect::<HashSet<_>>().len() > 1;
        Ranks {
            by_rank,
            several_apps,
        }
    }

    /// A rank as the report names it: `rank 3`, or `app rank 3` when there are several applications.
    fn who(&self, (app, rank): &RankKey) -> String {
        match self.several_apps {
            true => format!("{app} rank {rank}"),
            false => format!("rank {rank}"),
        }
    }

    /// The facts naming the ranks with the most and the least time in `event` (called `name`), each with its
    /// time and its ratio to the mean; none when no rank spent time in it.
    fn extremes(&self, event: u64, name: &str) -> Vec<(String, String)> {
        let of = |k: &RankKey| self.by_rank[k].0.get(&event).map_or(0.0, |(us, _)| *us);
        let mean = self.by_rank.keys().map(of).sum::<f64>() / self.by_rank.len() as f64;
        let most = self
            .by_rank
            .keys()
            .max_by(|a, b| of(a).total_cmp(&of(b)).then(b.cmp(a)));
        let least = self
            .by_rank
            .keys()
            .min_by(|a, b| of(a).total_cmp(&of(b)).then(a.cmp(b)));
        let fact = |which: &str, k: &RankKey| {
            (
                format!("{which} in {name}"),
                format!(
                    "{}: {}, {:.2}× the mean",
                    self.who(k),
                    seconds(of(k)),
                    of(k) / mean
                ),
            )
        };
        match (most, least) {
            (Some(most), Some(least)) if mean > 0.0 => vec![fact("most", most), fact("least", least)],
            _ => Vec::new(),
        }
    }

    /// The ranks the table lists, in rank order: every rank up to TABLE_RANKS; past it the half with the most
    /// time and the half with the least, with the fact that says so.
    fn table_order(&self) -> (Vec<&RankKey>, Option<(String, String)>) {
        let mut order: Vec<&RankKey> = self.by_rank.keys().collect();
        if order.len() <= TABLE_RANKS {
            return (order, None);
        }
        order.sort_by(|a, b| self.by_rank[*b].1.total_cmp(&self.by_rank[*a].1).then(a.cmp(b)));
        let mut kept: Vec<&RankKey> = order[..TABLE_RANKS / 2].to_vec();
        kept.extend_from_slice(&order[order.len() - TABLE_RANKS / 2..]);
        kept.sort();
        let fact = (
            "table".into(),
            format!(
                "the {} ranks with the most time and the {} with the least, of {}",
                TABLE_RANKS / 2,
                TABLE_RANKS / 2,
                self.by_rank.len()
            ),
        );
        (kept, Some(fact))
    }

    /// The table of the ranks in `order` by the `top` events: each rank's time in every event, then its time
    /// and calls in each of them.
    fn table(&self, ctx: &Context<'_>, order: &[&RankKey], top: &[u64]) -> TextTable {
        let mut head = vec!["rank".to_string(), "all events".to_string()];
        head.extend(top.iter().map(|id| ctx.names.of(*id)));
        let rows = order
            .iter()
            .map(|key| {
                let (events, all) = &self.by_rank[*key];
                let mut row = vec![self.who(key), seconds(*all)];
                row.extend(top.iter().map(|id| match events.get(id) {
                    Some((us, calls)) => format!("{} ({calls} calls)", seconds(*us)),
                    None => "-".to_string(),
                }));
                row
            })
            .collect();
        TextTable {
            caption: "Exclusive time per rank over the run, in the events with the most".into(),
            head,
            rows,
        }
    }

    /// The figure of stream `stream`: the `top` events stacked rank by rank, in rank order (application, then
    /// rank). One application: x is the rank. Several: their ranks side by side, in order.
    fn figure(&self, ctx: &Context<'_>, stream: &str, top: &[u64]) -> Figure {
        let positions: HashMap<&RankKey, u64> = self
            .by_rank
            .keys()
            .enumerate()
            .map(|(i, k)| {
                (
                    k,
                    if self.several_apps {
                        i as u64
                    } else {
                        u64::from(k.1)
                    },
                )
            })
            .collect();
        let points = self.by_rank.iter().flat_map(|(key, (events, _))| {
            let x = positions[key];
            top.iter().map(move |id| {
                let secs = events.get(id).map_or(0.0, |(us, _)| us / 1e6);
                (x, ctx.names.of(*id), secs)
            })
        });
        Figure {
            id: format!("ranks:{stream}"),
            title: format!("{stream}: exclusive time per rank in the top events, over the run"),
            x_label: match self.several_apps {
                true => "rank (by application, then rank)".into(),
                false => "rank".into(),
            },
            y_label: "seconds".into(),
            chart: Chart::Stacked {
                stack: Stack::from_points(points),
                outline: None,
            },
        }
    }
}

/// Microseconds as seconds with three decimals: `1.234 s`.
fn seconds(us: f64) -> String {
    format!("{:.3} s", us / 1e6)
}
