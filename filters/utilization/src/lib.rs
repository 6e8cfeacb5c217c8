//! The utilization filter (seed 000): per 1 ms bin of a time round, the share of wall time the ranks spent in
//! each activity, averaged over the ranks that cover the bin. Packets between levels carry sums of shares and
//! per-bin rank counts, so merging adds and the root's averages are those of all ranks at once, whatever the
//! tree; the root folds the activities below a threshold into "other" (id 0).

#![forbid(unsafe_code)]

pub mod merge;
pub mod result;
pub mod window;

use std::collections::HashMap;

use canopy_filter_common::one_phase::OnePhase;
use canopy_filter_common::{Params, decode};
use canopy_filter_proto::v1::UtilizationPacket;
use canopy_filter_sdk::{Emit, Filter, Level, export_filter, one_phase};
use canopy_wire::utilization::{self as util, FULL};
use canopy_wire::v1::ProfileBatch;
use prost::Message;

use crate::merge::{Covers, Merger, Part, Values};
use crate::result::{Averager, threshold_share};
use crate::window::Window;

/// The threshold (percent of a bin) when the parameters name none.
pub const DEFAULT_THRESHOLD_PERCENT: u32 = 10;

/// What a relay's inputs are, as its rejections name them.
const PACKET: &str = "canopy.filters.v1.UtilizationPacket";

/// One instance per stream per node. Each round is one phase; what it keeps between calls are buffers.
#[derive(Debug)]
pub struct UtilizationFilter {
    level: Level,
    /// On the share scale (0 to 250).
    threshold: u32,
    names: HashMap<u64, String>,
    /// The leaf's inputs, decoded into buffers kept between rounds.
    batches: Vec<ProfileBatch>,
    /// The children's packets of the round being merged, likewise.
    inputs: Vec<UtilizationPacket>,
    merger: Merger,
    averager: Averager,
    /// The packet this node sends up, and its encoding.
    merged: UtilizationPacket,
    encoded: Vec<u8>,
}

/// Why a packet from below cannot be merged (beyond [`util::check_table`]).
pub fn check_packet(p: &UtilizationPacket) -> Result<(), String> {
    if p.counts.is_empty() {
        // No bins: the packet counts ranks only, whatever its (meaningless) window says.
        if !p.activity.is_empty() || !p.sums.is_empty() || !p.ranks.is_empty() {
            return Err(format!(
                "no bins but {} records, {} sums and {} rank counts",
                p.activity.len(),
                p.sums.len(),
                p.ranks.len()
            ));
        }
        return Ok(());
    }
    util::check_table(p.bin_us, &p.activities, &p.counts, &p.activity, p.sums.len())
        .map_err(|e| e.to_string())?;
    if p.ranks.len() != p.counts.len() {
        return Err(format!(
            "{} bins but {} rank counts",
            p.counts.len(),
            p.ranks.len()
        ));
    }
    let mut at = 0;
    for (bin, (&count, &ranks)) in p.counts.iter().zip(&p.ranks).enumerate() {
        let most = u64::from(ranks) * u64::from(FULL);
        for k in at..at + count as usize {
            if p.sums[k] > most {
                return Err(format!(
                    "bin {bin}: record {k} sums {} over {ranks} ranks, more than {most}",
                    p.sums[k]
                ));
            }
        }
        at += count as usize;
    }
    if p.ranks.iter().any(|&r| r > p.profiles) {
        return Err(format!(
            "a bin covers more ranks than the packet's {} profiles",
            p.profiles
        ));
    }
    Ok(())
}

impl OnePhase for UtilizationFilter {
    type Packet = UtilizationPacket;

    fn level(&self) -> Level {
        self.level
    }

    fn packet(&mut self) -> (&UtilizationPacket, &mut Vec<u8>) {
        (&self.merged, &mut self.encoded)
    }

