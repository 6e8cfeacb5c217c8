//! What a node reports about itself, once a second and before it finishes.

use canopy_proto::v1::{FilterTime, NodeStatus};

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
