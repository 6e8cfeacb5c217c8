//! The stats filter (ToM's StatsFilter): per event and metric, count, mean, standard deviation, min and max
//! with the ranks holding them and, when asked, quantiles from a DDSketch, merged up the tree in one phase.
//! By default each application of the tree is summarized apart: a row per (application, event, metric).

#![forbid(unsafe_code)]

mod quantiles;

use canopy_filter_common::decode::Step;
use canopy_filter_common::fold::Fold;
use canopy_filter_common::one_phase::OnePhase;
use canopy_filter_common::sketch::Spec;
use canopy_filter_common::{
    Params, Values, columns, columns_wire, decode, metrics, sketch_columns, stats_result_wire,
};
use canopy_filter_proto::v1::StatsColumns;
use canopy_filter_sdk::{Emit, Filter, Level, export_filter, one_phase};

/// One instance per stream per node. Each round is one phase; what it keeps between calls are buffers.
#[derive(Debug)]
pub struct StatsFilter {
    level: Level,
    values: Values,
    /// Whether rows are per (application, id, metric) (`by_app`, the default) or per (id, metric).
    by_app: bool,
    /// The quantiles asked for (increasing) and the sketch they are read from; `None` for none.
    quantiles: Option<(Vec<f64>, Spec)>,
    /// The leaf's events and counters of the round being summarized, kept between calls.
    buffers: canopy_filter_common::stream::Buffers,
    /// The leaf's summaries of the round, folded rank by rank.
    fold: Fold,
    /// The children's packets of the round being merged, decoded into buffers kept between rounds.
    inputs: Vec<StatsColumns>,
    /// The packet this node sends up, and its encoding.
    merged: StatsColumns,
    encoded: Vec<u8>,
    /// The root's packet being finalized, decoded into buffers kept between rounds.
    finalized: StatsColumns,
}

impl OnePhase for StatsFilter {
    type Packet = StatsColumns;

    fn level(&self) -> Level {
        self.level
    }

    fn packet(&mut self) -> (&StatsColumns, &mut Vec<u8>) {
        (&self.merged, &mut self.encoded)
    }

    fn encode(packet: &StatsColumns, into: &mut Vec<u8>) {
        columns_wire::encode(packet, into);
    }

    /// Leaf: summarizes its ranks' profiles into one packet.
    fn leaf(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let (fold, values) = (&mut self.fold, self.values);
        let raw_bytes = decode::each_profile(inputs, &mut self.buffers, out, |step| match step {
            Step::Start => fold.clear(),
            Step::Profile(p, buffers) => {
                metrics::extract_view(p, buffers, values, &mut fold.feed(p.app, p.rank));
            }
        });
        self.fold.to_columns(raw_bytes, &mut self.merged);
    }

    /// Relay and root: merges the children's packets, taken in their canonical order, in one pass.
    fn merge(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) {
        let spec = self.spec().copied();
        let by_app = self.by_app;
        let good = decode::packets_decoded_into(
            inputs,
            &mut self.inputs,
            "canopy.filters.v1.StatsColumns",
            out,
            columns_wire::decode_into,
            |c| check(c, by_app, spec.as_ref()),
        );
        let packets: Vec<&StatsColumns> = good.iter().map(|&(slot, _)| &self.inputs[slot]).collect();
        columns::merge_with(&packets, spec.as_ref(), &mut self.merged);
    }
}

impl StatsFilter {
    fn spec(&self) -> Option<&Spec> {
        self.quantiles.as_ref().map(|(_, spec)| spec)
    }
}

/// Whether a decoded packet is usable: its columns, their breakdown by application against the stream's, and
/// its sketches against the stream's spec.
fn check(c: &StatsColumns, by_app: bool, spec: Option<&Spec>) -> Result<(), String> {
    columns::check(c).map_err(|e| e.to_string())?;
    columns::check_breakdown(c, by_app).map_err(|e| e.to_string())?;
    sketch_columns::check(c, spec).map_err(|e| e.to_string())
}

impl Filter for StatsFilter {
    const NAME: &'static str = "stats";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.StatsResult";

