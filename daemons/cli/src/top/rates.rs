//! Rates from two snapshots of the tree's counters: rounds, bytes and filter time per second of each node.

use std::collections::HashMap;

use canopy_proto::v1::TopologyNode;

/// One node's rates over the time between two snapshots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    pub rounds: f64,
    pub bytes_in: f64,
    pub bytes_out: f64,
    /// Milliseconds in each stream's filter per second, by stream id.
    pub filter_ms: HashMap<u32, f64>,
}

/// A counter's rate; a counter that went back (the node restarted) counts from zero.
fn rate(before: u64, now: u64, seconds: f64) -> f64 {
    let delta = if now >= before { now - before } else { now };
    delta as f64 / seconds
}

/// The rates of `now` over `seconds` since `before`; a node `before` lacks has none yet, and no time between
/// the snapshots gives none.
pub fn between(before: &[TopologyNode], now: &TopologyNode, seconds: f64) -> Option<Rates> {
    if seconds <= 0.0 {
        return None;
    }
    let b = before.iter().find(|n| n.node_id == now.node_id)?;
    let filter_ms = now
        .filter_time
        .iter()
        .map(|f| {
            let was = b
                .filter_time
                .iter()
                .find(|g| g.stream_id == f.stream_id)
                .map_or(0, |g| g.micros);
            (f.stream_id, rate(was, f.micros, seconds) / 1000.0)
        })
        .collect();
    Some(Rates {
        rounds: rate(b.rounds_closed, now.rounds_closed, seconds),
        bytes_in: rate(b.bytes_in, now.bytes_in, seconds),
        bytes_out: rate(b.bytes_out, now.bytes_out, seconds),
        filter_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::FilterTime;

    fn node(id: &str, rounds: u64, bytes_in: u64, filter_us: u64) -> TopologyNode {
        TopologyNode {
            node_id: id.into(),
            rounds_closed: rounds,
            bytes_in,
            bytes_out: bytes_in / 2,
            filter_time: vec![FilterTime {
                stream_id: 1,
                calls: 0,
                micros: filter_us,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let before = [node("relay:0", 10, 1000, 5000)];
        let r = between(&before, &node("relay:0", 30, 5096, 25_000), 2.0).unwrap();
        assert_eq!(r.rounds, 10.0);
        assert_eq!(r.bytes_in, 2048.0);
        assert_eq!(r.bytes_out, 1024.0);
        // 20 ms of filter time in 2 s.
        assert_eq!(r.filter_ms[&1], 10.0);
    }

    #[test]
    fn a_new_node_or_no_time_gives_no_rates_and_a_restarted_node_counts_from_zero() {
        let before = [node("relay:0", 10, 1000, 0)];
        assert_eq!(between(&before, &node("agent:9", 30, 0, 0), 1.0), None);
        assert_eq!(between(&before, &node("relay:0", 30, 0, 0), 0.0), None);
        let r = between(&before, &node("relay:0", 4, 100, 0), 1.0).unwrap();
        assert_eq!((r.rounds, r.bytes_in), (4.0, 100.0));
    }
}