    /// Leaf: sums its ranks' utilization profiles into one packet.
    fn leaf(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let mut window = None;
        let mut decoded =
            decode::packets_into(inputs, &mut self.batches, "canopy.v1.ProfileBatch", out, |_| {
                Ok(())
            });
        // By (app, rank) (ties in the inputs' canonical order): the first rank with bins sets the grid the
        // others must fit, so one stray rank is refused, not the leaf's others.
        let batches = &self.batches;
        decoded.sort_by(|&(a, _), &(b, _)| {
            let key = |slot: usize| batches[slot].profiles.first().map(|p| (p.app.as_str(), p.rank));
            key(a).cmp(&key(b))
        });
        let mut taken = Vec::with_capacity(inputs.len());
        let (mut profiles, mut without, mut lost, mut raw_bytes) = (0u32, 0u32, 0u64, 0u64);
        for (slot, i) in decoded {
            let batch = &self.batches[slot];
            match admit(batch, window) {
                Ok(joined) => window = joined,
                Err(reason) => {
                    out.reject(i, &reason);
                    continue;
                }
            }
            taken.push(slot);
            raw_bytes += inputs[i].len() as u64;
            for p in &batch.profiles {
                match &p.utilization {
                    Some(u) => {
                        profiles = profiles.saturating_add(1);
                        lost = lost.saturating_add(u.lost);
                    }
                    None => without = without.saturating_add(1),
                }
            }
        }
        let parts: Vec<Part<'_>> = taken
            .iter()
            .flat_map(|&slot| &self.batches[slot].profiles)
            .filter_map(|p| {
                let u = p.utilization.as_ref()?;
                Some(Part {
                    window: Window::of(u.start_unix_ns, u.bin_us, u.counts.len())?,
                    activities: &u.activities,
                    counts: &u.counts,
                    activity: &u.activity,
                    values: Values::Shares(&u.share),
                    covers: Covers::One,
                })
            })
            .collect();
        self.merger.merge(window, &parts, &mut self.merged);
        self.merged.profiles = profiles;
        self.merged.without = without;
        self.merged.lost = lost;
        self.merged.raw_bytes = raw_bytes;
    }

    /// Relay and root: adds the children's packets, taken in their canonical order.
    fn merge(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let mut window = None;
        let mut good = Vec::with_capacity(inputs.len());
        let read = decode::packets_into(inputs, &mut self.inputs, PACKET, out, check_packet);
        for (slot, i) in read {
            let p = &self.inputs[slot];
            match Window::join(window, Window::of(p.start_unix_ns, p.bin_us, p.counts.len())) {
                Ok(joined) => window = joined,
                Err(m) => {
                    out.reject(i, &format!("input does not fit the merged packets: {m}"));
                    continue;
                }
            }
            good.push(slot);
        }
        let (mut profiles, mut without, mut lost, mut raw_bytes) = (0u32, 0u32, 0u64, 0u64);
        for &slot in &good {
            let p = &self.inputs[slot];
            profiles = profiles.saturating_add(p.profiles);
            without = without.saturating_add(p.without);
            lost = lost.saturating_add(p.lost);
            raw_bytes = raw_bytes.saturating_add(p.raw_bytes);
        }
        let parts: Vec<Part<'_>> = good
            .iter()
            .filter_map(|&slot| {
                let p = &self.inputs[slot];
                Some(Part {
                    window: Window::of(p.start_unix_ns, p.bin_us, p.counts.len())?,
                    activities: &p.activities,
                    counts: &p.counts,
                    activity: &p.activity,
                    values: Values::Sums(&p.sums),
                    covers: Covers::PerBin(&p.ranks),
                })
            })
            .collect();
        self.merger.merge(window, &parts, &mut self.merged);
        self.merged.profiles = profiles;
        self.merged.without = without;
        self.merged.lost = lost;
        self.merged.raw_bytes = raw_bytes;
    }
}

/// The window `have` grown by a batch's utilization profiles, or why the batch is refused: a profile that
/// fails [`util::check`], or whose bins do not line up with the others'. A profile without bins covers
/// nothing and joins any window.
fn admit(batch: &ProfileBatch, mut have: Option<Window>) -> Result<Option<Window>, String> {
    for p in &batch.profiles {
        let Some(u) = &p.utilization else { continue };
        let who = || format!("app \"{}\" rank {}", p.app, p.rank);
        util::check(u).map_err(|e| format!("{}: utilization: {e}", who()))?;
        have = Window::join(have, Window::of(u.start_unix_ns, u.bin_us, u.counts.len()))
            .map_err(|m| format!("{}: {m}", who()))?;
    }
    Ok(have)
}