    /// Params: `{"values": "round" | "cumulative", "by_app": true | false, "quantiles": true | [0.5, 0.9, 0.99],
    /// "relative_accuracy": 0.01, "max_bins": 2048}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let params = Params::parse(params, &quantiles::KNOWN)?;
        let quantiles = quantiles::parse(&params)?;
        let by_app = params.bool("by_app", true)?;
        Ok(StatsFilter {
            level,
            values: params.values()?,
            by_app,
            fold: match &quantiles {
                Some((_, spec)) => Fold::with_sketches(*spec),
                None => Fold::default(),
            }
            .by_app(by_app),
            quantiles,
            buffers: Default::default(),
            inputs: Vec::new(),
            merged: StatsColumns::default(),
            encoded: Vec::new(),
            finalized: StatsColumns::default(),
        })
    }

    canopy_filter_common::one_phase_calls!();

    /// The root's merged columns as the `StatsResult` stored, every `std` filled.
    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        one_phase(Self::NAME, phase)?;
        let bad = |e: String| {
            format!("round {round}: the root's packet is not a canopy.filters.v1.StatsColumns: {e}")
        };
        // The root finalizes the packet its own merge just encoded (a late packet from below aside): the bytes
        // the same, its columns are the ones still here, and reading them back would only make a copy of them.
        let own = self.level == Level::Root && packet == self.encoded.as_slice();
        if !own {
            columns_wire::decode_into(&mut self.finalized, packet).map_err(|e| bad(e.to_string()))?;
        }
        let merged = if own { &self.merged } else { &self.finalized };
        check(merged, self.by_app, self.spec()).map_err(bad)?;
        let quantiles = match &self.quantiles {
            Some((qs, spec)) => sketch_columns::quantiles(merged, spec, qs),
            None => Vec::new(),
        };
        let mut result = Vec::new();
        stats_result_wire::encode(merged, &quantiles, &mut result);
        Ok(result)
    }
}

