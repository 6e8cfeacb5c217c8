//! A kmeans stream's section: its clusters' sizes over the rounds, stacked, from the `clusters` table, with each
//! cluster's representative and spread in the last round.

use canopy_store::{Select, StreamRow};

use super::data::Stack;
use super::plot::{Chart, Figure};
use super::{Context, Section};

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx
        .reader
        .clusters(Select::all().stream(stream.stream_id).late(false))?;
    let stack = Stack::from_points(
        rows.iter()
            .map(|r| (r.round, format!("cluster {}", r.cluster), r.size as f64)),
    );
    let last = rows.iter().map(|r| r.round).max();
    let mut facts = vec![(
        "rounds clustered".to_string(),
        rows.iter()
            .map(|r| r.round)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            .to_string(),
    )];
    for r in rows.iter().filter(|r| Some(r.round) == last) {
        let rep = r
            .representative()
            .map_or("none".to_string(), |(app, rank)| format!("{app}:{rank}"));
        facts.push((
            format!("round {} cluster {}", r.round, r.cluster),
            format!(
                "{} ranks ({}), representative {rep}, RMS distance {:.3}, max {:.3}",
                r.size, r.ranks, r.rms, r.max_distance
            ),
        ));
    }
    Ok(Section {
        anchor: format!("clusters-{}", stream.stream_id),
        title: format!("Clusters: {}", stream.name),
        intro: format!(
            "The equivalence classes of ranks round by round (clusters table, stream {}): each layer is a cluster, \
             its height the ranks in it; the facts give the last round's members, representatives (the rank \
             nearest each centroid) and distances to the centroid.",
            stream.stream_id
        ),
        facts,
        figures: vec![Figure {
            id: format!("clusters:{}", stream.name),
            title: format!("{}: ranks per cluster", stream.name),
            x_label: "round".into(),
            y_label: "ranks".into(),
            chart: Chart::Stacked { stack, outline: None },
        }],
        tables: Vec::new(),
    })
}