impl Filter for UtilizationFilter {
    const NAME: &'static str = "utilization";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.UtilizationResult";

    /// Params: `{"threshold": <percent of a bin, 0 to 100>}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let params = Params::parse(params, &["threshold"])?;
        let percent = params.u32_between("threshold", DEFAULT_THRESHOLD_PERCENT, 0, 100)?;
        Ok(UtilizationFilter {
            level,
            threshold: threshold_share(percent),
            names: HashMap::new(),
            batches: Vec::new(),
            inputs: Vec::new(),
            merger: Merger::default(),
            averager: Averager::default(),
            merged: UtilizationPacket::default(),
            encoded: Vec::new(),
        })
    }

    canopy_filter_common::one_phase_calls!();

    /// The root's summed packet as the `UtilizationResult` stored: averages, folded and named.
    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        one_phase(Self::NAME, phase)?;
        let bad = |e: String| {
            format!("round {round}: the root's packet is not a canopy.filters.v1.UtilizationPacket: {e}")
        };
        let merged = UtilizationPacket::decode(packet).map_err(|e| bad(e.to_string()))?;
        check_packet(&merged).map_err(bad)?;
        let result = self.averager.result(&merged, self.threshold, &self.names);
        Ok(result.encode_to_vec())
    }

    fn names(&mut self, names: &[(u64, &str)]) {
        for &(id, name) in names {
            self.names.insert(id, name.to_string());
        }
    }
}