export_filter!(StatsFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::Metric;
    use canopy_filter_proto::v1::StatsResult;
    use canopy_filter_test::{Collect, one_event_profile};
    use prost::Message;

    fn profile(rank: u32, incl: f64) -> Vec<u8> {
        one_event_profile(rank, incl)
    }

    #[test]
    fn params_errors() {
        assert_eq!(
            StatsFilter::create(r#"{"bins": 3}"#, Level::Leaf).unwrap_err(),
            "unknown parameter \"bins\" (known: values, by_app, quantiles, relative_accuracy, max_bins)"
        );
        assert_eq!(
            StatsFilter::create(r#"{"by_app": "yes"}"#, Level::Leaf).unwrap_err(),
            "by_app must be true or false, got \"yes\""
        );
        assert_eq!(
            StatsFilter::create(r#"{"by_app": 1}"#, Level::Relay).unwrap_err(),
            "by_app must be true or false, got 1"
        );
        assert_eq!(
            StatsFilter::create(r#"{"values": "all"}"#, Level::Leaf).unwrap_err(),
            "values must be one of \"round\", \"cumulative\", got \"all\""
        );
        assert!(StatsFilter::create("", Level::Root).is_ok());
    }

    #[test]
    fn a_rejected_input_is_reported_and_the_rest_merges() {
        let mut leaf = StatsFilter::create("{}", Level::Leaf).unwrap();
        let (a, b) = (profile(0, 2.0), profile(1, 4.0));
        let bad = vec![0x0a, 0x05, 0x01];
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&a, &bad, &b], &mut out).unwrap();
        assert_eq!(out.rejects.len(), 1);
        assert_eq!(out.rejects[0].0, 1);
        let packet = StatsColumns::decode(out.up[0].1.as_slice()).unwrap();
        assert_eq!(packet.raw_bytes, (a.len() + b.len()) as u64);
        let incl = packet
            .metric
            .iter()
            .position(|m| *m == Metric::Inclusive as i32)
            .unwrap();
        assert_eq!((packet.count[incl], packet.mean[incl]), (2, 3.0));

        // A relay rejects a bad child packet and merges the good one.
        let mut relay = StatsFilter::create("{}", Level::Relay).unwrap();
        let mut out2 = Collect::default();
        relay.upstream(0, 0, &[&bad, &out.up[0].1], &mut out2).unwrap();
        assert_eq!(out2.rejects.len(), 1);
        assert_eq!(out2.rejects[0].0, 0);
        assert_eq!(StatsColumns::decode(out2.up[0].1.as_slice()).unwrap(), packet);
    }

    #[test]
    fn a_relay_refuses_a_hostile_sketch_and_a_sketch_it_did_not_ask_for() {
        let mut leaf = StatsFilter::create(r#"{"quantiles": true}"#, Level::Leaf).unwrap();
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&profile(0, 2.0), &profile(1, 4.0)], &mut out)
            .unwrap();
        let good = StatsColumns::decode(out.up[0].1.as_slice()).unwrap();
        assert_eq!(good.sketch_accuracy, 0.01);
        let mut wide = good.clone();
        wide.sketch_pos_bins[0] = u32::MAX;
        let wide = wide.encode_to_vec();

        let mut relay = StatsFilter::create(r#"{"quantiles": true}"#, Level::Relay).unwrap();
        let mut up = Collect::default();
        relay.upstream(0, 0, &[&wide, &out.up[0].1], &mut up).unwrap();
        assert_eq!(up.rejects.len(), 1);
        assert!(
            up.rejects[0]
                .1
                .contains("row 0: a sketch store of 4294967295 bins exceeds the bound of 2048"),
            "{}",
            up.rejects[0].1
        );
        assert_eq!(StatsColumns::decode(up.up[0].1.as_slice()).unwrap(), good);

        let mut plain = StatsFilter::create("{}", Level::Relay).unwrap();
        let mut up = Collect::default();
        plain.upstream(0, 0, &[&out.up[0].1], &mut up).unwrap();
        assert!(
            up.rejects[0].1.contains("the stream asks for no quantiles"),
            "{}",
            up.rejects[0].1
        );
    }

    /// One rank of application `app` with one event of inclusive time `incl`.
    fn profile_of(app: &str, rank: u32, incl: f64) -> Vec<u8> {
        let mut batch =
            canopy_wire::v1::ProfileBatch::decode(one_event_profile(rank, incl).as_slice()).unwrap();
        batch.profiles[0].app = app.into();
        batch.encode_to_vec()
    }

    #[test]
    fn rows_are_per_application_unless_asked_otherwise() {
        let inputs = [
            profile_of("sim", 0, 2.0),
            profile_of("ana", 0, 9.0),
            profile_of("sim", 1, 4.0),
        ];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let incl = |params: &str| {
            let mut leaf = StatsFilter::create(params, Level::Leaf).unwrap();
            let mut root = StatsFilter::create(params, Level::Root).unwrap();
            let mut out = Collect::default();
            leaf.upstream(0, 0, &refs, &mut out).unwrap();
            let result = StatsResult::decode(root.finalize(0, 0, &out.up[0].1).unwrap().as_slice()).unwrap();
            result
                .stats
                .into_iter()
                .filter(|s| s.metric == Metric::Inclusive as i32)
                .map(|s| {
                    let sum = s.summary.unwrap();
                    (s.app, sum.count, sum.mean)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            incl("{}"),
            vec![("ana".to_string(), 1, 9.0), ("sim".to_string(), 2, 3.0)]
        );
        assert_eq!(incl(r#"{"by_app": false}"#), vec![(String::new(), 3, 5.0)]);
    }

    #[test]
    fn a_relay_rejects_application_columns_that_do_not_fit() {
        let inputs = [profile_of("sim", 0, 2.0), profile_of("ana", 0, 9.0)];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let leaf_packet = |params: &str| {
            let mut leaf = StatsFilter::create(params, Level::Leaf).unwrap();
            let mut out = Collect::default();
            leaf.upstream(0, 0, &refs, &mut out).unwrap();
            StatsColumns::decode(out.up[0].1.as_slice()).unwrap()
        };
        let good = leaf_packet("{}");
        assert_eq!(good.apps, vec!["ana".to_string(), "sim".to_string()]);
        let flat = leaf_packet(r#"{"by_app": false}"#);
        assert!(flat.app.is_empty());
        // A relay given a bad packet and a good one rejects the bad one alone, saying why.
        let rejected = |params: &str, bad: &StatsColumns, fitting: &StatsColumns| {
            let mut relay = StatsFilter::create(params, Level::Relay).unwrap();
            let mut up = Collect::default();
            relay
                .upstream(0, 0, &[&bad.encode_to_vec(), &fitting.encode_to_vec()], &mut up)
                .unwrap();
            assert_eq!(up.rejects.len(), 1, "{:?}", up.rejects);
            assert_eq!(up.rejects[0].0, 0);
            assert_eq!(&StatsColumns::decode(up.up[0].1.as_slice()).unwrap(), fitting);
            up.rejects[0].1.clone()
        };
        let mut outside = good.clone();
        outside.app[0] = 7;
        let why = rejected("{}", &outside, &good);
        assert!(
            why.contains("row 0: application index 7 is outside the table of 2"),
            "{why}"
        );
        let mut unsorted = good.clone();
        let rows = unsorted.id.len();
        unsorted.app = [vec![1; rows / 2], vec![0; rows - rows / 2]].concat();
        let why = rejected("{}", &unsorted, &good);
        assert!(why.contains("does not follow the previous row's"), "{why}");
        let why = rejected("{}", &flat, &good);
        assert!(why.contains("the packet has rows and no app column"), "{why}");
        let why = rejected(r#"{"by_app": false}"#, &good, &flat);
        assert!(
            why.contains("(by_app: false), but the packet has an app column"),
            "{why}"
        );
    }

    #[test]
    fn finalize_reads_the_quantiles() {
        let mut root = StatsFilter::create(r#"{"quantiles": [0, 0.5, 1]}"#, Level::Root).unwrap();
        let mut leaf = StatsFilter::create(r#"{"quantiles": [0, 0.5, 1]}"#, Level::Leaf).unwrap();
        let inputs: Vec<Vec<u8>> = (0..5).map(|r| profile(r, f64::from(r + 1) * 10.0)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = Collect::default();
        leaf.upstream(0, 0, &refs, &mut out).unwrap();
        let result = StatsResult::decode(root.finalize(0, 0, &out.up[0].1).unwrap().as_slice()).unwrap();
        let incl = result
            .stats
            .iter()
            .find(|s| s.metric == Metric::Inclusive as i32)
            .unwrap();
        let got: Vec<(f64, f64)> = incl.quantiles.iter().map(|q| (q.q, q.value)).collect();
        assert_eq!(got.len(), 3);
        for ((q, v), want) in got.into_iter().zip([10.0, 30.0, 50.0]) {
            assert!((v - want).abs() <= 0.01 * want, "q {q}: {v} vs {want}");
        }
        // The extremes' bins read within 1% of them, and the result keeps them between the exact min and max.
        assert!(incl.quantiles[0].value >= 10.0 && incl.quantiles[2].value <= 50.0);
    }

    #[test]
    fn all_inputs_rejected_still_emits() {
        let mut leaf = StatsFilter::create("{}", Level::Leaf).unwrap();
        let mut out = Collect::default();
        leaf.upstream(3, 0, &[&[0xff, 0xff]], &mut out).unwrap();
        assert_eq!(out.rejects.len(), 1);
        assert_eq!(out.up.len(), 1);
        assert_eq!(
            StatsColumns::decode(out.up[0].1.as_slice()).unwrap(),
            StatsColumns::default()
        );
        // And with no inputs at all (a leaf without ranks).
        let mut out = Collect::default();
        leaf.upstream(4, 0, &[], &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
    }

    #[test]
    fn finalize_fills_std() {
        let mut root = StatsFilter::create("{}", Level::Root).unwrap();
        let mut leaf = StatsFilter::create("{}", Level::Leaf).unwrap();
        let (a, b) = (profile(0, 2.0), profile(1, 4.0));
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&a, &b], &mut out).unwrap();
        let result = StatsResult::decode(root.finalize(0, 0, &out.up[0].1).unwrap().as_slice()).unwrap();
        let incl = result
            .stats
            .iter()
            .find(|s| s.metric == Metric::Inclusive as i32)
            .unwrap();
        assert_eq!(incl.summary.as_ref().unwrap().std, 1.0);
        assert!(root.finalize(0, 1, &out.up[0].1).is_err());
    }

    #[test]
    fn the_root_finalizes_its_own_merge_as_it_finalizes_the_same_bytes_read_back() {
        let mut leaf = StatsFilter::create("{}", Level::Leaf).unwrap();
        let packets: Vec<Vec<u8>> = (0..3)
            .map(|round| {
                let mut out = Collect::default();
                let ranks = [profile(0, 2.0 + round as f64), profile(1, 7.5 * round as f64)];
                leaf.upstream(round, 0, &[&ranks[0], &ranks[1]], &mut out)
                    .unwrap();
                out.up[0].1.clone()
            })
            .collect();
        let mut root = StatsFilter::create("{}", Level::Root).unwrap();
        let merge = |root: &mut StatsFilter, round: u64, inputs: &[&[u8]]| {
            let mut out = Collect::default();
            root.upstream(round, 0, inputs, &mut out).unwrap();
            out.up[0].1.clone()
        };
        let r0 = merge(&mut root, 0, &[&packets[0], &packets[1]]);
        // Round 1 merged before round 0 is finalized: round 0's bytes are no longer the last merge's.
        let r1 = merge(&mut root, 1, &[&packets[1], &packets[2]]);
        let own = root.finalize(1, 0, &r1).unwrap();
        let earlier = root.finalize(0, 0, &r0).unwrap();
        let mut fresh = StatsFilter::create("{}", Level::Root).unwrap();
        assert_eq!(own, fresh.finalize(1, 0, &r1).unwrap());
        assert_eq!(earlier, fresh.finalize(0, 0, &r0).unwrap());
        assert_ne!(own, earlier);
        assert!(root.finalize(1, 0, &r1[..r1.len() - 1]).is_err());
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(StatsFilter::descriptors()).unwrap();
        let (pkg, name) = StatsFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
