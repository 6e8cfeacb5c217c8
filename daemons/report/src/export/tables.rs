//! The store's tables as exported: a builder per table that reads it through `StoreReader`, names events beside
//! their ids (`event` beside `event_id`), the stream beside its id, and puts units in column names.

use std::collections::HashMap;

use canopy_store::{Kind, Select, StoreReader, Table as StoreTable, TableRow, Value, Word};

use super::table::{Data, Table};
use crate::report::data::{Names, metric_unit};

/// What the builders read.
pub struct Source<'a> {
    pub reader: &'a StoreReader,
    pub names: Names,
    /// Stream names by id.
    pub streams: HashMap<u32, String>,
}

impl Source<'_> {
    fn stream(&self, id: u32) -> String {
        self.streams.get(&id).cloned().unwrap_or_default()
    }
}

type Build = fn(&Source<'_>) -> anyhow::Result<Table>;

/// Every table `canopy export` writes, by name, with the store table whose rows decide whether a run has it.
pub const TABLES: &[(&str, StoreTable, Build)] = &[
    ("streams", StoreTable::Streams, streams),
    ("rounds", StoreTable::Rounds, rounds),
    ("stats", StoreTable::Stats, stats),
    ("stats_quantiles", StoreTable::StatsQuantiles, stats_quantiles),
    ("histograms", StoreTable::Histograms, histograms),
    ("classes", StoreTable::Classes, classes),
    ("clusters", StoreTable::Clusters, clusters),
    ("latency", StoreTable::Latency, latency),
    ("latency_apps", StoreTable::LatencyApps, latency_apps),
    ("reductions", StoreTable::Reductions, reductions),
    ("utilization", StoreTable::Utilization, utilization),
    ("outliers", StoreTable::Outliers, outliers),
    ("outlier_events", StoreTable::OutlierEvents, outlier_events),
    ("node_samples", StoreTable::NodeSamples, node_samples),
    ("event_metrics", StoreTable::EventMetrics, event_metrics),
    ("samples", StoreTable::Samples, samples),
    ("counters", StoreTable::Counters, counters),
    ("nodes", StoreTable::Nodes, nodes),
];

/// The names of every table, for messages.
pub fn table_names() -> String {
    TABLES.iter().map(|(n, ..)| *n).collect::<Vec<_>>().join(", ")
}

/// `streams` with what each stored: its rounds, those at full coverage, its late packets.
fn streams(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.streams()?;
    let counts = Table::new("counts")
        .int("rounds", rows.iter().map(|r| r.rounds))
        .int("full_rounds", rows.iter().map(|r| r.full_rounds))
        .int("late_packets", rows.iter().map(|r| r.late_packets));
    Ok(stored(src, "streams", &rows).insert_after("ranks", counts))
}

fn rounds(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "rounds", &src.reader.rounds(Select::all())?))
}

fn stats(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "stats", &src.reader.stats(Select::all())?))
}

fn stats_quantiles(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(
        src,
        "stats_quantiles",
        &src.reader.stats_quantiles(Select::all())?,
    ))
}

fn histograms(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "histograms", &src.reader.histograms(Select::all())?))
}

fn classes(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "classes", &src.reader.classes(Select::all())?))
}

/// `clusters` with each cluster's ranks (from `cluster_ranks`) beside its size.
fn clusters(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.clusters(Select::all())?;
    let ranks = Table::new("ranks").text("ranks", rows.iter().map(|r| r.ranks.clone()));
    Ok(stored(src, "clusters", &rows).insert_after("size_ranks", ranks))
}

fn latency(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "latency", &src.reader.latency(Select::all())?))
}

fn latency_apps(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(
        src,
        "latency_apps",
        &src.reader.latency_apps(Select::all())?,
    ))
}

fn reductions(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "reductions", &src.reader.reductions(Select::all())?))
}

fn outliers(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "outliers", &src.reader.outliers(Select::all())?))
}

