//! A classify stream's section: its classes and their sizes over the rounds, stacked, from the `classes` table.

use std::collections::HashMap;

use canopy_store::{Select, StreamRow};

use super::data::Stack;
use super::plot::{Chart, Figure};
use super::{Context, Section};

/// Classes drawn one by one; the smaller ones are added up into one layer.
const SHOWN: usize = 9;

pub fn section(ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
    let rows = ctx
        .reader
        .classes(Select::all().stream(stream.stream_id).late(false))?;
    // A class is named by the order it first appeared in, and an event its members report.
    let mut number: HashMap<u64, String> = HashMap::new();
    for r in &rows {
        let next = number.len() + 1;
        number
            .entry(r.class_id)
            .or_insert_with(|| match &r.example_event {
                Some(e) if !e.is_empty() => format!("class {next} ({e})"),
                _ => format!("class {next}"),
            });
    }
    let stack = Stack::from_points(
        rows.iter()
            .map(|r| (r.round, number[&r.class_id].clone(), r.size as f64)),
    )
    .keep_largest(SHOWN, "smaller classes");
    let most = rows
        .iter()
        .fold(HashMap::<u64, u64>::new(), |mut m, r| {
            *m.entry(r.round).or_default() += 1;
            m
        })
        .into_values()
        .max()
        .unwrap_or(0);
    Ok(Section {
        anchor: format!("classes-{}", stream.stream_id),
        title: format!("Classes: {}", stream.name),
        intro: format!(
            "The classes of ranks round by round (classes table, stream {}): each layer is a class, its height the \
             ranks in it; a class is numbered by the round it first appeared in, with an event its members report.",
            stream.stream_id
        ),
        facts: vec![
            ("classes seen".into(), number.len().to_string()),
            ("most in one round".into(), most.to_string()),
        ],
        figures: vec![Figure {
            id: format!("classes:{}", stream.name),
            title: format!("{}: ranks per class", stream.name),
            x_label: "round".into(),
            y_label: "ranks".into(),
            chart: Chart::Stacked { stack, outline: None },
        }],
        tables: Vec::new(),
    })
}
