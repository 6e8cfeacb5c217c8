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

use canopy_filter_common::{decode, stream};
use canopy_filter_proto::v1::LatencyPacket;
use canopy_filter_sdk::{Emit, Filter, Level, export_filter, nothing_down, one_phase};
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

impl LatencyFilter {
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

    fn upstream(
        &mut self,
        _round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        one_phase(Self::NAME, phase)?;
        match self.level {
            Level::Leaf => self.leaf(inputs, out),
            Level::Relay | Level::Root => self.merge(inputs, out),
        }
        self.encoded.clear();
        self.merged
            .encode(&mut self.encoded)
            .map_err(|e| format!("encoding the latency packet: {e}"))?;
        out.up(0, &self.encoded);
        Ok(())
    }

    fn downstream(
        &mut self,
        _round: u64,
        phase: u32,
        _packet: &[u8],
        _out: &mut dyn Emit,
    ) -> Result<(), String> {
        nothing_down(Self::NAME, phase)
    }

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
