//! ToM's three-phase scheme, written once: summaries up (phase 0), the global ranges down (phase 1), the leaves'
//! histograms up (phase 2). A filter says what its packets hold ([`ThreePhase`]); [`upstream`], [`downstream`]
//! and [`finalize`] decide what each level does in each phase, keep the per-round state, and word the errors.
//!
//! Rounds pipeline: every phase of every round is keyed by its round number. A leaf keeps its values from
//! phase 0 until the round's ranges come; the root keeps the round's merged summaries from phase 0 until the
//! counts come up, and hands both to finalize in its own phase-2 packet.

use canopy_filter_sdk::{Emit, Filter, Level};
use prost::Message;

use crate::rounds::{MAX_OPEN_ROUNDS, Rounds};

/// The phases of a round in this scheme.
pub const PHASES: u32 = 3;

/// What a three-phase filter supplies: its packet, its per-round state, and how each step builds and merges.
pub trait ThreePhase: Filter {
    /// The full protobuf name of [`Self::Packet`], as errors and rejections name it.
    const PACKET: &'static str;
    /// The filter's packet, in every phase and both directions.
    type Packet: Message + Default;
    /// A leaf's values of one round, kept from phase 0 until the round's ranges arrive.
    type Buffer;
    /// Phase 0 merged at a relay or the root; the root keeps it until phase 2.
    type Summaries;
    /// Phase 2 merged at a relay or the root.
    type Counts;

    fn level(&self) -> Level;
    /// The leaf's buffers of its open rounds.
    fn buffers(&mut self) -> &mut Rounds<Self::Buffer>;
    /// The root's merged summaries of its open rounds.
    fn summaries(&mut self) -> &mut Rounds<Self::Summaries>;

    /// Phase 0 at a leaf, of `round`: the packet that goes up and the values to keep for binning.
    fn leaf_summaries(
        &mut self,
        round: u64,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> (Self::Packet, Self::Buffer);
    /// Phase 0 at a relay or the root: the children's packets merged.
    fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> Self::Summaries;
    /// Phase 0 at a relay: the merged summaries as they go up.
    fn summaries_packet(&self, merged: &Self::Summaries) -> Self::Packet;
    /// Phase 0 at the root: the global ranges that go down as phase 1.
    fn ranges_packet(&self, merged: &Self::Summaries) -> Self::Packet;
    /// Phase 1 at a leaf: a round's buffered values binned against the ranges from the root; an error says why
    /// the ranges are unusable.
    fn bin(&mut self, buffer: Self::Buffer, ranges: Self::Packet) -> Result<Self::Packet, String>;
    /// Phase 2 at a relay or the root: the children's counts merged.
    fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> Self::Counts;
    /// Phase 2 at a relay: the merged counts as they go up.
    fn counts_packet(&self, counts: Self::Counts) -> Self::Packet;
    /// Phase 2 at the root: the counts with the round's summaries, the packet finalize receives.
    fn root_packet(&self, counts: Self::Counts, summaries: Self::Summaries) -> Self::Packet;
    /// The stored result, from a phase-2 packet.
    fn result(&self, packet: Self::Packet) -> Vec<u8>;
    /// A packet's bytes, in every phase: prost's encoding unless the filter writes the same bytes faster.
    fn encode_packet(&self, packet: &Self::Packet) -> Vec<u8> {
        packet.encode_to_vec()
    }
}

/// The three calls of [`Filter`] that every three-phase filter answers the same way, for its `impl Filter`:
/// `upstream`, `downstream` and `finalize` by this module's functions.
#[macro_export]
macro_rules! three_phase_calls {
    () => {
        fn upstream(
            &mut self,
            round: u64,
            phase: u32,
            inputs: &[&[u8]],
            out: &mut dyn canopy_filter_sdk::Emit,
        ) -> Result<(), String> {
            $crate::three_phase::upstream(self, round, phase, inputs, out)
        }

        fn downstream(
            &mut self,
            round: u64,
            phase: u32,
            packet: &[u8],
            out: &mut dyn canopy_filter_sdk::Emit,
        ) -> Result<(), String> {
            $crate::three_phase::downstream(self, round, phase, packet, out)
        }

        fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
            $crate::three_phase::finalize(self, round, phase, packet)
        }
    };
}

