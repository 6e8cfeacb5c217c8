//! The kmeans filter (seed 002, section 4): ranks grouped into equivalence classes by k-means over per-rank
//! vectors of one metric (exclusive time by default) of the selected events, each class with a representative,
//! computed in the tree so that the root receives O(k) per iteration, never the ranks.
//!
//! A round runs Lloyd's iterations as phases ([`Filter::PHASES`] is `2 * MAX_ITERATIONS + 3`; up phases are
//! even, down phases odd). Phase 0 up: the dimensions (the selected event ids seen, sorted) and the bounding box
//! of all ranks, a rank without an event at 0 there. The root places k seeds evenly on the box's diagonal
//! ([`space::seeds`]) and sends them down as phase 1. Iteration j: the leaves assign their ranks to the nearest
//! centroid and send up, in phase 2j, per cluster the sum of its vectors and its count, and the ranks whose
//! cluster changed; the root moves each centroid to its cluster's mean (an empty cluster keeps its centroid) and
//! sends them down as phase 2j + 1, until an iteration changes no assignment or `max_iterations` is reached. Then
//! the root jumps to the last pass: the final centroids down as phase `PHASES - 2`, and up as `PHASES - 1` per
//! cluster its ranks (as ranges), its representative (the rank nearest the centroid, ties to the lowest app and
//! rank), its size and its squared distances, from which the result gives the RMS and max distance and the fit
//! (the total within-cluster sum of squares).
//!
//! With k "auto", every k from 1 to k_max runs side by side in the same phases (a k that is done keeps its
//! centroids while the others iterate) and the smallest k whose fit the next does not improve by `improvement`
//! is chosen. With `refit_every` N, one round in N iterates from the seeds and the others assign their ranks to
//! the last refit's centroids in one pass down and up.

#![forbid(unsafe_code)]

pub mod config;
pub mod leaf;
pub mod merge;
pub mod root;
pub mod space;

use canopy_filter_common::decode;
use canopy_filter_common::rounds::Rounds;
use canopy_filter_common::select::Selection;
use canopy_filter_proto::v1::{KmeansPacket, KmeansResult, RankRef};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use prost::Message;

pub use config::{Config, MAX_ITERATIONS};
use leaf::Points;

/// The phases of a round: phase 0, two per iteration, and the last pass down and up.
pub const PHASES: u32 = 2 * MAX_ITERATIONS + 3;
/// The last pass down: the final centroids.
pub const LAST_DOWN: u32 = PHASES - 2;
/// The last pass up: the clusters.
pub const LAST_UP: u32 = PHASES - 1;

const PACKET: &str = "canopy.filters.v1.KmeansPacket";

/// One instance per stream per node.
#[derive(Debug)]
pub struct KmeansFilter {
    level: Level,
    config: Config,
    selection: Selection,
    /// Leaf: each open round's ranks.
    points: Rounds<Points>,
    /// Relay: each open round's dimension count, learnt from the packets passed down.
    dims: Rounds<usize>,
    /// Root: each open round's state.
    rounds: Rounds<root::Round>,
    /// Root: the centroids of the last refit.
    fitted: Option<root::Fitted>,
    /// Root: rounds begun, to refit one in `refit_every`.
    begun: u64,
}

impl KmeansFilter {
    /// Phase 0 at a leaf: the ranks' vectors, kept for the round's later passes, and the box they span.
    fn leaf_phase0(&mut self, round: u64, inputs: &[&[u8]], out: &mut dyn Emit) -> KmeansPacket {
        let (profiles, _) = decode::profiles(inputs, out);
        let mut ranks = Vec::with_capacity(profiles.len());
        let mut sparse = Vec::with_capacity(profiles.len());
        for p in &profiles {
            sparse.push(leaf::vector(
                p,
                &mut self.selection,
                self.config.metric,
                self.config.values,
            ));
            ranks.push(RankRef {
                app: p.app.clone(),
                rank: p.rank,
            });
        }
        let points = Points::new(ranks, sparse);
        let packet = points.box_packet();
        // Kept even without ranks: every later pass must still answer, or the parent would wait for this leaf.
        self.points.insert(round, points);
        packet
    }

    /// Sends down what follows the root's state: the next iteration, or the last pass when every k is done.
    fn root_next(&self, round: &root::Round, out: &mut dyn Emit) {
        let phase = if round.done() {
            LAST_DOWN
        } else {
            2 * round.iteration + 1
        };
        out.down(phase, &round.down().encode_to_vec());
    }

