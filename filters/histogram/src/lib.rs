//! The histogram filter (ToM's HistFilter): per event and metric, the summary statistics and a histogram over
//! ranks, built in three phases so that the leaves bin their own ranks' values against the global range.
//!
//! Phase 0 (up): each leaf sends per-(id, metric) summaries, which carry min and max, and buffers its ranks'
//! values for the round; relays merge. The root merges, keeps the round's summaries and sends the global ranges
//! down as phase 1; relays pass it on. Phase 2 (up): each leaf bins its buffered values against those ranges
//! and sends the histograms; relays and the root add the counts; finalize stores a `HistogramResult`.
//! Rounds pipeline: every phase of every round is keyed by its round number. The scheme's skeleton, shared
//! with classify, is [`canopy_filter_common::three_phase`].
//!
//! Broken down by application (`by_app`, the default, as the stats filter), every summary, range and histogram
//! is per (application, id, metric): each application's ranks are binned between that application's own min
//! and max, so a small analysis is not flattened into one bin by a simulation's range.

#![forbid(unsafe_code)]

use canopy_filter_common::decode::Step;
use canopy_filter_common::fold::{Fold, RankAt};
use canopy_filter_common::histogram::{self, HistMap, Samples};
use canopy_filter_common::metrics::Key;
use canopy_filter_common::rounds::Rounds;
use canopy_filter_common::stream::Buffers;
use canopy_filter_common::three_phase::{self, ThreePhase};
use canopy_filter_common::{Params, Values, columns, columns_wire, decode, metrics};
use canopy_filter_proto::v1::{HistogramPacket, HistogramResult, StatsColumns};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use prost::Message;

/// The default number of bins, as ToM's Fig. 6.
pub const DEFAULT_BINS: u32 = 10;
/// The most bins a stream may ask for: a histogram per event and metric must stay small next to the profiles.
pub const MAX_BINS: u32 = 10_000;

const PACKET: &str = "canopy.filters.v1.HistogramPacket";
/// `HistogramPacket.summaries`' field number.
const SUMMARIES_FIELD: u32 = 5;

/// How many binned rounds' sample buffers a leaf keeps for reuse: enough for the rounds a window keeps in
/// flight, so that a leaf in a steady state takes no new memory for its values.
const SPARE_SAMPLES: usize = 8;

/// A leaf's values for a round, kept from phase 0 until the ranges arrive.
#[derive(Debug, Default)]
pub struct Buffer {
    samples: Samples,
    raw_bytes: u64,
}

/// One instance per stream per node.
#[derive(Debug)]
pub struct HistogramFilter {
    level: Level,
    values: Values,
    bins: u32,
    /// Whether rows are per (application, id, metric) (`by_app`, the default) or per (id, metric).
    by_app: bool,
    /// Leaf: the values of each open round.
    buffers: Rounds<Buffer>,
    /// Leaf: the profiles of the round being read, and their summaries, kept between calls.
    views: Buffers,
    fold: Fold,
    /// Leaf: samples of rounds already binned, their buffers kept for the next rounds (at most
    /// [`SPARE_SAMPLES`]).
    spare: Vec<Samples>,
    /// Root: the merged summaries of each round between phase 0 and phase 2.
    stats: Rounds<StatsColumns>,
}

/// Checks a phase-0 packet: it carries summaries (empty ones when its ranks reported nothing), and they are
/// usable columns broken down by application as the stream asks (`by_app`).
fn summaries_of(p: &HistogramPacket, by_app: bool) -> Result<(), String> {
    let c = p.summaries.as_ref().ok_or("a phase 0 packet without summaries")?;
    columns::check(c).map_err(|e| e.to_string())?;
    columns::check_breakdown(c, by_app).map_err(|e| e.to_string())
}

/// `p`'s bytes, the same as prost's (fields in tag order), with its summaries written by the packed-column
/// writer.
fn encode_packet(p: &HistogramPacket) -> Vec<u8> {
    use prost::encoding::{message, uint64};
    let mut out = Vec::new();
    message::encode_repeated(2, &p.ranges, &mut out);
    message::encode_repeated(3, &p.histograms, &mut out);
    if p.raw_bytes != 0 {
        uint64::encode(4, &p.raw_bytes, &mut out);
    }
    if let Some(c) = &p.summaries {
        columns_wire::encode_field(SUMMARIES_FIELD, c, &mut out);
    }
    out
}