/// [`Filter::upstream`] of a three-phase filter.
pub fn upstream<F: ThreePhase>(
    f: &mut F,
    round: u64,
    phase: u32,
    inputs: &[&[u8]],
    out: &mut dyn Emit,
) -> Result<(), String> {
    match (f.level(), phase) {
        (Level::Leaf, 0) => {
            let (packet, buffer) = f.leaf_summaries(round, inputs, out);
            // Buffered even when empty: phase 2 must still answer, or the parent would wait for this leaf forever.
            f.buffers().insert(round, buffer);
            out.up(0, &f.encode_packet(&packet));
        }
        (Level::Relay, 0) => {
            let merged = f.merge_summaries(inputs, out);
            out.up(0, &f.encode_packet(&f.summaries_packet(&merged)));
        }
        (Level::Root, 0) => {
            let merged = f.merge_summaries(inputs, out);
            let ranges = f.ranges_packet(&merged);
            f.summaries().insert(round, merged);
            out.down(1, &f.encode_packet(&ranges));
        }
        (Level::Relay, 2) => {
            let counts = f.merge_counts(inputs, out);
            out.up(2, &f.encode_packet(&f.counts_packet(counts)));
        }
        (Level::Root, 2) => {
            let counts = f.merge_counts(inputs, out);
            let summaries = f.summaries().remove(round).ok_or_else(|| {
                format!(
                    "round {round}: phase 2 came without the round's phase 0 (more than {MAX_OPEN_ROUNDS} rounds open?)"
                )
            })?;
            // The result needs the summaries: they travel with the root's own packet to finalize.
            out.up(2, &f.encode_packet(&f.root_packet(counts, summaries)));
        }
        (level, phase) => {
            return Err(format!(
                "{} at the {level:?} level gets no phase {phase} upstream",
                F::NAME
            ));
        }
    }
    Ok(())
}

/// [`Filter::downstream`] of a three-phase filter: relays pass the ranges on, leaves bin against them.
pub fn downstream<F: ThreePhase>(
    f: &mut F,
    round: u64,
    phase: u32,
    packet: &[u8],
    out: &mut dyn Emit,
) -> Result<(), String> {
    match (f.level(), phase) {
        (Level::Relay, 1) => out.down(1, packet),
        (Level::Leaf, 1) => {
            // No buffer: the round was never seen here or was dropped as too old; nothing to bin.
            let Some(buffer) = f.buffers().remove(round) else {
                return Ok(());
            };
            let ranges = F::Packet::decode(packet)
                .map_err(|e| format!("round {round}: the phase 1 packet is not a {}: {e}", F::PACKET))?;
            let counts = f
                .bin(buffer, ranges)
                .map_err(|e| format!("round {round}: the phase 1 packet is unusable: {e}"))?;
            out.up(2, &f.encode_packet(&counts));
        }
        (level, phase) => {
            return Err(format!(
                "{} at the {level:?} level gets no phase {phase} downstream",
                F::NAME
            ));
        }
    }
    Ok(())
}

/// [`Filter::finalize`] of a three-phase filter: the result of a phase-2 packet.
pub fn finalize<F: ThreePhase>(f: &F, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
    if phase != 2 {
        return Err(format!(
            "{} results come from phase 2, got phase {phase}",
            F::NAME
        ));
    }
    let packet = F::Packet::decode(packet)
        .map_err(|e| format!("round {round}: the root's packet is not a {}: {e}", F::PACKET))?;
    Ok(f.result(packet))
}

#[cfg(test)]
mod tests {
    //! A toy filter on the skeleton: each leaf counts its inputs, the root sends the total down, each leaf
    //! answers with its count and the total it was told, and the result is the sum of those answers.

    use super::*;
    use canopy_filter_proto::v1::RankCount;
    use canopy_filter_test::{Collect, Run, Tree, simulate};

    struct Toy {
        level: Level,
        buffers: Rounds<u64>,
        totals: Rounds<u64>,
    }

    fn sum(inputs: &[&[u8]], out: &mut dyn Emit) -> RankCount {
        let mut total = RankCount::default();
        for (i, input) in inputs.iter().enumerate() {
            match RankCount::decode(*input) {
                Ok(c) => {
                    total.ranks += c.ranks;
                    total.bytes += c.bytes;
                }
                Err(e) => out.reject(i, &e.to_string()),
            }
        }
        total
    }

    impl ThreePhase for Toy {
        const PACKET: &'static str = "canopy.filters.v1.RankCount";
        type Packet = RankCount;
        type Buffer = u64;
        type Summaries = u64;
        type Counts = RankCount;

        fn level(&self) -> Level {
            self.level
        }
        fn buffers(&mut self) -> &mut Rounds<u64> {
            &mut self.buffers
        }
        fn summaries(&mut self) -> &mut Rounds<u64> {
            &mut self.totals
        }
        fn leaf_summaries(&mut self, _round: u64, inputs: &[&[u8]], _out: &mut dyn Emit) -> (RankCount, u64) {
            let n = inputs.len() as u64;
            (RankCount { ranks: n, bytes: 0 }, n)
        }
        fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> u64 {
            sum(inputs, out).ranks
        }
        fn summaries_packet(&self, merged: &u64) -> RankCount {
            RankCount {
                ranks: *merged,
                bytes: 0,
            }
        }
        fn ranges_packet(&self, merged: &u64) -> RankCount {
            RankCount {
                ranks: 0,
                bytes: *merged,
            }
        }
        fn bin(&mut self, buffer: u64, ranges: RankCount) -> Result<RankCount, String> {
            if ranges.ranks != 0 {
                return Err(format!("ranks is {}, the root sends 0", ranges.ranks));
            }
            Ok(RankCount {
                ranks: buffer,
                bytes: ranges.bytes,
            })
        }
        fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> RankCount {
            sum(inputs, out)
        }
        fn counts_packet(&self, counts: RankCount) -> RankCount {
            counts
        }
        fn root_packet(&self, counts: RankCount, total: u64) -> RankCount {
            assert_eq!(
                counts.ranks, total,
                "the leaves' answers add up to phase 0's total"
            );
            counts
        }
        fn result(&self, packet: RankCount) -> Vec<u8> {
            packet.encode_to_vec()
        }
    }

