//! The latency filter (seed 004's cross-application timers): each step of a workflow key started by some rank
//! (`step_start`) and stopped by another, maybe of another application and in a later round (`step_stop`),
//! gets its end-to-end latency, the latest stop minus the earliest start over every rank, and per application
//! the ranks that marked it and their exclusive time split into transfer and compute.
//!
//! Leaves fold their ranks' marks per (key, step); relays merge by minimum, maximum and sums, so the root's
//! packet is the same whatever the tree; the root keeps the steps it knows one end of across rounds and a
//! round's result holds the steps that completed in it.

#![forbid(unsafe_code)]

pub mod leaf;
pub mod open;
pub mod packet;
pub mod settings;

use canopy_filter_common::one_phase::OnePhase;
use canopy_filter_common::{decode, stream};
use canopy_filter_proto::v1::LatencyPacket;
use canopy_filter_sdk::{Emit, Filter, Level, export_filter, one_phase};
use prost::Message;

use settings::{Settings, Transfer};

/// One instance per stream per node.
#[derive(Debug)]
pub struct LatencyFilter {
    level: Level,
    settings: Settings,
    transfer: Transfer,
    /// The root's waiting steps.
    open: open::Open,
    buffers: stream::Buffers,
    inputs: Vec<LatencyPacket>,
    merged: LatencyPacket,
    encoded: Vec<u8>,
}

const PACKET: &str = "canopy.filters.v1.LatencyPacket";

impl OnePhase for LatencyFilter {
    type Packet = LatencyPacket;

    fn level(&self) -> Level {
        self.level
    }

    fn packet(&mut self) -> (&LatencyPacket, &mut Vec<u8>) {
        (&self.merged, &mut self.encoded)
    }

    fn leaf(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        self.buffers.clear();
        let (profiles, raw_bytes) = decode::profile_views(inputs, &mut self.buffers, out);
        leaf::fold(
            &profiles,
            &self.buffers,
            &self.transfer,
            raw_bytes,
            &mut self.merged,
        );
    }

    fn merge(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let good = decode::packets_into(inputs, &mut self.inputs, PACKET, out, packet::check);
        let packets = good.iter().map(|&(slot, _)| &self.inputs[slot]);
        packet::merge(packets, &mut self.merged);
    }
}

impl Filter for LatencyFilter {
    const NAME: &'static str = "latency";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.LatencyResult";

    /// Params: `{"transfer": "<regex over event names>", "max_open": 1..=1048576 (4096)}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let settings = Settings::parse(params)?;
        Ok(LatencyFilter {
            level,
            open: open::Open::new(settings.max_open),
            settings,
            transfer: Transfer::default(),
            buffers: Default::default(),
            inputs: Vec::new(),
            merged: LatencyPacket::default(),
            encoded: Vec::new(),
        })
    }

    canopy_filter_common::one_phase_calls!();

    /// The round's root packet taken into the open steps; the steps it completes are the result.
    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        one_phase(Self::NAME, phase)?;
        let bad = |e: String| format!("round {round}: the root's packet is not a {PACKET}: {e}");
        let merged = LatencyPacket::decode(packet).map_err(|e| bad(e.to_string()))?;
        packet::check(&merged).map_err(bad)?;
        Ok(self.open.round(&merged).encode_to_vec())
    }

    fn names(&mut self, names: &[(u64, &str)]) {
        self.transfer.learn(&self.settings.transfer, names);
    }
}