/// A rank's values folded into the round's summaries and kept for binning.
struct FoldAndKeep<'a> {
    fold: &'a mut Fold,
    at: RankAt,
    samples: &'a mut Samples,
    app: &'a str,
}

impl metrics::Sink for FoldAndKeep<'_> {
    /// Inlined wherever the reader hands over a value: it runs for every value of every rank.
    #[inline(always)]
    fn value(&mut self, key: Key, v: f64) {
        let row = self.fold.add(&mut self.at, key, v);
        self.samples.add(row, self.app, key, v);
    }
}

impl ThreePhase for HistogramFilter {
    const PACKET: &'static str = PACKET;
    type Packet = HistogramPacket;
    type Buffer = Buffer;
    type Summaries = StatsColumns;
    type Counts = HistogramPacket;

    fn level(&self) -> Level {
        self.level
    }

    fn buffers(&mut self) -> &mut Rounds<Buffer> {
        &mut self.buffers
    }

    fn summaries(&mut self) -> &mut Rounds<StatsColumns> {
        &mut self.stats
    }

    /// Summaries up; the values buffered.
    fn leaf_summaries(
        &mut self,
        _round: u64,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> (HistogramPacket, Buffer) {
        let mut samples = self.spare.pop().unwrap_or_default();
        let (fold, values, by_app) = (&mut self.fold, self.values, self.by_app);
        let raw_bytes = decode::each_profile(inputs, &mut self.views, out, |step| match step {
            Step::Start => {
                fold.clear();
                samples.clear();
            }
            Step::Profile(p, views) => {
                let at = fold.rank(p.app, p.rank);
                let app = if by_app { p.app } else { "" };
                let mut keep = FoldAndKeep {
                    fold: &mut *fold,
                    at,
                    samples: &mut samples,
                    app,
                };
                metrics::extract_view(p, views, values, &mut keep);
            }
        });
        let mut summaries = StatsColumns::default();
        self.fold.to_columns(0, &mut summaries);
        let packet = HistogramPacket {
            summaries: Some(summaries),
            ..Default::default()
        };
        (packet, Buffer { samples, raw_bytes })
    }

    fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> StatsColumns {
        let by_app = self.by_app;
        // The summaries' columns read by the packed-column reader, as the stats filter reads its packets.
        let mut packets: Vec<HistogramPacket> = Vec::new();
        let good = decode::packets_decoded_into(
            inputs,
            &mut packets,
            PACKET,
            out,
            |p, bytes| {
                columns_wire::decode_with_columns(p, bytes, SUMMARIES_FIELD, |p| {
                    p.summaries.get_or_insert_default()
                })
            },
            |p: &HistogramPacket| summaries_of(p, by_app),
        );
        let summaries: Vec<&StatsColumns> = good
            .iter()
            .filter_map(|&(slot, _)| packets[slot].summaries.as_ref())
            .collect();
        let mut merged = StatsColumns::default();
        columns::merge(&summaries, &mut merged);
        merged
    }

    fn summaries_packet(&self, merged: &StatsColumns) -> HistogramPacket {
        HistogramPacket {
            summaries: Some(merged.clone()),
            ..Default::default()
        }
    }

    fn ranges_packet(&self, merged: &StatsColumns) -> HistogramPacket {
        HistogramPacket {
            ranges: histogram::ranges_of_columns(merged),
            ..Default::default()
        }
    }

    fn bin(&mut self, buffer: Buffer, ranges: HistogramPacket) -> Result<HistogramPacket, String> {
        let histograms = buffer.samples.bin(&ranges.ranges, self.bins as usize);
        if self.spare.len() < SPARE_SAMPLES {
            self.spare.push(buffer.samples);
        }
        Ok(HistogramPacket {
            histograms,
            raw_bytes: buffer.raw_bytes,
            ..Default::default()
        })
    }

    /// The children's histograms added up.
    fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> HistogramPacket {
        let bins = self.bins as usize;
        let by_app = self.by_app;
        let packets: Vec<HistogramPacket> = decode::packets(inputs, PACKET, out, |p: &HistogramPacket| {
            HistMap::check(&p.histograms, bins)?;
            match p.histograms.iter().find(|h| !by_app && !h.app.is_empty()) {
                Some(h) => Err(format!(
                    "histogram of event {:016x} names application {:?}, but the stream does not break rows down \
                     by application (by_app: false)",
                    h.id, h.app
                )),
                None => Ok(()),
            }
        });
        let mut hists = HistMap::new();
        let mut raw_bytes = 0u64;
        for p in &packets {
            hists.merge(&p.histograms);
            raw_bytes = raw_bytes.saturating_add(p.raw_bytes);
        }
        HistogramPacket {
            histograms: hists.to_vec(),
            raw_bytes,
            ..Default::default()
        }
    }

    fn counts_packet(&self, counts: HistogramPacket) -> HistogramPacket {
        counts
    }

    fn root_packet(&self, mut counts: HistogramPacket, merged: StatsColumns) -> HistogramPacket {
        counts.summaries = Some(merged);
        counts
    }

    fn encode_packet(&self, packet: &HistogramPacket) -> Vec<u8> {
        encode_packet(packet)
    }

    fn result(&self, packet: HistogramPacket) -> Vec<u8> {
        let result = HistogramResult {
            // The root's own packet carries the summaries; a late child's packet carries none that count.
            stats: packet
                .summaries
                .as_ref()
                .filter(|c| columns::check(c).is_ok())
                .map(columns::to_stats)
                .unwrap_or_default(),
            histograms: packet.histograms,
            raw_bytes: packet.raw_bytes,
            bins: self.bins,
        };
        result.encode_to_vec()
    }
}

impl Filter for HistogramFilter {
    const NAME: &'static str = "histogram";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.HistogramResult";
    const PHASES: u32 = three_phase::PHASES;

