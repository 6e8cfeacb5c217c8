//! The nodes filter: the node stream. Each agent's samplers read the node's CPU, memory, network, disk and load
//! from /proc, and the leaf hands the node's sample of the round (named with the node's id, host and ranks) to
//! this filter as its input, in place of the ranks' profiles. Every level concatenates the samples it receives,
//! sorted by node id, so the root's `NodeSamples` holds one sample per node whatever the tree.

#![forbid(unsafe_code)]

use std::cmp::Ordering;

use canopy_filter_common::one_phase::OnePhase;
use canopy_filter_common::{Params, decode};
use canopy_filter_proto::v1::{NodeSample, NodeSamples};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter, one_phase};
use prost::Message;

/// What the inputs and the packets are, as rejections name them.
const PACKET: &str = "canopy.filters.v1.NodeSamples";

/// One instance per stream per node; the same at every level. What it keeps between rounds are buffers.
#[derive(Debug)]
pub struct NodesFilter {
    level: Level,
    /// The inputs of the round, decoded into slots kept between rounds.
    inputs: Vec<NodeSamples>,
    merged: NodeSamples,
    encoded: Vec<u8>,
}

/// Why a sample cannot be merged: a node without an id, a share outside 0 to 1 (or not a number), a rank range
/// given backwards, more memory used or available than there is, a load that is not a number.
pub fn check_sample(s: &NodeSample) -> Result<(), String> {
    if s.node_id.is_empty() {
        return Err("a sample names no node".into());
    }
    let bad = |what: String| Err(format!("node {:?}: {what}", s.node_id));
    if let Some(cpu) = &s.cpu {
        let shares = [
            ("user", cpu.user_share),
            ("nice", cpu.nice_share),
            ("system", cpu.system_share),
            ("idle", cpu.idle_share),
            ("iowait", cpu.iowait_share),
            ("irq", cpu.irq_share),
            ("steal", cpu.steal_share),
        ];
        if let Some((name, share)) = shares.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
            return bad(format!("cpu {name} share {share} is not between 0 and 1"));
        }
    }
    if let Some(mem) = &s.memory
        && (mem.used_bytes > mem.total_bytes || mem.available_bytes > mem.total_bytes)
    {
        return bad(format!(
            "memory: {} bytes used and {} available of {}",
            mem.used_bytes, mem.available_bytes, mem.total_bytes
        ));
    }
    if let Some(load) = &s.load
        && let Some(v) = [load.load_1m, load.load_5m, load.load_15m]
            .into_iter()
            .find(|v| !v.is_finite() || *v < 0.0)
    {
        return bad(format!("load {v} is not a load"));
    }
    if let Some(r) = s.ranks.iter().find(|r| r.first > r.last) {
        return bad(format!(
            "rank range {}-{} of app {:?} is backwards",
            r.first, r.last, r.app
        ));
    }
    Ok(())
}

/// Every sample of a packet passes [`check_sample`].
pub fn check_packet(p: &NodeSamples) -> Result<(), String> {
    p.nodes.iter().try_for_each(check_sample)
}

/// The order of the samples in a packet: by node id, then host and time; two samples alike in all three (one
/// id under two parents, say) by their encoding, so the order never depends on the tree.
fn order(a: &NodeSample, b: &NodeSample) -> Ordering {
    (a.node_id.as_str(), a.hostname.as_str(), a.sample_unix_ns)
        .cmp(&(b.node_id.as_str(), b.hostname.as_str(), b.sample_unix_ns))
        .then_with(|| a.encode_to_vec().cmp(&b.encode_to_vec()))
}

impl OnePhase for NodesFilter {
    type Packet = NodeSamples;

    fn level(&self) -> Level {
        self.level
    }

    fn packet(&mut self) -> (&NodeSamples, &mut Vec<u8>) {
        (&self.merged, &mut self.encoded)
    }

    /// Leaf: its own node's samples, as any level merges them.
    fn leaf(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        self.merge(inputs, out);
    }

    /// Concatenates the samples of the inputs that read, sorted; the others are rejected by index.
    fn merge(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let good = decode::packets_into(inputs, &mut self.inputs, PACKET, out, check_packet);
        self.merged.nodes.clear();
        for (slot, _) in good {
            self.merged.nodes.append(&mut self.inputs[slot].nodes);
        }
        self.merged.nodes.sort_by(order);
    }
}

impl Filter for NodesFilter {
    const NAME: &'static str = "nodes";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.NodeSamples";

    /// Takes no parameters: which samplers run, and how often, is each agent's configuration.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        Params::parse(params, &[])?;
        Ok(NodesFilter {
            level,
            inputs: Vec::new(),
            merged: NodeSamples::default(),
            encoded: Vec::new(),
        })
    }

    canopy_filter_common::one_phase_calls!();

    /// The root's packet is the result, once checked.
    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        one_phase(Self::NAME, phase)?;
        let bad = |e: String| format!("round {round}: the root's packet is not a {PACKET}: {e}");
        let merged = NodeSamples::decode(packet).map_err(|e| bad(e.to_string()))?;
        check_packet(&merged).map_err(bad)?;
        Ok(packet.to_vec())
    }
}