export_filter!(LatencyFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::{LatencyResult, LatencyStep};
    use canopy_filter_test::Collect;
    use canopy_wire::v1::{ProfileBatch, RankProfile, StepMark};

    fn marked(app: &str, rank: u32, marks: &[(u64, bool, u64)]) -> Vec<u8> {
        ProfileBatch {
            profiles: vec![RankProfile {
                app: app.into(),
                rank,
                marks: marks
                    .iter()
                    .map(|&(step, stop, unix_ns)| StepMark {
                        key_id: 9,
                        step,
                        stop,
                        unix_ns,
                    })
                    .collect(),
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn a_malformed_profile_is_rejected_and_the_rest_folded() {
        let good = marked("sim", 0, &[(1, false, 100)]);
        // A mark whose length runs past the profile: the profile is [field 12, length 9] and 2 bytes.
        let mut bad = Vec::new();
        let profile = [0x62u8, 0x09, 0x09, 0x01];
        prost::encoding::bytes::encode(1, &profile.to_vec(), &mut bad);
        // A mark whose key has the wrong wire type (a varint where a fixed64 belongs).
        let mut wrong = Vec::new();
        let mark = [0x08u8, 0x01];
        let mut p = Vec::new();
        prost::encoding::bytes::encode(12, &mark.to_vec(), &mut p);
        prost::encoding::bytes::encode(1, &p, &mut wrong);
        let mut leaf = LatencyFilter::create("{}", Level::Leaf).unwrap();
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&good, &bad, &wrong], &mut out).unwrap();
        let rejected: Vec<usize> = out.rejects.iter().map(|r| r.0).collect();
        assert_eq!(rejected, vec![1, 2]);
        assert_eq!(
            out.rejects[0].1,
            "input is not a canopy.v1.ProfileBatch: buffer underflow"
        );
        assert_eq!(
            out.rejects[1].1,
            "input is not a canopy.v1.ProfileBatch: failed to decode Protobuf message: invalid wire type: \
             Varint (expected SixtyFourBit)"
        );
        let packet = LatencyPacket::decode(out.up[0].1.as_slice()).unwrap();
        assert_eq!(packet.steps.len(), 1);
        assert_eq!((packet.steps[0].starts, packet.steps[0].start_unix_ns), (1, 100));
    }

    #[test]
    fn a_relay_rejects_a_bad_packet_saying_why_and_merges_the_rest() {
        let good = LatencyPacket {
            steps: vec![LatencyStep {
                key_id: 9,
                step: 1,
                stops: 1,
                stop_unix_ns: 5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut unsorted = good.clone();
        unsorted.steps.push(good.steps[0].clone());
        let mut relay = LatencyFilter::create("{}", Level::Relay).unwrap();
        let mut out = Collect::default();
        let inputs = [unsorted.encode_to_vec(), vec![0x0a, 0x07], good.encode_to_vec()];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        relay.upstream(0, 0, &refs, &mut out).unwrap();
        let mut rejects = out.rejects.clone();
        rejects.sort();
        assert_eq!(rejects.len(), 2, "{rejects:?}");
        assert_eq!(rejects[0].0, 0);
        assert!(
            rejects[0]
                .1
                .starts_with("input is not a canopy.filters.v1.LatencyPacket: row 1: step (0000000000000009, 1) does not follow"),
            "{}",
            rejects[0].1
        );
        assert_eq!(rejects[1].0, 1);
        assert!(rejects[1].1.contains("buffer underflow"), "{}", rejects[1].1);
        assert_eq!(LatencyPacket::decode(out.up[0].1.as_slice()).unwrap(), good);
        // The root refuses a bad packet in finalize with the round in the error.
        let mut root = LatencyFilter::create("{}", Level::Root).unwrap();
        let err = root.finalize(4, 0, &unsorted.encode_to_vec()).unwrap_err();
        assert!(
            err.starts_with("round 4: the root's packet is not a canopy.filters.v1.LatencyPacket: row 1:"),
            "{err}"
        );
        assert!(root.finalize(4, 1, &good.encode_to_vec()).is_err());
    }

    #[test]
    fn a_step_started_by_one_application_and_stopped_by_another_later() {
        let mut leaf = LatencyFilter::create("{}", Level::Leaf).unwrap();
        let mut root = LatencyFilter::create("{}", Level::Root).unwrap();
        let mut round = |r: u64, inputs: &[Vec<u8>]| {
            let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let mut out = Collect::default();
            leaf.upstream(r, 0, &refs, &mut out).unwrap();
            LatencyResult::decode(root.finalize(r, 0, &out.up[0].1).unwrap().as_slice()).unwrap()
        };
        let r0 = round(
            0,
            &[
                marked("sim", 0, &[(1, false, 1_000)]),
                marked("sim", 1, &[(1, false, 900)]),
            ],
        );
        assert_eq!((r0.steps.len(), r0.open), (0, 1));
        let r1 = round(
            1,
            &[marked("ana", 3, &[(1, true, 31_000)]), marked("ana", 2, &[])],
        );
        assert_eq!(r1.open, 0);
        let s = &r1.steps[0];
        assert_eq!(
            (s.latency_ns, s.start_rank, s.stop_app.as_str()),
            (30_100, 1, "ana")
        );
        assert_eq!(
            s.apps
                .iter()
                .map(|a| (a.app.as_str(), a.ranks))
                .collect::<Vec<_>>(),
            vec![("ana", 1), ("sim", 2)]
        );
    }

    #[test]
    fn params_errors_are_named() {
        assert_eq!(
            LatencyFilter::create(r#"{"max_open": -1}"#, Level::Root).unwrap_err(),
            "max_open must be between 1 and 1048576, got -1"
        );
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(LatencyFilter::descriptors()).unwrap();
        let (pkg, name) = LatencyFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