    impl Filter for Toy {
        const NAME: &'static str = "toy";
        const RESULT_TYPE: &'static str = "canopy.filters.v1.RankCount";
        const PHASES: u32 = PHASES;
        fn descriptors() -> &'static [u8] {
            canopy_filter_proto::FILE_DESCRIPTOR_SET
        }
        fn create(_params: &str, level: Level) -> Result<Self, String> {
            Ok(Toy {
                level,
                buffers: Rounds::new(),
                totals: Rounds::new(),
            })
        }
        fn upstream(
            &mut self,
            round: u64,
            phase: u32,
            inputs: &[&[u8]],
            out: &mut dyn Emit,
        ) -> Result<(), String> {
            upstream(self, round, phase, inputs, out)
        }
        fn downstream(
            &mut self,
            round: u64,
            phase: u32,
            packet: &[u8],
            out: &mut dyn Emit,
        ) -> Result<(), String> {
            downstream(self, round, phase, packet, out)
        }
        fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
            finalize(self, round, phase, packet)
        }
    }

    #[test]
    fn every_leaf_hears_the_global_total_on_any_tree() {
        let tree = Tree::from_parents(&[usize::MAX, 0, 0, 1, 1, 1, 2]);
        let placement = [0, 0, 1, 2, 2, 2, 3];
        let rounds = vec![vec![Vec::new(); placement.len()]; 3];
        for seed in 0..20 {
            let run = Run {
                params: "",
                names: &[],
                placement: &placement,
                rounds: &rounds,
                first_round: 5,
                seed,
            };
            let outcome = simulate::<Toy>(&tree, &run).unwrap();
            assert_eq!(outcome.results.len(), 3);
            for ((round, phase), bytes) in &outcome.results {
                assert_eq!(*phase, 2, "round {round}");
                let r = RankCount::decode(bytes.as_slice()).unwrap();
                // 7 ranks; each of the 4 leaves was told 7.
                assert_eq!((r.ranks, r.bytes), (7, 4 * 7), "round {round}");
            }
        }
    }

    #[test]
    fn wrong_level_or_phase_is_refused_by_name() {
        let mut leaf = Toy::create("", Level::Leaf).unwrap();
        let mut root = Toy::create("", Level::Root).unwrap();
        let mut out = Collect::default();
        assert_eq!(
            upstream(&mut leaf, 0, 2, &[], &mut out).unwrap_err(),
            "toy at the Leaf level gets no phase 2 upstream"
        );
        assert_eq!(
            upstream(&mut root, 0, 1, &[], &mut out).unwrap_err(),
            "toy at the Root level gets no phase 1 upstream"
        );
        assert_eq!(
            downstream(&mut root, 0, 1, &[], &mut out).unwrap_err(),
            "toy at the Root level gets no phase 1 downstream"
        );
        assert_eq!(
            finalize(&root, 0, 0, &[]).unwrap_err(),
            "toy results come from phase 2, got phase 0"
        );
        assert!(out.up.is_empty() && out.down.is_empty());
    }

    #[test]
    fn rounds_without_state_are_answered_as_the_protocol_says() {
        // A leaf told the ranges of a round it never saw emits nothing.
        let mut leaf = Toy::create("", Level::Leaf).unwrap();
        let mut out = Collect::default();
        downstream(&mut leaf, 9, 1, b"\xff", &mut out).unwrap();
        assert!(out.up.is_empty() && out.down.is_empty());
        // A seen round with unreadable ranges fails, naming the round and the packet type.
        upstream(&mut leaf, 9, 0, &[], &mut out).unwrap();
        let err = downstream(&mut leaf, 9, 1, b"\xff", &mut out).unwrap_err();
        assert!(
            err.starts_with("round 9: the phase 1 packet is not a canopy.filters.v1.RankCount: "),
            "{err}"
        );
        // Ranges that decode but that the filter finds unusable fail the same way, with its reason.
        upstream(&mut leaf, 9, 0, &[], &mut out).unwrap();
        let odd = RankCount { ranks: 3, bytes: 0 }.encode_to_vec();
        assert_eq!(
            downstream(&mut leaf, 9, 1, &odd, &mut out).unwrap_err(),
            "round 9: the phase 1 packet is unusable: ranks is 3, the root sends 0"
        );
        // The root's phase 2 of a round whose phase 0 it does not hold.
        let mut root = Toy::create("", Level::Root).unwrap();
        assert_eq!(
            upstream(&mut root, 4, 2, &[], &mut out).unwrap_err(),
            "round 4: phase 2 came without the round's phase 0 (more than 1024 rounds open?)"
        );
    }
}
