//! The store's tables as exported: a builder per table that reads it through `StoreReader`, names events beside
//! their ids (`event` beside `event_id`), the stream beside its id, and puts units in column names.

use std::collections::HashMap;

use canopy_proto::v1::MissingReason;
use canopy_store::{Select, StoreReader, Table as StoreTable, Word};

use super::table::Table;
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

fn streams(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.streams()?;
    Ok(Table::new("streams")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| r.name.clone()))
        .text("filter", rows.iter().map(|r| r.filter.clone()))
        .text("params", rows.iter().map(|r| r.params.clone()))
        .text("sync_mode", rows.iter().map(|r| r.sync_mode.word()))
        .int("timeout_ms", rows.iter().map(|r| r.timeout_ms))
        .opt_text(
            "state",
            rows.iter().map(|r| r.state.map(|s| s.word().to_string())),
        )
        .opt_text("failure", rows.iter().map(|r| r.failure.clone()))
        .opt_text("result_type", rows.iter().map(|r| r.result_type.clone()))
        .text("ranks", rows.iter().map(|r| r.ranks.clone()))
        .opt_int("opened_unix_ns", rows.iter().map(|r| r.opened_unix_ns))
        .opt_int("closed_unix_ns", rows.iter().map(|r| r.closed_unix_ns))
        .int("rounds", rows.iter().map(|r| r.rounds))
        .int("full_rounds", rows.iter().map(|r| r.full_rounds))
        .int("late_packets", rows.iter().map(|r| r.late_packets)))
}

fn rounds(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.rounds(Select::all())?;
    let mut t = Table::new("rounds")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| r.stream.clone()))
        .int("round", rows.iter().map(|r| r.round))
        .int("covered_ranks", rows.iter().map(|r| r.covered))
        .int("expected_ranks", rows.iter().map(|r| r.expected));
    for (reason, word) in MissingReason::WORDS {
        t = t.int(
            &format!("missing_{word}_ranks"),
            rows.iter().map(|r| r.missing.get(*reason)),
        );
    }
    Ok(
        t.opt_text("missing_reason", rows.iter().map(|r| r.missing_reason.clone()))
            .int("late_ranks", rows.iter().map(|r| r.late_ranks))
            .int("result_bytes", rows.iter().map(|r| r.result_bytes))
            .int("pieces", rows.iter().map(|r| r.pieces))
            .opt_int("first_dump_unix_ns", rows.iter().map(|r| r.first_dump_unix_ns))
            .opt_int("closed_unix_ns", rows.iter().map(|r| r.closed_unix_ns)),
    )
}

