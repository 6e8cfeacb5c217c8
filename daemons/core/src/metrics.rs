//! A node's figures as Prometheus metrics: a collector that renders the node's latest [`NodeSnapshot`] at each
//! scrape (nothing is counted twice: the node keeps the counts, this reads them), every series labelled with the
//! node's id and role. The daemons serve it with [`canopy_runtime::exporter`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use canopy_proto::v1::{MissingReason, NodeKind};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::watch;

use crate::node::NodeSnapshot;

/// Reads the node's snapshot at each scrape.
#[derive(Debug)]
struct NodeCollector {
    snapshot: watch::Receiver<NodeSnapshot>,
}

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, unit, c.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64) -> fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let s = self.snapshot.borrow().clone();
        node_counters(&s, &mut enc)?;
        node_gauges(&s, &mut enc)?;
        coverage(&s, &mut enc)?;
        filters(&s, &mut enc)
    }
}

/// The node's own counts: rounds, late and malformed inputs, bytes, failed streams, dropped dumps, ticks.
fn node_counters(s: &NodeSnapshot, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    counter(
        enc,
        "rounds_closed",
        "Rounds this node closed and sent on (a round counts once, whatever its streams and phases)",
        None,
        s.status.rounds_closed,
    )?;
    counter(
        enc,
        "rounds_partial",
        "Streams' rounds closed without every source below (late, lost, stopped...), each once whatever its phases",
        None,
        s.status.rounds_partial,
    )?;
    counter(
        enc,
        "late_arrivals",
        "Packets that arrived after their round had closed here",
        None,
        s.status.late_arrivals,
    )?;
    counter(
        enc,
        "malformed",
        "Messages refused as malformed (from children or ranks)",
        None,
        s.status.malformed,
    )?;
    counter(
        enc,
        "received",
        "Bytes received from children or ranks",
        Some(&Unit::Bytes),
        s.status.bytes_in,
    )?;
    counter(
        enc,
        "sent",
        "Bytes sent up to the parent (or, at the front-end, to the store and subscribers)",
        Some(&Unit::Bytes),
        s.status.bytes_out,
    )?;
    counter(
        enc,
        "streams_failed",
        "Streams this node failed (a filter error, a stuck call)",
        None,
        s.status.streams_failed,
    )?;
    counter(
        enc,
        "rank_dumps_dropped",
        "Rank dumps that never reached a round: dropped in the ranks, or beyond the agent's buffer",
        None,
        s.status.rank_dumps_dropped,
    )?;
    counter(
        enc,
        "status_ticks",
        "Status ticks of the node's task (stops rising when the task stops turning)",
        None,
        s.ticks,
    )?;
    Ok(())
}

/// How the node stands: its lag, its children, its ranks and sources, its queue, whether it finished.
fn node_gauges(s: &NodeSnapshot, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    gauge(
        enc,
        "lag_rounds",
        "Rounds from the lowest still open here to the highest seen",
        signed(s.status.lag_rounds),
    )?;
    gauge(enc, "children", "Children connected", signed(s.children))?;
    gauge(
        enc,
        "ranks_below",
        "Ranks served below this node, live or not",
        signed(s.ranks_below),
    )?;
    gauge(
        enc,
        "live_sources",
        "Sources (children, or a leaf's ranks) still delivering rounds",
        signed(s.live_sources),
    )?;
    gauge(
        enc,
        "input_queue",
        "Inputs queued for the node's task",
        signed(s.input_queue),
    )?;
    gauge(
        enc,
        "finished",
        "1 once the node has finished",
        i64::from(s.finished),
    )?;
    Ok(())
}

/// The rank-rounds of the rounds closed here: covered, and missing by reason.
fn coverage(s: &NodeSnapshot, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    counter(
        enc,
        "rank_rounds_covered",
        "Rank-rounds in the rounds closed here (a stream's round counts its ranks once, whatever its phases)",
        None,
        s.engine.covered_ranks,
    )?;
    let mut family = enc.encode_descriptor(
        "rank_rounds_missing",
        "Rank-rounds missing from the rounds closed here, by reason (late, lost, stopped, dropped...)",
        None,
        ConstCounter::new(0u64).metric_type(),
    )?;
    for (reason, n) in s.engine.missing_ranks.iter().enumerate() {
        let Some(word) = i32::try_from(reason)
            .ok()
            .and_then(|r| MissingReason::try_from(r).ok())
            .filter(|r| *r != MissingReason::Unspecified)
            .map(reason_word)
        else {
            continue;
        };
        ConstCounter::new(*n).encode(family.encode_family(&[("reason", word)])?)?;
    }
    Ok(())
}

/// Each stream's filter: its calls and the time in them, labelled with the stream's id and name.
fn filters(s: &NodeSnapshot, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    // Each stream's series carry its id and its name.
    let stream = |id: u32| {
        let name = s
            .stream_names
            .iter()
            .find(|(i, _)| *i == id)
            .map_or_else(String::new, |(_, n)| n.clone());
        [("stream", id.to_string()), ("stream_name", name)]
    };
    let mut family = enc.encode_descriptor(
        "filter_calls",
        "Calls into each stream's filter",
        None,
        ConstCounter::new(0u64).metric_type(),
    )?;
    for t in &s.status.filter_time {
        ConstCounter::new(t.calls).encode(family.encode_family(&stream(t.stream_id))?)?;
    }
    let mut family = enc.encode_descriptor(
        "filter",
        "Time in each stream's filter",
        Some(&Unit::Seconds),
        ConstCounter::new(0u64).metric_type(),
    )?;
    for t in &s.status.filter_time {
        ConstCounter::new(t.micros as f64 / 1e6).encode(family.encode_family(&stream(t.stream_id))?)?;
    }
    Ok(())
}