    fn upstream_phase(
        &mut self,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        let ks = self.config.ks.clone();
        match (self.level, phase) {
            (Level::Leaf, 0) => {
                let packet = self.leaf_phase0(round, inputs, out);
                out.up(0, &packet.encode_to_vec());
            }
            (Level::Relay | Level::Root, 0) => {
                let packets = decode::packets(inputs, PACKET, out, merge::check_box);
                let merged = merge::merge_box(&packets);
                if self.level == Level::Relay {
                    out.up(0, &merged.encode_to_vec());
                    return Ok(());
                }
                let refit = self.begun.is_multiple_of(u64::from(self.config.refit_every));
                self.begun += 1;
                let state = root::Round::start(merged, &self.config, refit, self.fitted.as_ref());
                self.root_next(&state, out);
                self.rounds.insert(round, state);
            }
            (Level::Relay, p) if p.is_multiple_of(2) && p < LAST_UP => {
                let dims = self.relay_dims(round, p)?;
                let packets = decode::packets(inputs, PACKET, out, |m| merge::check_sums(m, &ks, dims));
                out.up(p, &merge::merge_sums(&packets, &ks, dims).encode_to_vec());
            }
            (Level::Root, p) if p.is_multiple_of(2) && p < LAST_UP => {
                let max = self.config.max_iterations;
                let mut state = self
                    .rounds
                    .remove(round)
                    .ok_or_else(|| format!("round {round}: phase {p} came without the round's phase 0"))?;
                let expected = 2 * (state.iteration + 1);
                if p != expected || state.done() {
                    let iterations = state.iteration;
                    self.rounds.insert(round, state);
                    return Err(format!(
                        "round {round}: phase {p} came up after {iterations} iterations (expected phase {expected})"
                    ));
                }
                let dims = state.dims();
                let packets = decode::packets(inputs, PACKET, out, |m| merge::check_sums(m, &ks, dims));
                let sums = merge::merge_sums(&packets, &ks, dims);
                state.step(&sums, max);
                self.root_next(&state, out);
                self.rounds.insert(round, state);
            }
            (Level::Relay, LAST_UP) => {
                self.dims.remove(round);
                let packets = decode::packets(inputs, PACKET, out, |m| merge::check_parts(m, &ks));
                out.up(LAST_UP, &merge::merge_parts(&packets, &ks).encode_to_vec());
            }
            (Level::Root, LAST_UP) => {
                let state = self.rounds.remove(round).ok_or_else(|| {
                    format!("round {round}: phase {LAST_UP} came without the round's phase 0")
                })?;
                let packets = decode::packets(inputs, PACKET, out, |m| merge::check_parts(m, &ks));
                let parts = merge::merge_parts(&packets, &ks);
                if state.refit {
                    self.fitted = Some(state.fitted());
                }
                let result = state.result(parts, &self.config, |id| {
                    self.selection.name(id).unwrap_or_default().to_string()
                });
                out.up(LAST_UP, &result.encode_to_vec());
            }
            (level, phase) => {
                return Err(format!(
                    "kmeans at the {level:?} level gets no phase {phase} upstream"
                ));
            }
        }
        Ok(())
    }

    fn relay_dims(&self, round: u64, phase: u32) -> Result<usize, String> {
        self.dims.get(round).copied().ok_or_else(|| {
            format!(
                "round {round}: phase {phase} came up before the round's centroids went down through here"
            )
        })
    }

    fn decode_down(&self, round: u64, phase: u32, packet: &[u8]) -> Result<KmeansPacket, String> {
        let p = KmeansPacket::decode(packet)
            .map_err(|e| format!("round {round}: the phase {phase} packet is not a {PACKET}: {e}"))?;
        leaf::check_down(&p, &self.config.ks)
            .map_err(|e| format!("round {round}: the phase {phase} packet is unusable: {e}"))?;
        Ok(p)
    }
}

impl Filter for KmeansFilter {
    const NAME: &'static str = "kmeans";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.KmeansResult";
    const PHASES: u32 = PHASES;

    fn create(params: &str, level: Level) -> Result<Self, String> {
        let config = Config::parse(params)?;
        Ok(KmeansFilter {
            level,
            selection: Selection::new(config.scheme.clone()),
            config,
            points: Rounds::new(),
            dims: Rounds::new(),
            rounds: Rounds::new(),
            fitted: None,
            begun: 0,
        })
    }

    fn upstream(
        &mut self,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        self.upstream_phase(round, phase, inputs, out)
    }

    fn downstream(
        &mut self,
        round: u64,
        phase: u32,
        packet: &[u8],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        if phase.is_multiple_of(2) || phase > LAST_DOWN || self.level == Level::Root {
            return Err(format!(
                "kmeans at the {:?} level gets no phase {phase} downstream",
                self.level
            ));
        }
        let down = self.decode_down(round, phase, packet)?;
        if self.level == Level::Relay {
            self.dims.insert(round, down.dims.len());
            out.down(phase, packet);
            return Ok(());
        }
        if phase == LAST_DOWN {
            // No points: the round was never seen here or was dropped as too old; nothing to assign.
            let Some(mut points) = self.points.remove(round) else {
                return Ok(());
            };
            out.up(LAST_UP, &points.last(&down).encode_to_vec());
        } else {
            let Some(mut points) = self.points.remove(round) else {
                return Ok(());
            };
            let up = points.iterate(&down);
            self.points.insert(round, points);
            out.up(phase + 1, &up.encode_to_vec());
        }
        Ok(())
    }

    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        if phase != LAST_UP {
            return Err(format!(
                "kmeans results come from phase {LAST_UP}, got phase {phase}"
            ));
        }
        KmeansResult::decode(packet).map_err(|e| {
            format!("round {round}: the root's packet is not a canopy.filters.v1.KmeansResult: {e}")
        })?;
        Ok(packet.to_vec())
    }

    fn names(&mut self, names: &[(u64, &str)]) {
        self.selection.learn(names);
    }
}

export_filter!(KmeansFilter);
