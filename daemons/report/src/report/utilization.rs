//! A utilization stream's section: each activity's share of the ranks' time, round by round, stacked (the
//! `utilization` table: a round's shares averaged over its bins).

use std::collections::{BTreeSet, HashMap};

use canopy_store::{Select, StreamRow};

use super::data::Stack;
use super::plot::{Chart, Figure};
use super::{Context, Section};

/// Activities drawn one by one; the others are added up into one layer.
const SHOWN: usize = 8;
/// The share that is a whole bin.
const WHOLE: f64 = 250.0;

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx
        .reader
        .utilization(Select::all().stream(stream.stream_id).late(false))?;
    // The bins of each round that have rows: a round's share of an activity is its average over them.
    let mut bins: HashMap<u64, BTreeSet<u32>> = HashMap::new();
    for r in &rows {
        bins.entry(r.round).or_default().insert(r.bin);
    }
    let stack = Stack::from_points(rows.iter().map(|r| {
        let n = bins[&r.round].len() as f64;
        (
            r.round,
            ctx.names.of(r.activity_id),
            100.0 * f64::from(r.share) / WHOLE / n,
        )
    }))
    .keep_largest(SHOWN, "rest");
    let activities = rows.iter().map(|r| r.activity_id).collect::<BTreeSet<_>>().len();
    Ok(Section {
        anchor: format!("utilization-{}", stream.stream_id),
        title: format!("Utilization: {}", stream.name),
        intro: format!(
            "What the ranks spent their time on, round by round (utilization table, stream {}): each activity's \
             average share of the round's bins, averaged over the ranks covering each bin; \"other\" holds the \
             activities below the stream's threshold.",
            stream.stream_id
        ),
        facts: vec![
            ("activities".into(), activities.to_string()),
            ("rows".into(), rows.len().to_string()),
        ],
        figures: vec![Figure {
            id: format!("utilization:{}", stream.name),
            title: format!("{}: share of time per activity", stream.name),
            x_label: "round".into(),
            y_label: "share of the round (%)".into(),
            chart: Chart::Stacked { stack, outline: None },
        }],
        tables: Vec::new(),
    })
}