    /// Params: `{"bins": 1..=10000 (10), "values": "round" | "cumulative", "by_app": true | false}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let params = Params::parse(params, &["bins", "values", "by_app"])?;
        let by_app = params.bool("by_app", true)?;
        Ok(HistogramFilter {
            level,
            values: params.values()?,
            bins: params.u32_between("bins", DEFAULT_BINS, 1, MAX_BINS)?,
            by_app,
            buffers: Rounds::new(),
            views: Buffers::default(),
            fold: Fold::default().by_app(by_app),
            spare: Vec::new(),
            stats: Rounds::new(),
        })
    }

    canopy_filter_common::three_phase_calls!();
}

export_filter!(HistogramFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::{Histogram, Metric};
    use canopy_filter_test::{Collect, one_event_profile};

    fn profile(rank: u32, incl: f64) -> Vec<u8> {
        one_event_profile(rank, incl)
    }

    fn inclusive(h: &[Histogram]) -> Vec<u64> {
        h.iter()
            .find(|h| h.metric == Metric::Inclusive as i32)
            .unwrap()
            .counts
            .clone()
    }

    proptest::proptest! {
        /// The packet writer writes prost's bytes, whichever fields a packet carries.
        #[test]
        fn packets_are_written_as_prost_writes_them(
            rows in proptest::collection::vec((proptest::prelude::any::<u64>(), 0i32..5, 0u64..5000, proptest::prelude::any::<f64>()), 0..20),
            apps in proptest::collection::vec("[a-z]{1,4}", 0..3),
            ranges in 0usize..3,
            counts in proptest::collection::vec(0u64..300, 0..12),
            raw_bytes in proptest::prelude::any::<u64>(),
            with_summaries in proptest::prelude::any::<bool>(),
        ) {
            let summaries = StatsColumns {
                id: rows.iter().map(|r| r.0).collect(),
                metric: rows.iter().map(|r| r.1).collect(),
                count: rows.iter().map(|r| r.2).collect(),
                mean: rows.iter().map(|r| r.3).collect(),
                min_rank: rows.iter().map(|r| r.2 as u32).collect(),
                apps,
                raw_bytes,
                ..StatsColumns::default()
            };
            let packet = HistogramPacket {
                summaries: with_summaries.then_some(summaries),
                ranges: (0..ranges)
                    .map(|i| canopy_filter_proto::v1::Range { id: i as u64, metric: 2, lo: -1.0, hi: i as f64, app: "a".into() })
                    .collect(),
                histograms: vec![Histogram { id: 9, metric: 3, counts, ..Histogram::default() }],
                raw_bytes,
            };
            proptest::prop_assert_eq!(encode_packet(&packet), packet.encode_to_vec());
            proptest::prop_assert_eq!(
                encode_packet(&HistogramPacket::default()),
                HistogramPacket::default().encode_to_vec()
            );
        }
    }

    #[test]
    fn params_errors() {
        let err = |p: &str| HistogramFilter::create(p, Level::Leaf).unwrap_err();
        assert_eq!(err(r#"{"bins": 0}"#), "bins must be between 1 and 10000, got 0");
        assert_eq!(
            err(r#"{"bins": 10001}"#),
            "bins must be between 1 and 10000, got 10001"
        );
        assert_eq!(
            err(r#"{"bin": 4}"#),
            "unknown parameter \"bin\" (known: bins, values, by_app)"
        );
        assert_eq!(
            err(r#"{"values": "total"}"#),
            "values must be one of \"round\", \"cumulative\", got \"total\""
        );
        assert_eq!(HistogramFilter::create("", Level::Leaf).unwrap().bins, 10);
    }

    /// Drives a root over two leaves by hand: both rounds' phase 0 first, then round `first_down` through
    /// phases 1 and 2, then the other.
    fn two_rounds(first_down: u64) -> Vec<HistogramResult> {
        let mut leaves = [
            HistogramFilter::create(r#"{"bins": 2}"#, Level::Leaf).unwrap(),
            HistogramFilter::create(r#"{"bins": 2}"#, Level::Leaf).unwrap(),
        ];
        let mut root = HistogramFilter::create(r#"{"bins": 2}"#, Level::Root).unwrap();
        // Inclusive times (leaf 0 | leaf 1), 2 bins. Round 0: 0, 1 | 10, counts 2, 1; round 1: 5 | 6, 7, counts 1, 2.
        let data = [
            [vec![profile(0, 0.0), profile(1, 1.0)], vec![profile(2, 10.0)]],
            [vec![profile(0, 5.0)], vec![profile(1, 6.0), profile(2, 7.0)]],
        ];
        // Phase 0 of both rounds at both leaves before any phase 1: the leaves hold two buffers.
        let mut up0: [Vec<Vec<u8>>; 2] = Default::default();
        for round in 0..2 {
            for (leaf, f) in leaves.iter_mut().enumerate() {
                let inputs: Vec<&[u8]> = data[round][leaf].iter().map(Vec::as_slice).collect();
                let mut out = Collect::default();
                f.upstream(round as u64, 0, &inputs, &mut out).unwrap();
                up0[round].push(out.up.remove(0).1);
            }
        }
        let order = if first_down == 0 { [0usize, 1] } else { [1, 0] };
        // The root sees round `order[0]`'s phase 0 first, and so on.
        let mut down = [Vec::new(), Vec::new()];
        for &round in &order {
            let inputs: Vec<&[u8]> = up0[round].iter().map(Vec::as_slice).collect();
            let mut out = Collect::default();
            root.upstream(round as u64, 0, &inputs, &mut out).unwrap();
            assert!(out.up.is_empty());
            assert_eq!(out.down[0].0, 1);
            down[round] = out.down.remove(0).1;
        }
        let mut results = vec![HistogramResult::default(), HistogramResult::default()];
        for &round in &order {
            let mut up2 = Vec::new();
            for f in &mut leaves {
                let mut out = Collect::default();
                f.downstream(round as u64, 1, &down[round], &mut out).unwrap();
                assert_eq!(out.up[0].0, 2);
                up2.push(out.up.remove(0).1);
            }
            let inputs: Vec<&[u8]> = up2.iter().map(Vec::as_slice).collect();
            let mut out = Collect::default();
            root.upstream(round as u64, 2, &inputs, &mut out).unwrap();
            let bytes = root.finalize(round as u64, 2, &out.up[0].1).unwrap();
            results[round] = HistogramResult::decode(bytes.as_slice()).unwrap();
        }
        assert!(
            leaves.iter().all(|l| l.buffers.is_empty()) && root.stats.is_empty(),
            "state dropped"
        );
        results
    }

    #[test]
    fn pipelined_rounds_keep_their_own_values() {
        for first in [0, 1] {
            let r = two_rounds(first);
            assert_eq!(inclusive(&r[0].histograms), vec![2, 1]);
            assert_eq!(inclusive(&r[1].histograms), vec![1, 2]);
            let h1 = r[1]
                .histograms
                .iter()
                .find(|h| h.metric == Metric::Inclusive as i32)
                .unwrap();
            assert_eq!((h1.lo, h1.hi), (5.0, 7.0));
            assert_eq!(r[0].bins, 2);
            let s = r[1]
                .stats
                .iter()
                .find(|s| s.metric == Metric::Inclusive as i32)
                .unwrap();
            let s = s.summary.as_ref().unwrap();
            assert_eq!((s.count, s.mean, s.min, s.max), (3, 6.0, 5.0, 7.0));
            assert!(s.std > 0.8 && s.std < 0.9, "{}", s.std);
        }
    }

    #[test]
    fn finalize_leaves_out_summaries_that_are_not_usable_columns() {
        // A late child's phase-2 packet reaches finalize as it is; broken columns in it must not panic the root.
        let mut root = HistogramFilter::create("", Level::Root).unwrap();
        let broken = HistogramPacket {
            summaries: Some(StatsColumns {
                id: vec![1, 2],
                count: vec![1],
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = root.finalize(3, 2, &broken.encode_to_vec()).unwrap();
        let result = HistogramResult::decode(bytes.as_slice()).unwrap();
        assert!(result.stats.is_empty());
    }

    #[test]
    fn a_phase_0_packet_without_summaries_is_rejected() {
        let mut relay = HistogramFilter::create("", Level::Relay).unwrap();
        let empty = HistogramPacket::default().encode_to_vec();
        let mut out = Collect::default();
        relay.upstream(1, 0, &[&empty], &mut out).unwrap();
        assert_eq!(
            out.rejects,
            vec![(
                0,
                "input is not a canopy.filters.v1.HistogramPacket: a phase 0 packet without summaries"
                    .to_string()
            )]
        );
    }

    #[test]
    fn a_phase_0_packet_broken_down_otherwise_than_the_stream_asks_is_rejected() {
        for by_app in [false, true] {
            let params = format!(r#"{{"by_app": {by_app}}}"#);
            let mut leaf = HistogramFilter::create(&params, Level::Leaf).unwrap();
            let mut out = Collect::default();
            leaf.upstream(1, 0, &[&one_event_profile(0, 2.0)], &mut out)
                .unwrap();
            let mut packet = HistogramPacket::decode(out.up[0].1.as_slice()).unwrap();
            let summaries = packet.summaries.as_mut().unwrap();
            assert_eq!(
                summaries.app.is_empty(),
                !by_app,
                "a leaf's phase 0 is broken down as asked"
            );
            summaries.app = if by_app {
                Vec::new()
            } else {
                vec![0; summaries.id.len()]
            };
            let mut relay = HistogramFilter::create(&params, Level::Relay).unwrap();
            let mut up = Collect::default();
            relay
                .upstream(1, 0, &[&packet.encode_to_vec(), &out.up[0].1], &mut up)
                .unwrap();
            assert_eq!(up.rejects.len(), 1);
            let want = if by_app {
                "the stream breaks rows down by application (by_app), but the packet has rows and no app column"
            } else {
                "does not break rows down by application"
            };
            assert!(up.rejects[0].1.contains(want), "{}", up.rejects[0].1);
        }
    }

    #[test]
    fn each_application_is_binned_between_its_own_min_and_max() {
        // A simulation's ranks spend 100 to 200, an analysis's 1 to 3: over every application the analysis would
        // fall into one bin.
        let mut leaf = HistogramFilter::create(r#"{"bins": 2}"#, Level::Leaf).unwrap();
        let mut root = HistogramFilter::create(r#"{"bins": 2}"#, Level::Root).unwrap();
        let mut ranks = Vec::new();
        for (rank, (app, v)) in [
            ("sim", 100.0),
            ("sim", 200.0),
            ("analysis", 1.0),
            ("analysis", 3.0),
            ("analysis", 2.9),
        ]
        .into_iter()
        .enumerate()
        {
            ranks.push(canopy_filter_test::one_event_profile_in(app, rank as u32, v));
        }
        let inputs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
        let mut up0 = Collect::default();
        leaf.upstream(0, 0, &inputs, &mut up0).unwrap();
        let mut down = Collect::default();
        root.upstream(0, 0, &[&up0.up[0].1], &mut down).unwrap();
        let mut up2 = Collect::default();
        leaf.downstream(0, 1, &down.down[0].1, &mut up2).unwrap();
        let mut last = Collect::default();
        root.upstream(0, 2, &[&up2.up[0].1], &mut last).unwrap();
        let result = HistogramResult::decode(root.finalize(0, 2, &last.up[0].1).unwrap().as_slice()).unwrap();
        let inclusive: Vec<(String, f64, f64, Vec<u64>)> = result
            .histograms
            .iter()
            .filter(|h| h.metric == Metric::Inclusive as i32)
            .map(|h| (h.app.clone(), h.lo, h.hi, h.counts.clone()))
            .collect();
        assert_eq!(
            inclusive,
            [
                ("analysis".into(), 1.0, 3.0, vec![1, 2]),
                ("sim".into(), 100.0, 200.0, vec![1, 1]),
            ]
        );
        let apps: Vec<&str> = result
            .stats
            .iter()
            .filter(|s| s.metric == Metric::Inclusive as i32)
            .map(|s| s.app.as_str())
            .collect();
        assert_eq!(apps, ["analysis", "sim"]);
    }

    #[test]
    fn a_rejected_input_is_reported_and_the_rest_merges() {
        let mut leaf = HistogramFilter::create(r#"{"bins": 4}"#, Level::Leaf).unwrap();
        let (a, b) = (profile(0, 1.0), profile(1, 3.0));
        let bad = vec![0x0a, 0x05, 0x01];
        let mut out = Collect::default();
        leaf.upstream(7, 0, &[&a, &bad, &b], &mut out).unwrap();
        assert_eq!(out.rejects.len(), 1);
        assert_eq!(out.rejects[0].0, 1);
        let p0 = HistogramPacket::decode(out.up[0].1.as_slice()).unwrap();
        let c = p0.summaries.as_ref().unwrap();
        let incl = c
            .metric
            .iter()
            .position(|m| *m == Metric::Inclusive as i32)
            .unwrap();
        assert_eq!((c.count[incl], c.min[incl], c.max[incl]), (2, 1.0, 3.0));

        // A relay rejects an undecodable packet in phase 0 and one with the wrong number of bins in phase 2.
        let mut relay = HistogramFilter::create(r#"{"bins": 4}"#, Level::Relay).unwrap();
        let mut out0 = Collect::default();
        relay.upstream(7, 0, &[&out.up[0].1, &bad], &mut out0).unwrap();
        assert_eq!(out0.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(HistogramPacket::decode(out0.up[0].1.as_slice()).unwrap(), p0);

        let ranges = HistogramPacket {
            ranges: histogram::ranges_of_columns(p0.summaries.as_ref().unwrap()),
            ..Default::default()
        };
        let mut out1 = Collect::default();
        leaf.downstream(7, 1, &ranges.encode_to_vec(), &mut out1).unwrap();
        let good = out1.up[0].1.clone();
        let wrong = HistogramPacket {
            histograms: vec![Histogram {
                id: 1,
                metric: 2,
                lo: 0.0,
                hi: 1.0,
                counts: vec![1, 2],
                app: String::new(),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let mut out2 = Collect::default();
        relay.upstream(7, 2, &[&wrong, &good], &mut out2).unwrap();
        assert_eq!(out2.rejects.len(), 1);
        assert_eq!(out2.rejects[0].0, 0);
        assert!(
            out2.rejects[0].1.contains("has 2 bins, expected 4"),
            "{}",
            out2.rejects[0].1
        );
        let p2 = HistogramPacket::decode(out2.up[0].1.as_slice()).unwrap();
        assert_eq!(inclusive(&p2.histograms), vec![1, 0, 0, 1]);
        assert_eq!(p2.raw_bytes, (a.len() + b.len()) as u64);
    }

    #[test]
    fn all_rejected_still_answers_every_phase() {
        let mut leaf = HistogramFilter::create("{}", Level::Leaf).unwrap();
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&[0xff, 0xff]], &mut out).unwrap();
        assert_eq!((out.rejects.len(), out.up.len()), (1, 1));
        let mut out = Collect::default();
        leaf.downstream(0, 1, &[], &mut out).unwrap();
        assert_eq!(
            out.up.len(),
            1,
            "a leaf that had a round answers phase 1 even with nothing to bin"
        );
    }

    #[test]
    fn phase_1_for_an_unknown_round_emits_nothing() {
        let mut leaf = HistogramFilter::create("{}", Level::Leaf).unwrap();
        let mut out = Collect::default();
        leaf.downstream(42, 1, &[], &mut out).unwrap();
        assert!(out.up.is_empty() && out.down.is_empty());
    }

    #[test]
    fn relays_pass_phase_1_down_unchanged() {
        let mut relay = HistogramFilter::create("{}", Level::Relay).unwrap();
        let mut out = Collect::default();
        relay.downstream(3, 1, b"\x01\x02", &mut out).unwrap();
        assert_eq!(out.down, vec![(1, b"\x01\x02".to_vec())]);
        assert!(relay.downstream(3, 0, b"", &mut out).is_err());
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(HistogramFilter::descriptors()).unwrap();
        let (pkg, name) = HistogramFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