fn stats(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.stats(Select::all())?;
    Ok(Table::new("stats")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .opt_id("class_id", rows.iter().map(|r| r.class_id))
        .opt_text("app", rows.iter().map(|r| r.app.clone()))
        .id("event_id", rows.iter().map(|r| r.id))
        .text("event", rows.iter().map(|r| src.names.of(r.id)))
        .text("metric", rows.iter().map(|r| r.metric.word()))
        .text("unit", rows.iter().map(|r| metric_unit(r.metric)))
        .int("count_ranks", rows.iter().map(|r| r.count))
        .float("mean", rows.iter().map(|r| r.mean))
        .float("std", rows.iter().map(|r| r.std))
        .float("min", rows.iter().map(|r| r.min))
        .float("max", rows.iter().map(|r| r.max))
        .opt_text("min_app", rows.iter().map(|r| r.min_app.clone()))
        .opt_int("min_rank", rows.iter().map(|r| r.min_rank))
        .opt_text("max_app", rows.iter().map(|r| r.max_app.clone()))
        .opt_int("max_rank", rows.iter().map(|r| r.max_rank))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn stats_quantiles(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.stats_quantiles(Select::all())?;
    Ok(Table::new("stats_quantiles")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .opt_id("class_id", rows.iter().map(|r| r.class_id))
        .opt_text("app", rows.iter().map(|r| r.app.clone()))
        .id("event_id", rows.iter().map(|r| r.id))
        .text("event", rows.iter().map(|r| src.names.of(r.id)))
        .text("metric", rows.iter().map(|r| r.metric.word()))
        .text("unit", rows.iter().map(|r| metric_unit(r.metric)))
        .float("q", rows.iter().map(|r| Some(r.q)))
        .float("value", rows.iter().map(|r| r.value))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn histograms(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.histograms(Select::all())?;
    Ok(Table::new("histograms")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .opt_id("class_id", rows.iter().map(|r| r.class_id))
        .opt_text("app", rows.iter().map(|r| r.app.clone()))
        .id("event_id", rows.iter().map(|r| r.id))
        .text("event", rows.iter().map(|r| src.names.of(r.id)))
        .text("metric", rows.iter().map(|r| r.metric.word()))
        .text("unit", rows.iter().map(|r| metric_unit(r.metric)))
        .int("bin", rows.iter().map(|r| r.bin))
        .float("lo", rows.iter().map(|r| r.lo))
        .float("hi", rows.iter().map(|r| r.hi))
        .int("count_ranks", rows.iter().map(|r| r.count))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn classes(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.classes(Select::all())?;
    Ok(Table::new("classes")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .id("class_id", rows.iter().map(|r| r.class_id))
        .int("size_ranks", rows.iter().map(|r| r.size))
        .text("ranks", rows.iter().map(|r| r.ranks.clone()))
        .opt_text("example_event", rows.iter().map(|r| r.example_event.clone()))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn clusters(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.clusters(Select::all())?;
    Ok(Table::new("clusters")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .int("cluster", rows.iter().map(|r| r.cluster))
        .int("size_ranks", rows.iter().map(|r| r.size))
        .text("ranks", rows.iter().map(|r| r.ranks.clone()))
        .opt_text(
            "representative_app",
            rows.iter()
                .map(|r| r.representative.as_ref().map(|(app, _)| app.clone())),
        )
        .opt_int(
            "representative_rank",
            rows.iter()
                .map(|r| r.representative.as_ref().map(|(_, rank)| *rank)),
        )
        .float("rms", rows.iter().map(|r| Some(r.rms)))
        .float("max_distance", rows.iter().map(|r| Some(r.max_distance)))
        .float("sum_squares", rows.iter().map(|r| Some(r.sum_squares)))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn latency(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.latency(Select::all())?;
    Ok(Table::new("latency")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .id("key_id", rows.iter().map(|r| r.key_id))
        .text("key", rows.iter().map(|r| src.names.of(r.key_id)))
        .int("step", rows.iter().map(|r| r.step))
        .int("latency_ns", rows.iter().map(|r| r.latency_ns))
        .int("start_unix_ns", rows.iter().map(|r| r.start_unix_ns))
        .text("start_app", rows.iter().map(|r| r.start_app.clone()))
        .int("start_rank", rows.iter().map(|r| r.start_rank))
        .int("stop_unix_ns", rows.iter().map(|r| r.stop_unix_ns))
        .text("stop_app", rows.iter().map(|r| r.stop_app.clone()))
        .int("stop_rank", rows.iter().map(|r| r.stop_rank))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn latency_apps(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.latency_apps(Select::all())?;
    Ok(Table::new("latency_apps")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .id("key_id", rows.iter().map(|r| r.key_id))
        .text("key", rows.iter().map(|r| src.names.of(r.key_id)))
        .int("step", rows.iter().map(|r| r.step))
        .text("app", rows.iter().map(|r| r.app.clone()))
        .int("ranks", rows.iter().map(|r| r.ranks))
        .float("transfer_us", rows.iter().map(|r| Some(r.transfer_us)))
        .float("compute_us", rows.iter().map(|r| Some(r.compute_us)))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn reductions(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.reductions(Select::all())?;
    Ok(Table::new("reductions")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .int("raw_bytes", rows.iter().map(|r| r.raw_bytes))
        .int("result_bytes", rows.iter().map(|r| r.result_bytes))
        .float("reduction_factor", rows.iter().map(|r| r.reduction_factor))
        .opt_int("classes", rows.iter().map(|r| r.classes))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn outliers(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.outliers(Select::all())?;
    Ok(Table::new("outliers")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .id("class_id", rows.iter().map(|r| r.class_id))
        .int("position", rows.iter().map(|r| r.position))
        .text("app", rows.iter().map(|r| r.app.clone()))
        .int("rank", rows.iter().map(|r| r.rank))
        .float("score_std_devs", rows.iter().map(|r| Some(r.score)))
        .int("group_ranks", rows.iter().map(|r| r.group_ranks))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn outlier_events(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.outlier_events(Select::all())?;
    Ok(Table::new("outlier_events")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .id("class_id", rows.iter().map(|r| r.class_id))
        .int("position", rows.iter().map(|r| r.position))
        .int("event_position", rows.iter().map(|r| r.event_position))
        .id("event_id", rows.iter().map(|r| r.event_id))
        .text("event", rows.iter().map(|r| src.names.of(r.event_id)))
        .text("metric", rows.iter().map(|r| r.metric.word()))
        .text("unit", rows.iter().map(|r| metric_unit(r.metric)))
        .float("value", rows.iter().map(|r| Some(r.value)))
        .float("mean", rows.iter().map(|r| Some(r.mean)))
        .float("std", rows.iter().map(|r| Some(r.std)))
        .float("contribution_std_devs", rows.iter().map(|r| Some(r.contribution)))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn utilization(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.utilization(Select::all())?;
    Ok(Table::new("utilization")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .int("bin", rows.iter().map(|r| r.bin))
        .int("start_unix_ns", rows.iter().map(|r| r.start_unix_ns))
        .id("activity_id", rows.iter().map(|r| r.activity_id))
        .text("activity", rows.iter().map(|r| src.names.of(r.activity_id)))
        .int("share_of_250", rows.iter().map(|r| r.share))
        .float("share_pct", rows.iter().map(|r| Some(f64::from(r.share) / 2.5)))
        .int("ranks", rows.iter().map(|r| r.ranks))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn node_samples(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.node_samples(Select::all())?;
    let it = || rows.iter();
    Ok(Table::new("node_samples")
        .int("stream_id", it().map(|r| r.stream_id))
        .text("stream", it().map(|r| src.stream(r.stream_id)))
        .int("round", it().map(|r| r.round))
        .text("node_id", it().map(|r| r.node_id.clone()))
        .text("hostname", it().map(|r| r.hostname.clone()))
        .text("ranks", it().map(|r| r.ranks.clone()))
        .opt_int("sample_unix_ns", it().map(|r| r.sample_unix_ns))
        .opt_int("interval_ns", it().map(|r| r.interval_ns))
        .opt_int("cpus", it().map(|r| r.cpus))
        .float("cpu_user_share", it().map(|r| r.cpu_user_share))
        .float("cpu_nice_share", it().map(|r| r.cpu_nice_share))
        .float("cpu_system_share", it().map(|r| r.cpu_system_share))
        .float("cpu_idle_share", it().map(|r| r.cpu_idle_share))
        .float("cpu_iowait_share", it().map(|r| r.cpu_iowait_share))
        .float("cpu_irq_share", it().map(|r| r.cpu_irq_share))
        .float("cpu_steal_share", it().map(|r| r.cpu_steal_share))
        .opt_int("mem_total_bytes", it().map(|r| r.mem_total_bytes))
        .opt_int("mem_available_bytes", it().map(|r| r.mem_available_bytes))
        .opt_int("mem_used_bytes", it().map(|r| r.mem_used_bytes))
        .opt_int("mem_page_faults", it().map(|r| r.mem_page_faults))
        .opt_int("mem_major_faults", it().map(|r| r.mem_major_faults))
        .opt_int("net_rx_bytes", it().map(|r| r.net_rx_bytes))
        .opt_int("net_tx_bytes", it().map(|r| r.net_tx_bytes))
        .opt_int("net_interfaces", it().map(|r| r.net_interfaces))
        .opt_int("disk_read_bytes", it().map(|r| r.disk_read_bytes))
        .opt_int("disk_write_bytes", it().map(|r| r.disk_write_bytes))
        .opt_int("disks", it().map(|r| r.disks))
        .float("load_1m", it().map(|r| r.load_1m))
        .float("load_5m", it().map(|r| r.load_5m))
        .float("load_15m", it().map(|r| r.load_15m))
        .opt_int("load_runnable", it().map(|r| r.load_runnable))
        .opt_int("load_threads", it().map(|r| r.load_threads))
        .flag("late", it().map(|r| r.late)))
}

fn event_metrics(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.event_metrics(Select::all())?;
    Ok(Table::new("event_metrics")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .text("app", rows.iter().map(|r| r.app.clone()))
        .int("rank", rows.iter().map(|r| r.rank))
        .id("event_id", rows.iter().map(|r| r.event_id))
        .text("event", rows.iter().map(|r| src.names.of(r.event_id)))
        .text("metric", rows.iter().map(|r| r.metric.word()))
        .text("unit", rows.iter().map(|r| metric_unit(r.metric)))
        .float("value", rows.iter().map(|r| r.value))
        .float("total", rows.iter().map(|r| r.total))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn samples(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.samples(Select::all())?;
    Ok(Table::new("samples")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .text("app", rows.iter().map(|r| r.app.clone()))
        .int("rank", rows.iter().map(|r| r.rank))
        .id("event_id", rows.iter().map(|r| r.event_id))
        .text("event", rows.iter().map(|r| src.names.of(r.event_id)))
        .opt_int("calls", rows.iter().map(|r| r.calls))
        .opt_int("subrs", rows.iter().map(|r| r.subrs))
        .float("incl_us", rows.iter().map(|r| r.incl_us))
        .float("excl_us", rows.iter().map(|r| r.excl_us))
        .opt_int("calls_total", rows.iter().map(|r| r.calls_total))
        .opt_int("subrs_total", rows.iter().map(|r| r.subrs_total))
        .float("incl_total_us", rows.iter().map(|r| r.incl_total_us))
        .float("excl_total_us", rows.iter().map(|r| r.excl_total_us))
        .opt_int("dump_unix_ns", rows.iter().map(|r| r.dump_unix_ns))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn counters(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.counters(Select::all())?;
    Ok(Table::new("counters")
        .int("stream_id", rows.iter().map(|r| r.stream_id))
        .text("stream", rows.iter().map(|r| src.stream(r.stream_id)))
        .int("round", rows.iter().map(|r| r.round))
        .text("app", rows.iter().map(|r| r.app.clone()))
        .int("rank", rows.iter().map(|r| r.rank))
        .id("counter_id", rows.iter().map(|r| r.counter_id))
        .text("counter", rows.iter().map(|r| src.names.of(r.counter_id)))
        .float("value", rows.iter().map(|r| r.value))
        .float("total", rows.iter().map(|r| r.total))
        .opt_int("dump_unix_ns", rows.iter().map(|r| r.dump_unix_ns))
        .flag("late", rows.iter().map(|r| r.late)))
}

fn nodes(src: &Source<'_>) -> anyhow::Result<Table> {
    let rows = src.reader.nodes()?;
    Ok(Table::new("nodes")
        .text("node_id", rows.iter().map(|r| r.node_id.clone()))
        .text("kind", rows.iter().map(|r| r.kind.word()))
        .opt_text("parent", rows.iter().map(|r| r.parent.clone()))
        .text("state", rows.iter().map(|r| r.state.word()))
        .int("ranks_below", rows.iter().map(|r| r.ranks_below))
        .opt_text("address", rows.iter().map(|r| r.address.clone()))
        .opt_text("detail", rows.iter().map(|r| r.detail.clone()))
        .opt_int("first_seen_unix_ns", rows.iter().map(|r| r.first_seen_unix_ns))
        .opt_int("updated_unix_ns", rows.iter().map(|r| r.updated_unix_ns)))
}