export_filter!(NodesFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::{CpuSample, LoadSample, MemorySample, RankRange};
    use canopy_filter_test::Collect;

    pub(crate) fn sample(node: &str, first: u32, last: u32) -> NodeSample {
        NodeSample {
            node_id: node.into(),
            hostname: format!("{node}.host"),
            ranks: vec![RankRange {
                app: "a".into(),
                first,
                last,
            }],
            sample_unix_ns: 1_700_000_000_000_000_000,
            interval_ns: 100_000_000,
            cpu: Some(CpuSample {
                cpus: 2,
                user_share: 0.5,
                idle_share: 0.5,
                ..Default::default()
            }),
            memory: Some(MemorySample {
                total_bytes: 100,
                available_bytes: 40,
                used_bytes: 60,
                ..Default::default()
            }),
            load: Some(LoadSample {
                load_1m: 1.5,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn one(s: NodeSample) -> Vec<u8> {
        NodeSamples { nodes: vec![s] }.encode_to_vec()
    }

    fn up(f: &mut NodesFilter, inputs: &[&[u8]]) -> (NodeSamples, Vec<(usize, String)>) {
        let mut out = Collect::default();
        f.upstream(0, 0, inputs, &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
        (NodeSamples::decode(out.up[0].1.as_slice()).unwrap(), out.rejects)
    }

    fn ids(p: &NodeSamples) -> Vec<&str> {
        p.nodes.iter().map(|n| n.node_id.as_str()).collect()
    }

    #[test]
    fn takes_no_parameters() {
        assert!(NodesFilter::create("", Level::Leaf).is_ok());
        assert!(NodesFilter::create("{}", Level::Root).is_ok());
        assert_eq!(
            NodesFilter::create(r#"{"period_ms": 10}"#, Level::Leaf).unwrap_err(),
            "unknown parameter \"period_ms\" (known: none)"
        );
    }

    #[test]
    fn samples_are_concatenated_sorted_by_node_whatever_the_order_they_came_in() {
        let (a, b, c) = (
            one(sample("agent:0", 0, 7)),
            one(sample("agent:1", 8, 15)),
            one(sample("agent:2", 16, 23)),
        );
        let mut relay = NodesFilter::create("", Level::Relay).unwrap();
        let (first, _) = up(&mut relay, &[&c, &a]);
        assert_eq!(ids(&first), ["agent:0", "agent:2"]);
        let mut root = NodesFilter::create("", Level::Root).unwrap();
        let (merged, rejects) = up(&mut root, &[&b, &first.encode_to_vec()]);
        assert!(rejects.is_empty());
        assert_eq!(ids(&merged), ["agent:0", "agent:1", "agent:2"]);
        assert_eq!(merged.nodes[1], sample("agent:1", 8, 15));
        let (flat, _) = up(&mut root, &[&a, &b, &c]);
        assert_eq!(flat, merged, "the same whatever the tree");
        let result = root.finalize(0, 0, &merged.encode_to_vec()).unwrap();
        assert_eq!(NodeSamples::decode(result.as_slice()).unwrap(), merged);
    }

    #[test]
    fn bad_samples_are_rejected_by_name_and_the_rest_go_on() {
        let good = one(sample("agent:0", 0, 3));
        let mut no_id = sample("", 0, 0);
        no_id.hostname.clear();
        let mut share = sample("agent:1", 4, 7);
        share.cpu.as_mut().unwrap().user_share = 1.5;
        let mut nan = sample("agent:2", 8, 9);
        nan.cpu.as_mut().unwrap().steal_share = f64::NAN;
        let mut memory = sample("agent:3", 0, 0);
        memory.memory.as_mut().unwrap().used_bytes = 101;
        let mut load = sample("agent:4", 0, 0);
        load.load.as_mut().unwrap().load_5m = -1.0;
        let mut backwards = sample("agent:5", 9, 2);
        backwards.ranks[0].app = "x".into();
        let inputs = [
            one(no_id),
            good.clone(),
            one(share),
            one(nan),
            one(memory),
            one(load),
            one(backwards),
            vec![0xff],
        ];
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut leaf = NodesFilter::create("", Level::Leaf).unwrap();
        let (merged, mut rejects) = up(&mut leaf, &inputs);
        rejects.sort();
        let not = "input is not a canopy.filters.v1.NodeSamples: ";
        assert_eq!(
            rejects,
            vec![
                (0, format!("{not}a sample names no node")),
                (
                    2,
                    format!("{not}node \"agent:1\": cpu user share 1.5 is not between 0 and 1")
                ),
                (
                    3,
                    format!("{not}node \"agent:2\": cpu steal share NaN is not between 0 and 1")
                ),
                (
                    4,
                    format!("{not}node \"agent:3\": memory: 101 bytes used and 40 available of 100")
                ),
                (5, format!("{not}node \"agent:4\": load -1 is not a load")),
                (
                    6,
                    format!("{not}node \"agent:5\": rank range 9-2 of app \"x\" is backwards")
                ),
                (
                    7,
                    format!("{not}failed to decode Protobuf message: invalid varint")
                ),
            ]
        );
        assert_eq!(ids(&merged), ["agent:0"]);
        // Nothing good: an empty packet goes up, and the root stores no node.
        let (none, _) = up(&mut leaf, &[&[0xff]]);
        assert!(none.nodes.is_empty());
    }

    #[test]
    fn the_root_refuses_a_packet_it_cannot_read_and_nothing_goes_down() {
        let mut root = NodesFilter::create("", Level::Root).unwrap();
        assert_eq!(
            root.finalize(3, 0, &[0xff]).unwrap_err(),
            "round 3: the root's packet is not a canopy.filters.v1.NodeSamples: failed to decode Protobuf \
             message: invalid varint"
        );
        assert!(root.finalize(3, 1, &[]).is_err());
        assert!(root.downstream(3, 0, &[], &mut Collect::default()).is_err());
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(NodesFilter::descriptors()).unwrap();
        let (pkg, name) = NodesFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