fn outlier_events(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(
        src,
        "outlier_events",
        &src.reader.outlier_events(Select::all())?,
    ))
}

/// `utilization` with each share also as a percentage of its bin.
fn utilization(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.utilization(Select::all())?;
    let pct = Table::new("pct").float("share_pct", rows.iter().map(|r| Some(f64::from(r.share) / 2.5)));
    Ok(stored(src, "utilization", &rows).insert_after("share_of_250", pct))
}

fn node_samples(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(
        src,
        "node_samples",
        &src.reader.node_samples(Select::all())?,
    ))
}

fn event_metrics(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(
        src,
        "event_metrics",
        &src.reader.event_metrics(Select::all())?,
    ))
}

fn samples(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "samples", &src.reader.samples(Select::all())?))
}

fn counters(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "counters", &src.reader.counters(Select::all())?))
}

/// A table of the store's rows as its row type declares its columns, each under its export name, with the
/// stream's name beside a stream id, a name beside the id of an event (counter, activity, key: `event` beside
/// `event_id`), a metric's unit beside it; bytes are left out.
fn stored<R: TableRow>(src: &Source<'_>, name: &'static str, rows: &[R]) -> Table {
    let columns = R::columns();
    let mut data: Vec<Data> = columns
        .iter()
        .map(|c| match c.kind {
            Kind::Float => Data::Float(Vec::with_capacity(rows.len())),
            Kind::Text | Kind::Metric => Data::Text(Vec::with_capacity(rows.len())),
            _ => Data::Int(Vec::with_capacity(rows.len())),
        })
        .collect();
    // A metric column's units, beside its words.
    let mut units: Vec<Vec<Option<String>>> = columns.iter().map(|_| Vec::new()).collect();
    let mut cells = Vec::with_capacity(columns.len());
    for row in rows {
        cells.clear();
        row.cells(&mut cells);
        for ((cell, column), unit) in cells.iter().zip(&mut data).zip(&mut units) {
            match (cell, column) {
                (Value::Int(v), Data::Int(out)) => out.push(*v),
                (Value::Float(v), Data::Float(out)) => out.push(*v),
                (Value::Text(v), Data::Text(out)) => out.push(v.map(str::to_string)),
                (Value::Metric(m), Data::Text(out)) => {
                    out.push(Some(m.word().to_string()));
                    unit.push(Some(metric_unit(*m).to_string()));
                }
                (Value::Blob(_), Data::Int(out)) => out.push(None),
                (cell, _) => unreachable!("{name}: a {cell:?} in a column of another kind"),
            }
        }
    }
    let mut table = Table::new(name);
    for ((c, values), units) in columns.iter().zip(data).zip(units) {
        let nullable = c.nullable || c.kind == Kind::Float;
        match c.kind {
            Kind::Blob => continue,
            Kind::Stream => {
                let names = ints(&values)
                    .map(|id| Some(src.stream(id.unwrap_or(0) as u32)))
                    .collect();
                table = table
                    .column(c.export, false, values)
                    .column("stream", false, Data::Text(names));
            }
            Kind::Event => {
                let names = ints(&values)
                    .map(|id| id.map(|id| src.names.of(id as u64)))
                    .collect();
                let named = c.export.strip_suffix("_id").unwrap_or(c.export);
                table = table
                    .column(c.export, nullable, values)
                    .column(named, nullable, Data::Text(names));
            }
            Kind::Metric => {
                table = table
                    .column(c.export, false, values)
                    .column("unit", false, Data::Text(units));
            }
            _ => table = table.column(c.export, nullable, values),
        }
    }
    table
}

/// An integer column's values (none for another kind).
fn ints(data: &Data) -> impl Iterator<Item = Option<i64>> + '_ {
    let values: &[Option<i64>] = match data {
        Data::Int(v) => v,
        _ => &[],
    };
    values.iter().copied()
}

fn nodes(src: &Source<'_>) -> anyhow::Result<Table> {
    Ok(stored(src, "nodes", &src.reader.nodes()?))
}