/// A missing reason's word in the `reason` label: `late`, `lost`, `sampled_out`...
fn reason_word(r: MissingReason) -> String {
    r.as_str_name()
        .trim_start_matches("MISSING_REASON_")
        .to_ascii_lowercase()
}

/// The role's word in the `role` label.
fn role(kind: NodeKind) -> &'static str {
    match kind {
        NodeKind::Agent => "agent",
        NodeKind::Relay => "relay",
        NodeKind::Frontend => "frontend",
        NodeKind::Unspecified => "unspecified",
    }
}

/// The node's metrics, rendered as OpenMetrics text at each call: `canopy_*` series labelled `node` and `role`,
/// its own and those of `extra` collectors (the front-end's application series).
pub fn renderer(
    node_id: &str,
    snapshot: watch::Receiver<NodeSnapshot>,
    extra: Vec<Box<dyn Collector>>,
) -> Arc<dyn Fn() -> String + Send + Sync> {
    let kind = snapshot.borrow().kind;
    let labels = [
        (Cow::Borrowed("node"), Cow::Owned(node_id.to_string())),
        (Cow::Borrowed("role"), Cow::Borrowed(role(kind))),
    ];
    let mut registry = Registry::with_prefix_and_labels("canopy", labels.into_iter());
    registry.register_collector(Box::new(NodeCollector { snapshot }));
    for collector in extra {
        registry.register_collector(collector);
    }
    Arc::new(move || {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    })
}

/// The metrics endpoint of a node: its metrics, and healthy until it finishes.
pub fn exporter(
    node_id: &str,
    snapshot: watch::Receiver<NodeSnapshot>,
    extra: Vec<Box<dyn Collector>>,
) -> canopy_runtime::exporter::Exporter {
    let render = renderer(node_id, snapshot.clone(), extra);
    canopy_runtime::exporter::Exporter {
        render,
        healthy: Arc::new(move || !snapshot.borrow().finished),
    }
}

/// Binds `listen` and serves the node's metrics endpoint there until the node is gone (its snapshot's sender
/// dropped); returns the bound address.
pub async fn spawn(
    listen: &str,
    node_id: &str,
    snapshot: watch::Receiver<NodeSnapshot>,
    extra: Vec<Box<dyn Collector>>,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = canopy_runtime::daemon::bind(listen).await?;
    let addr = listener.local_addr()?;
    let mut gone = snapshot.clone();
    let serve = exporter(node_id, snapshot, extra)
        .serve(listener, async move { while gone.changed().await.is_ok() {} });
    tokio::spawn(async move {
        if let Err(e) = serve.await {
            tracing::warn!("the metrics endpoint stopped: {e}");
        }
    });
    tracing::info!(%addr, "metrics served at http://{addr}/metrics");
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use canopy_proto::v1::{FilterTime, NodeStatus};

    use super::*;

    #[test]
    fn the_snapshot_renders_as_openmetrics_text_labelled_with_the_node() {
        let (tx, rx) = watch::channel(NodeSnapshot {
            kind: NodeKind::Relay,
            ..NodeSnapshot::default()
        });
        let render = renderer("relay-0", rx, Vec::new());
        tx.send_replace(NodeSnapshot {
            kind: NodeKind::Relay,
            status: NodeStatus {
                rounds_closed: 42,
                bytes_in: 1000,
                filter_time: vec![FilterTime {
                    stream_id: 3,
                    calls: 7,
                    micros: 1_500_000,
                }],
                ..NodeStatus::default()
            },
            children: 2,
            engine: crate::engine::EngineStats {
                covered_ranks: 60,
                missing_ranks: {
                    let mut m = [0; crate::engine::MISSING_REASONS];
                    m[MissingReason::Lost as usize] = 4;
                    m
                },
                ..Default::default()
            },
            stream_names: vec![(3, "stats".into())],
            ..NodeSnapshot::default()
        });
        let text = render();
        for line in [
            "# TYPE canopy_rounds_closed counter",
            r#"canopy_rounds_closed_total{node="relay-0",role="relay"} 42"#,
            "# UNIT canopy_received_bytes bytes",
            r#"canopy_received_bytes_total{node="relay-0",role="relay"} 1000"#,
            r#"canopy_children{node="relay-0",role="relay"} 2"#,
            r#"canopy_filter_calls_total{node="relay-0",role="relay",stream="3",stream_name="stats"} 7"#,
            r#"canopy_filter_seconds_total{node="relay-0",role="relay",stream="3",stream_name="stats"} 1.5"#,
            r#"canopy_rank_rounds_covered_total{node="relay-0",role="relay"} 60"#,
            r#"canopy_rank_rounds_missing_total{node="relay-0",role="relay",reason="lost"} 4"#,
            r#"canopy_rank_rounds_missing_total{node="relay-0",role="relay",reason="late"} 0"#,
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