export_filter!(UtilizationFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::UtilizationResult;
    use canopy_filter_test::{Collect, encode_one};
    use canopy_wire::v1::{RankProfile, Utilization};

    const MS: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000_000 * MS;

    /// Rank `rank`'s profile over bins from `T0 + first` ms, one (activity, share) list per bin.
    fn rank(rank: u32, first: u64, bins: &[&[(u64, u32)]]) -> RankProfile {
        let mut activities: Vec<u64> = bins.iter().flat_map(|b| b.iter().map(|r| r.0)).collect();
        activities.sort_unstable();
        activities.dedup();
        let u = Utilization {
            start_unix_ns: T0 + first * MS,
            bin_us: 1000,
            counts: bins.iter().map(|b| b.len() as u32).collect(),
            activity: bins
                .iter()
                .flat_map(|b| b.iter().map(|r| activities.binary_search(&r.0).unwrap() as u32))
                .collect(),
            share: bins.iter().flat_map(|b| b.iter().map(|r| r.1)).collect(),
            activities,
            lost: 1,
            threads: 1,
        };
        RankProfile {
            app: "a".into(),
            rank,
            utilization: Some(u),
            ..Default::default()
        }
    }

    fn records(p: &UtilizationPacket) -> Vec<(usize, u64, u64)> {
        let mut bins = Vec::new();
        for (b, &c) in p.counts.iter().enumerate() {
            bins.extend(std::iter::repeat_n(b, c as usize));
        }
        bins.iter()
            .zip(p.activity.iter().zip(&p.sums))
            .map(|(&b, (&a, &s))| (b, p.activities[a as usize], s))
            .collect()
    }

    fn up(f: &mut UtilizationFilter, inputs: &[&[u8]]) -> (UtilizationPacket, Vec<(usize, String)>) {
        let mut out = Collect::default();
        f.upstream(0, 0, inputs, &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
        (
            UtilizationPacket::decode(out.up[0].1.as_slice()).unwrap(),
            out.rejects,
        )
    }

    #[test]
    fn params_are_checked_by_name() {
        assert_eq!(
            UtilizationFilter::create(r#"{"treshold": 3}"#, Level::Leaf).unwrap_err(),
            "unknown parameter \"treshold\" (known: threshold)"
        );
        assert_eq!(
            UtilizationFilter::create(r#"{"threshold": 101}"#, Level::Leaf).unwrap_err(),
            "threshold must be between 0 and 100, got 101"
        );
        assert_eq!(
            UtilizationFilter::create(r#"{"threshold": "5"}"#, Level::Leaf).unwrap_err(),
            "threshold must be an integer between 0 and 100, got \"5\""
        );
        assert_eq!(UtilizationFilter::create("", Level::Root).unwrap().threshold, 25);
        let f = UtilizationFilter::create(r#"{"threshold": 1}"#, Level::Root).unwrap();
        assert_eq!(f.threshold, 3);
    }

    #[test]
    fn a_leaf_sums_aligned_ranks_and_rejects_the_misfits_by_name() {
        let a = encode_one(&rank(0, 2, &[&[(7, 100)], &[(7, 50), (9, 200)]]));
        let b = encode_one(&rank(1, 0, &[&[(9, 250)]]));
        let none = encode_one(&RankProfile {
            app: "a".into(),
            rank: 2,
            ..Default::default()
        });
        let mut shifted = rank(3, 0, &[&[(7, 10)]]);
        shifted.utilization.as_mut().unwrap().start_unix_ns += 1000;
        let shifted = encode_one(&shifted);
        let mut wide = rank(4, 0, &[&[(7, 10)]]);
        wide.utilization.as_mut().unwrap().bin_us = 2000;
        let wide = encode_one(&wide);
        let far = encode_one(&rank(5, MAX_BINS_MS, &[&[(7, 10)]]));
        let mut broken = rank(6, 0, &[&[(7, 10)]]);
        broken.utilization.as_mut().unwrap().share[0] = 251;
        let broken = encode_one(&broken);
        let garbage = vec![0x0a, 0x05, 0x01];

        let mut leaf = UtilizationFilter::create("", Level::Leaf).unwrap();
        let inputs: [&[u8]; 8] = [&a, &shifted, &b, &wide, &none, &far, &broken, &garbage];
        let (p, mut rejects) = up(&mut leaf, &inputs);
        rejects.sort();
        let start = T0;
        assert_eq!(
            rejects,
            vec![
                (
                    1,
                    format!(
                        "app \"a\" rank 3: start_unix_ns {} is not a whole number of 1000 us bins from the \
                         packet's start {start}",
                        T0 + 1000
                    )
                ),
                (
                    3,
                    "app \"a\" rank 4: bin_us 2000 differs from the packet's bin_us 1000".into()
                ),
                (
                    5,
                    "app \"a\" rank 5: the packet's window would span 32769 bins, more than 32768".into()
                ),
                (
                    6,
                    "app \"a\" rank 6: utilization: record 0: share 251 is above 250".into()
                ),
                (
                    7,
                    "input is not a canopy.v1.ProfileBatch: failed to decode Protobuf message: \
                     ProfileBatch.profiles: buffer underflow"
                        .into()
                ),
            ]
        );
        assert_eq!((p.start_unix_ns, p.bin_us), (T0, 1000));
        assert_eq!(p.ranks, vec![1, 0, 1, 1]);
        assert_eq!(
            records(&p),
            vec![(0, 9, 250), (2, 7, 100), (3, 7, 50), (3, 9, 200)]
        );
        assert_eq!((p.profiles, p.without, p.lost), (2, 1, 2));
        assert_eq!(p.raw_bytes, (a.len() + b.len() + none.len()) as u64);

        // Whatever order the ranks come in, the packet is the same.
        let (again, _) = up(&mut leaf, &[&garbage, &none, &b, &far, &a]);
        assert_eq!(again, p);
    }

    /// A window reaching exactly [`MAX_BINS`] bins fits; one past it does not (see the test above).
    const MAX_BINS_MS: u64 = util::MAX_BINS as u64;

    #[test]
    fn a_relay_rejects_malformed_and_misaligned_packets_and_merges_the_rest() {
        let mut leaf = UtilizationFilter::create("", Level::Leaf).unwrap();
        let (p1, _) = up(&mut leaf, &[&encode_one(&rank(0, 0, &[&[(7, 100)]]))]);
        let (p2, _) = up(&mut leaf, &[&encode_one(&rank(1, 1, &[&[(7, 30)], &[(0, 5)]]))]);
        let mut misaligned = p2.clone();
        misaligned.start_unix_ns += 7;
        let mut short = p2.clone();
        short.ranks.pop();
        let mut over = p1.clone();
        over.sums[0] = 251;
        let mut unordered = p2.clone();
        unordered.activities = vec![7, 0];
        let enc = |p: &UtilizationPacket| p.encode_to_vec();
        let inputs = [
            enc(&p1),
            enc(&misaligned),
            enc(&short),
            enc(&over),
            enc(&unordered),
            vec![0xff],
            enc(&p2),
        ];
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut relay = UtilizationFilter::create("", Level::Relay).unwrap();
        let (merged, mut rejects) = up(&mut relay, &inputs);
        rejects.sort();
        let not = "input is not a canopy.filters.v1.UtilizationPacket: ";
        assert_eq!(
            rejects,
            vec![
                (
                    1,
                    format!(
                        "input does not fit the merged packets: start_unix_ns {} is not a whole number of \
                         1000 us bins from the packet's start {T0}",
                        T0 + MS + 7
                    )
                ),
                (2, format!("{not}2 bins but 1 rank counts")),
                (
                    3,
                    format!("{not}bin 0: record 0 sums 251 over 1 ranks, more than 250")
                ),
                (4, format!("{not}activities are not sorted and distinct")),
                (
                    5,
                    format!("{not}failed to decode Protobuf message: invalid varint")
                ),
            ]
        );
        assert_eq!(merged.ranks, vec![1, 1, 1]);
        assert_eq!(records(&merged), vec![(0, 7, 100), (1, 7, 30), (2, 0, 5)]);
        assert_eq!(merged.profiles, 2);
        assert_eq!(merged.raw_bytes, p1.raw_bytes + p2.raw_bytes);
        // A packet of ranks without bins counts them and fits any window.
        let (empty, _) = up(
            &mut leaf,
            &[&encode_one(&RankProfile {
                rank: 9,
                ..Default::default()
            })],
        );
        assert_eq!((empty.counts.len(), empty.bin_us, empty.without), (0, 0, 1));
        let (with, rejects) = up(&mut relay, &[&enc(&empty), &enc(&p1)]);
        assert!(rejects.is_empty());
        assert_eq!((with.without, with.profiles, with.ranks.clone()), (1, 1, vec![1]));
    }

    #[test]
    fn the_root_averages_over_the_ranks_of_each_bin_and_names_the_activities() {
        let mut leaf = UtilizationFilter::create("", Level::Leaf).unwrap();
        let (p, _) = up(
            &mut leaf,
            &[
                &encode_one(&rank(0, 0, &[&[(7, 101), (9, 20)], &[(9, 250)]])),
                &encode_one(&rank(1, 0, &[&[(7, 100), (9, 20)]])),
            ],
        );
        let mut root = UtilizationFilter::create("", Level::Root).unwrap();
        root.names(&[(7, "solve"), (8, "unused")]);
        let bytes = root.finalize(3, 0, &p.encode_to_vec()).unwrap();
        let r = UtilizationResult::decode(bytes.as_slice()).unwrap();
        // Bin 0 over 2 ranks: 7 is 100.5 -> 101, 9 is 20 < 25 -> other; bin 1 over 1 rank: 9 is 250.
        assert_eq!(r.activities, vec![0, 7, 9]);
        assert_eq!(r.names, vec!["other", "solve", ""]);
        assert_eq!(r.counts, vec![2, 1]);
        assert_eq!(r.activity, vec![0, 1, 2]);
        assert_eq!(r.share, vec![20, 101, 250]);
        assert_eq!(r.ranks, vec![2, 1]);
        assert_eq!(
            (r.threshold, r.profiles, r.lost, r.start_unix_ns, r.bin_us),
            (25, 2, 2, T0, 1000)
        );
        assert_eq!(
            root.finalize(3, 0, &[0xff]).unwrap_err(),
            "round 3: the root's packet is not a canopy.filters.v1.UtilizationPacket: failed to decode \
             Protobuf message: invalid varint"
        );
        assert!(root.finalize(3, 1, &bytes).is_err());
        assert!(root.downstream(3, 0, &bytes, &mut Collect::default()).is_err());
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(UtilizationFilter::descriptors()).unwrap();
        let (pkg, name) = UtilizationFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
