//! What a node reports about itself, once a second and before it finishes: up the tree as a `NodeStatus`, and
//! to its own daemon as a [`NodeSnapshot`] (the metrics endpoint and the systemd watchdog read it).

use canopy_proto::v1::{FilterTime, NodeKind, NodeStatus};

use crate::engine::EngineStats;

/// Counters a node keeps about itself.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NodeCounters {
    pub malformed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub streams_failed: u64,
    pub rank_dumps_dropped: u64,
    /// The highest round any packet or rank dump brought here.
    pub highest_seen: u64,
    /// Packets a child that came back had held from before its loss, dropped because the nodes adopted
    /// meanwhile sent their ranks again.
    pub stale_packets: u64,
}

impl NodeCounters {
    /// The status message: the engine's figures, these counters, the rounds this node lags behind the newest it
    /// has seen, and the time in each stream's filter.
    pub(crate) fn status(
        &self,
        node_id: &str,
        engine: EngineStats,
        lowest_open: Option<u64>,
        filter_time: Vec<FilterTime>,
    ) -> NodeStatus {
        NodeStatus {
            node_id: node_id.to_string(),
            rounds_closed: engine.closed,
            rounds_partial: engine.partial,
            late_arrivals: engine.late_packets,
            malformed: self.malformed,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            streams_failed: self.streams_failed,
            rank_dumps_dropped: self.rank_dumps_dropped,
            lag_rounds: lowest_open.map_or(0, |low| self.highest_seen.saturating_sub(low) + 1),
            filter_time,
        }
    }
}

/// A node's figures as its daemon sees them, published at every status tick: the status it sends up, and what
/// only this node knows about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSnapshot {
    pub kind: NodeKind,
    pub status: NodeStatus,
    /// Children whose connection is open (a leaf: none; its ranks are in `ranks_below`).
    pub children: u64,
    /// Ranks served below this node, live or not.
    pub ranks_below: u64,
    /// Sources (children, or a leaf's ranks) still delivering rounds.
    pub live_sources: u64,
    /// Inputs (packets, rank dumps, events) queued for the node's task.
    pub input_queue: u64,
    /// Status ticks so far: a snapshot that stops changing means the node's task has stopped turning.
    pub ticks: u64,
    /// The node has finished (the tree ended, or it was drained).
    pub finished: bool,
    /// The round engine's counts (rank-rounds covered and missing by reason).
    pub engine: EngineStats,
    /// The names of the streams in `status.filter_time`, by id.
    pub stream_names: Vec<(u32, String)>,
}
