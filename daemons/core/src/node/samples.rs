//! The node stream at the leaf: the one place where a stream's leaf input is not its ranks' profiles. A stream of
//! the [`NODES_FILTER`] is fed, once per round, the node's own sample (its agent's samplers: CPU, memory, network,
//! disk, load), named with the node's id, host and the ranks the round covers. Its ranks still deliver to the
//! engine as for any stream, with empty payloads, so the round's coverage is counted the one way every stream's
//! is; only the closed group's input is the sample instead of their profiles. Relays and the root see a stream
//! like any other.

use std::collections::VecDeque;

use canopy_proto::filters::v1::{NodeSample, NodeSamples, RankRange};
use prost::Message;

/// The filter whose streams carry the node's samples rather than its ranks' profiles.
pub const NODES_FILTER: &str = "nodes";

/// Samples of the node kept per round, so that every node stream of a round carries the same one.
const KEPT_ROUNDS: usize = 8;

/// The node's own resources, as the agent samples them (canopy-agent's samplers).
pub trait NodeSampler: Send + std::fmt::Debug {
    /// Fills `sample`'s time, interval and measurements: a reading taken now, or the newest one the sampler's
    /// own period made. Leaves them unset when there is none yet. The node's id, host and ranks are the leaf's.
    fn sample(&mut self, sample: &mut NodeSample);
}

/// The leaf's side of the node stream: its sampler and the samples of the last rounds.
#[derive(Debug)]
pub(crate) struct NodeSamplesAtLeaf {
    sampler: Option<Box<dyn NodeSampler>>,
    node_id: String,
    hostname: String,
    /// (round, sample) of the last rounds sampled, oldest first.
    recent: VecDeque<(u64, NodeSample)>,
}

impl NodeSamplesAtLeaf {
    pub(crate) fn new(sampler: Option<Box<dyn NodeSampler>>, node_id: String, hostname: String) -> Self {
        Self {
            sampler,
            node_id,
            hostname,
            recent: VecDeque::with_capacity(KEPT_ROUNDS),
        }
    }

    /// The leaf input of a node stream's round: a `NodeSamples` of this node alone, its sample of `round`
    /// (taken now if no node stream has taken one for that round yet) with the ranks given, as (app, rank).
    pub(crate) fn input<'a>(
        &mut self,
        round: u64,
        ranks: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> Vec<u8> {
        let mut sample = match self.recent.iter().find(|(r, _)| *r == round) {
            Some((_, s)) => s.clone(),
            None => {
                let mut s = NodeSample {
                    node_id: self.node_id.clone(),
                    hostname: self.hostname.clone(),
                    ..Default::default()
                };
                if let Some(sampler) = &mut self.sampler {
                    sampler.sample(&mut s);
                }
                if self.recent.len() == KEPT_ROUNDS {
                    self.recent.pop_front();
                }
                self.recent.push_back((round, s.clone()));
                s
            }
        };
        sample.ranks = rank_ranges(ranks);
        NodeSamples { nodes: vec![sample] }.encode_to_vec()
    }
}

/// Ranks as sorted ranges per application, adjacent ranks coalesced.
fn rank_ranges<'a>(ranks: impl IntoIterator<Item = (&'a str, u32)>) -> Vec<RankRange> {
    let mut ranks: Vec<(&str, u32)> = ranks.into_iter().collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut out: Vec<RankRange> = Vec::new();
    for (app, rank) in ranks {
        match out.last_mut() {
            Some(r) if r.app == app && r.last.checked_add(1) == Some(rank) => r.last = rank,
            _ => out.push(RankRange {
                app: app.to_string(),
                first: rank,
                last: rank,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::LoadSample;

    /// Counts its samples: each one's load is the count.
    #[derive(Debug, Default)]
    struct Counting(u32);

    impl NodeSampler for Counting {
        fn sample(&mut self, sample: &mut NodeSample) {
            self.0 += 1;
            sample.sample_unix_ns = u64::from(self.0);
            sample.load = Some(LoadSample {
                runnable: self.0,
                ..Default::default()
            });
        }
    }

    fn decode(bytes: &[u8]) -> NodeSample {
        let mut s = NodeSamples::decode(bytes).unwrap();
        assert_eq!(s.nodes.len(), 1);
        s.nodes.remove(0)
    }

    fn range(app: &str, first: u32, last: u32) -> RankRange {
        RankRange {
            app: app.into(),
            first,
            last,
        }
    }

    #[test]
    fn ranks_read_as_coalesced_ranges_per_application() {
        let got = rank_ranges([
            ("b", 0),
            ("a", 3),
            ("a", 1),
            ("a", 2),
            ("a", 7),
            ("a", 2),
            ("b", 1),
        ]);
        assert_eq!(got, vec![range("a", 1, 3), range("a", 7, 7), range("b", 0, 1)]);
        assert_eq!(
            rank_ranges([("a", u32::MAX), ("a", 0)]),
            vec![range("a", 0, 0), range("a", u32::MAX, u32::MAX)]
        );
        assert!(rank_ranges([]).is_empty());
    }

    #[test]
    fn every_node_stream_of_a_round_carries_the_same_sample_with_its_own_ranks() {
        let mut leaf =
            NodeSamplesAtLeaf::new(Some(Box::new(Counting::default())), "agent:0".into(), "h".into());
        let all = decode(&leaf.input(5, [("a", 0), ("a", 1)]));
        let chosen = decode(&leaf.input(5, [("a", 1)]));
        assert_eq!((all.node_id.as_str(), all.hostname.as_str()), ("agent:0", "h"));
        assert_eq!(all.ranks, vec![range("a", 0, 1)]);
        assert_eq!(chosen.ranks, vec![range("a", 1, 1)]);
        assert_eq!(
            (all.sample_unix_ns, chosen.sample_unix_ns),
            (1, 1),
            "one sample for round 5"
        );
        let next = decode(&leaf.input(6, [("a", 0)]));
        assert_eq!(next.sample_unix_ns, 2);
        // Rounds far behind are sampled anew rather than kept forever.
        for round in 7..7 + KEPT_ROUNDS as u64 {
            leaf.input(round, []);
        }
        assert_eq!(decode(&leaf.input(5, [])).sample_unix_ns, 3 + KEPT_ROUNDS as u64);
    }

    #[test]
    fn without_samplers_a_node_still_names_itself_and_its_ranks() {
        let mut leaf = NodeSamplesAtLeaf::new(None, "agent:1".into(), "h".into());
        let s = decode(&leaf.input(0, [("a", 4)]));
        assert_eq!(s.ranks, vec![range("a", 4, 4)]);
        assert_eq!((s.sample_unix_ns, s.cpu, s.load), (0, None, None));
    }
}
