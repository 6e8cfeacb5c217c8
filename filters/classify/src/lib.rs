//! The classify filter (ToM's ClassFilter): ranks are grouped into functional classes by a hash of the event
//! names they report, and each class gets its members (as rank ranges), per-event summaries and histograms.
//!
//! The class id of a rank is the xxh3-64 ([`canopy_wire::event_id`]) of its selected event names, sorted,
//! deduplicated and joined with "\n". Scheme `all` selects every event the rank reports (events only, not
//! counters); scheme `pattern` only the names the regex matches (anywhere in the name: anchor it with `^` for a
//! prefix). A rank that selects nothing is in the class of the empty string. An event whose name this node was
//! never told (through `names`) takes its id in 16 hex digits as its name, so the class is still stable
//! across ranks; the host should give the leaves the names before the first round.
//!
//! Per class the histograms follow the histogram filter's three phases ([`canopy_filter_common::three_phase`]),
//! with one range per class and (id, metric): phase 0 up (members and summaries; leaves buffer values per
//! class), phase 1 down (the per-class ranges), phase 2 up (per-class histograms). The result reports the
//! reduction factor: raw profile bytes over the size of the result (ToM Fig. 7).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_filter_common::histogram::{self, HistMap, Samples};
use canopy_filter_common::rounds::Rounds;
use canopy_filter_common::summary::{self, StatsMap};
use canopy_filter_common::three_phase::{self, ThreePhase};
use canopy_filter_common::{Params, Values, decode, metrics, ranks};
use canopy_filter_proto::v1::{Class, ClassPacket, ClassResult, RankRange, RankRef};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use canopy_wire::v1::RankProfile;
use prost::Message;
use regex_lite::Regex;

/// The default number of bins, as ToM's Fig. 7.
pub const DEFAULT_BINS: u32 = 5;
/// The most bins a stream may ask for.
pub const MAX_BINS: u32 = 10_000;

const PACKET: &str = "canopy.filters.v1.ClassPacket";

/// Which event names make a rank's class.
#[derive(Debug, Clone)]
pub enum Scheme {
    /// Every event the rank reports.
    All,
    /// Only the events whose names match.
    Pattern(Regex),
}

impl Scheme {
    /// As the result reports it: `all`, or `pattern:` followed by the regex.
    pub fn describe(&self) -> String {
        match self {
            Scheme::All => "all".to_string(),
            Scheme::Pattern(re) => format!("pattern:{}", re.as_str()),
        }
    }
}

/// One class as a leaf builds it in phase 0.
#[derive(Debug, Default)]
struct LeafClass {
    members: Vec<RankRange>,
    stats: StatsMap,
    samples: Samples,
    example: String,
}

/// A leaf's values for a round, per class, kept from phase 0 until the ranges arrive.
#[derive(Debug, Default)]
pub struct Buffer {
    classes: BTreeMap<u64, Samples>,
    raw_bytes: u64,
}

/// Phase 0 merged at a relay or the root.
#[derive(Debug, Default)]
pub struct Merged {
    members: Vec<RankRange>,
    stats: StatsMap,
    example: Option<String>,
}

/// One instance per stream per node.
#[derive(Debug)]
pub struct ClassifyFilter {
    level: Level,
    values: Values,
    bins: u32,
    scheme: Scheme,
    /// Leaf: event names by id, as the host gives them.
    names: HashMap<u64, String>,
    /// Leaf: per event id, its name if the scheme selects it; cleared when names change.
    selected: HashMap<u64, Option<String>>,
    /// Leaf: the values of each open round.
    buffers: Rounds<Buffer>,
    /// Root: each round's merged classes between phase 0 and phase 2.
    classes: Rounds<BTreeMap<u64, Merged>>,
}

impl ClassifyFilter {
    /// The selected name of an event, or `None` if the scheme leaves it out.
    fn select(&mut self, id: u64) -> Option<String> {
        if let Some(s) = self.selected.get(&id) {
            return s.clone();
        }
        let name = self
            .names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("{id:016x}"));
        let chosen = match &self.scheme {
            Scheme::All => Some(name),
            Scheme::Pattern(re) => re.is_match(&name).then_some(name),
        };
        self.selected.insert(id, chosen.clone());
        chosen
    }

    /// A rank's class id and its first selected name.
    fn class_of(&mut self, p: &RankProfile) -> (u64, String) {
        let names: BTreeSet<String> = p.events.iter().filter_map(|e| self.select(e.event_id)).collect();
        let joined = names.iter().map(String::as_str).collect::<Vec<_>>().join("\n");
        (
            canopy_wire::event_id(&joined),
            names.into_iter().next().unwrap_or_default(),
        )
    }
}

/// How many ranks normalized ranges hold, saturating at u32::MAX.
fn size(members: &[RankRange]) -> u32 {
    u32::try_from(ranks::count(members)).unwrap_or(u32::MAX)
}

/// A merged class as it goes up (histograms come later).
fn to_class(id: u64, m: &Merged) -> Class {
    Class {
        class_id: id,
        ranks: m.members.clone(),
        size: size(&m.members),
        stats: m.stats.to_stats(),
        example_event: m.example.clone().unwrap_or_default(),
        ..Default::default()
    }
}

impl ThreePhase for ClassifyFilter {
    const PACKET: &'static str = PACKET;
    type Packet = ClassPacket;
    type Buffer = Buffer;
    type Summaries = BTreeMap<u64, Merged>;
    /// Per class, the children's histograms added up; and the raw bytes they stand for.
    type Counts = (BTreeMap<u64, HistMap>, u64);

    fn level(&self) -> Level {
        self.level
    }

    fn buffers(&mut self) -> &mut Rounds<Buffer> {
        &mut self.buffers
    }

    fn summaries(&mut self) -> &mut Rounds<BTreeMap<u64, Merged>> {
        &mut self.classes
    }

    /// Classes with members and summaries up; the values buffered per class.
    fn leaf_summaries(&mut self, inputs: &[&[u8]], out: &mut dyn Emit) -> (ClassPacket, Buffer) {
        let (profiles, raw_bytes) = decode::profiles(inputs, out);
        let mut classes: BTreeMap<u64, LeafClass> = BTreeMap::new();
        for p in &profiles {
            let (id, example) = self.class_of(p);
            let class = classes.entry(id).or_default();
            // As in the relays' merge: the smallest example settles a hash collision.
            if class.members.is_empty() || example < class.example {
                class.example = example;
            }
            class.members.push(RankRange {
                app: p.app.clone(),
                first: p.rank,
                last: p.rank,
            });
            let rank = RankRef {
                app: p.app.clone(),
                rank: p.rank,
            };
            for (key, v) in metrics::extract(p, self.values) {
                class.stats.add(key, v, &rank);
                class.samples.add(key, v);
            }
        }
        let mut packet = ClassPacket::default();
        let mut buffer = Buffer {
            raw_bytes,
            ..Default::default()
        };
        for (id, c) in classes {
            let members = ranks::normalize(c.members);
            packet.classes.push(Class {
                class_id: id,
                size: size(&members),
                ranks: members,
                stats: c.stats.to_stats(),
                example_event: c.example,
                ..Default::default()
            });
            buffer.classes.insert(id, c.samples);
        }
        (packet, buffer)
    }

    /// The children's classes merged by class id.
    fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> BTreeMap<u64, Merged> {
        let packets: Vec<ClassPacket> = decode::packets(inputs, PACKET, out, |_: &ClassPacket| Ok(()));
        let mut merged: BTreeMap<u64, Merged> = BTreeMap::new();
        for p in packets {
            for c in p.classes {
                let m = merged.entry(c.class_id).or_default();
                m.members.extend(c.ranks);
                m.stats.merge_stats(&c.stats);
                // Members of a class share their names, so their examples agree; the smallest settles a hash
                // collision the same way whatever the arrival order.
                if m.example.as_ref().is_none_or(|e| c.example_event < *e) {
                    m.example = Some(c.example_event);
                }
            }
        }
        for m in merged.values_mut() {
            m.members = ranks::normalize(std::mem::take(&mut m.members));
        }
        merged
    }

    fn summaries_packet(&self, merged: &BTreeMap<u64, Merged>) -> ClassPacket {
        let classes = merged.iter().map(|(id, m)| to_class(*id, m)).collect();
        ClassPacket {
            classes,
            raw_bytes: 0,
        }
    }

    /// One range per class and (id, metric).
    fn ranges_packet(&self, merged: &BTreeMap<u64, Merged>) -> ClassPacket {
        let classes = merged
            .iter()
            .map(|(id, m)| Class {
                class_id: *id,
                ranges: histogram::ranges_of(&m.stats),
                ..Default::default()
            })
            .collect();
        ClassPacket {
            classes,
            raw_bytes: 0,
        }
    }

    fn bin(&self, buffer: Buffer, down: ClassPacket) -> ClassPacket {
        let ranges: HashMap<u64, &Class> = down.classes.iter().map(|c| (c.class_id, c)).collect();
        let mut up = ClassPacket {
            raw_bytes: buffer.raw_bytes,
            ..Default::default()
        };
        for (id, samples) in &buffer.classes {
            let histograms = match ranges.get(id) {
                Some(c) => samples.bin(&c.ranges, self.bins as usize),
                None => Vec::new(),
            };
            up.classes.push(Class {
                class_id: *id,
                histograms,
                ..Default::default()
            });
        }
        up
    }

    fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> (BTreeMap<u64, HistMap>, u64) {
        let bins = self.bins as usize;
        let packets: Vec<ClassPacket> = decode::packets(inputs, PACKET, out, |p: &ClassPacket| {
            p.classes
                .iter()
                .try_for_each(|c| HistMap::check(&c.histograms, bins))
        });
        let mut merged: BTreeMap<u64, HistMap> = BTreeMap::new();
        let mut raw_bytes = 0u64;
        for p in &packets {
            for c in &p.classes {
                merged.entry(c.class_id).or_default().merge(&c.histograms);
            }
            raw_bytes = raw_bytes.saturating_add(p.raw_bytes);
        }
        (merged, raw_bytes)
    }

    fn counts_packet(&self, (merged, raw_bytes): (BTreeMap<u64, HistMap>, u64)) -> ClassPacket {
        let classes = merged
            .into_iter()
            .map(|(id, h)| Class {
                class_id: id,
                histograms: h.to_vec(),
                ..Default::default()
            })
            .collect();
        ClassPacket { classes, raw_bytes }
    }

    /// The classes' members and summaries with their histograms.
    fn root_packet(
        &self,
        (mut hists, raw_bytes): (BTreeMap<u64, HistMap>, u64),
        merged: BTreeMap<u64, Merged>,
    ) -> ClassPacket {
        let classes = merged
            .iter()
            .map(|(id, m)| Class {
                histograms: hists.remove(id).map(|h| h.to_vec()).unwrap_or_default(),
                ..to_class(*id, m)
            })
            .collect();
        ClassPacket { classes, raw_bytes }
    }

    /// The result, with `std` filled, `result_bytes` its own encoded size without the two size fields, and
    /// the reduction factor `raw_bytes / result_bytes`.
    fn result(&self, packet: ClassPacket) -> Vec<u8> {
        let mut classes = packet.classes;
        for c in &mut classes {
            summary::finish_all(&mut c.stats);
        }
        let mut result = ClassResult {
            classes,
            raw_bytes: packet.raw_bytes,
            result_bytes: 0,
            reduction_factor: 0.0,
            scheme: self.scheme.describe(),
            bins: self.bins,
        };
        // Zero fields are not encoded, so this is the size without result_bytes and reduction_factor.
        let size = result.encoded_len() as u64;
        result.result_bytes = size;
        result.reduction_factor = if size == 0 {
            0.0
        } else {
            result.raw_bytes as f64 / size as f64
        };
        result.encode_to_vec()
    }
}

impl Filter for ClassifyFilter {
    const NAME: &'static str = "classify";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.ClassResult";
    const PHASES: u32 = three_phase::PHASES;

    /// Params: `{"scheme": "all" | "pattern", "pattern": "<regex>" (with scheme pattern only),
    /// "bins": 1..=10000 (5), "values": "round" | "cumulative"}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let params = Params::parse(params, &["scheme", "pattern", "bins", "values"])?;
        let scheme = match (
            params.choice("scheme", &["all", "pattern"], "all")?,
            params.string("pattern")?,
        ) {
            ("all", None) => Scheme::All,
            ("all", Some(_)) => return Err("pattern needs scheme \"pattern\"".to_string()),
            (_, None) => return Err("scheme \"pattern\" needs a pattern".to_string()),
            (_, Some(p)) => Scheme::Pattern(
                Regex::new(p).map_err(|e| format!("pattern \"{p}\" is not a valid regex: {e}"))?,
            ),
        };
        Ok(ClassifyFilter {
            level,
            values: params.values()?,
            bins: params.u32_between("bins", DEFAULT_BINS, 1, MAX_BINS)?,
            scheme,
            names: HashMap::new(),
            selected: HashMap::new(),
            buffers: Rounds::new(),
            classes: Rounds::new(),
        })
    }

    fn upstream(
        &mut self,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        three_phase::upstream(self, round, phase, inputs, out)
    }

    fn downstream(
        &mut self,
        round: u64,
        phase: u32,
        packet: &[u8],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        three_phase::downstream(self, round, phase, packet, out)
    }

    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        three_phase::finalize(self, round, phase, packet)
    }

    fn names(&mut self, names: &[(u64, &str)]) {
        for (id, name) in names {
            self.names.insert(*id, (*name).to_string());
        }
        // A name may replace an id's hex stand-in: selection is decided again.
        self.selected.clear();
    }
}

export_filter!(ClassifyFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::Metric;
    use canopy_filter_test::{Collect, encode_one};
    use canopy_wire::v1::EventSample;

    fn profile(rank: u32, events: &[(&str, f64)]) -> Vec<u8> {
        encode_one(&RankProfile {
            app: "a".into(),
            rank,
            events: events
                .iter()
                .map(|(n, v)| EventSample {
                    event_id: canopy_wire::event_id(n),
                    calls: 1,
                    incl_us: *v,
                    excl_us: *v,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    fn named(params: &str, level: Level, names: &[&str]) -> ClassifyFilter {
        let mut f = ClassifyFilter::create(params, level).unwrap();
        let pairs: Vec<(u64, &str)> = names.iter().map(|n| (canopy_wire::event_id(n), *n)).collect();
        f.names(&pairs);
        f
    }

    /// Leaf and root of a one-leaf tree: phase 0 of every round, then phases 1 and 2 in `order`.
    fn run_rounds(
        params: &str,
        names: &[&str],
        rounds: &[Vec<Vec<u8>>],
        order: &[usize],
    ) -> Vec<ClassResult> {
        let mut leaf = named(params, Level::Leaf, names);
        let mut root = ClassifyFilter::create(params, Level::Root).unwrap();
        let mut downs = vec![Vec::new(); rounds.len()];
        for &r in order {
            let inputs: Vec<&[u8]> = rounds[r].iter().map(Vec::as_slice).collect();
            let mut out = Collect::default();
            leaf.upstream(r as u64, 0, &inputs, &mut out).unwrap();
            let mut down = Collect::default();
            root.upstream(r as u64, 0, &[&out.up[0].1], &mut down).unwrap();
            downs[r] = down.down.remove(0).1;
        }
        let mut results = vec![ClassResult::default(); rounds.len()];
        for &r in order.iter().rev() {
            let mut out = Collect::default();
            leaf.downstream(r as u64, 1, &downs[r], &mut out).unwrap();
            let mut up = Collect::default();
            root.upstream(r as u64, 2, &[&out.up[0].1], &mut up).unwrap();
            results[r] =
                ClassResult::decode(root.finalize(r as u64, 2, &up.up[0].1).unwrap().as_slice()).unwrap();
        }
        assert!(
            leaf.buffers.is_empty() && root.classes.is_empty(),
            "state dropped"
        );
        results
    }

    fn members(r: &ClassResult) -> Vec<Vec<(u32, u32)>> {
        r.classes
            .iter()
            .map(|c| c.ranks.iter().map(|rr| (rr.first, rr.last)).collect())
            .collect()
    }

    #[test]
    fn params_errors() {
        let err = |p: &str| ClassifyFilter::create(p, Level::Leaf).unwrap_err();
        assert_eq!(
            err(r#"{"scheme": "pattern"}"#),
            "scheme \"pattern\" needs a pattern"
        );
        assert_eq!(err(r#"{"pattern": "^MPI_"}"#), "pattern needs scheme \"pattern\"");
        assert!(
            err(r#"{"scheme": "pattern", "pattern": "(MPI"}"#)
                .starts_with("pattern \"(MPI\" is not a valid regex: ")
        );
        assert_eq!(
            err(r#"{"scheme": "mpi"}"#),
            "scheme must be one of \"all\", \"pattern\", got \"mpi\""
        );
        assert_eq!(err(r#"{"bins": 0}"#), "bins must be between 1 and 10000, got 0");
        assert_eq!(
            err(r#"{"schema": "all"}"#),
            "unknown parameter \"schema\" (known: scheme, pattern, bins, values)"
        );
        let f = ClassifyFilter::create("", Level::Root).unwrap();
        assert_eq!((f.bins, f.scheme.describe()), (5, "all".to_string()));
        let f = ClassifyFilter::create(r#"{"scheme": "pattern", "pattern": "^MPI_"}"#, Level::Root).unwrap();
        assert_eq!(f.scheme.describe(), "pattern:^MPI_");
    }

    #[test]
    fn pipelined_rounds_keep_their_own_classes() {
        // Round 0: ranks 0-1 run "a", rank 2 runs "a" and "b". Round 1: everyone runs "a" only.
        let r0 = vec![
            profile(0, &[("a", 1.0)]),
            profile(1, &[("a", 2.0)]),
            profile(2, &[("a", 3.0), ("b", 1.0)]),
        ];
        let r1 = vec![
            profile(0, &[("a", 1.0)]),
            profile(1, &[("a", 5.0)]),
            profile(2, &[("a", 9.0)]),
        ];
        // Both rounds' phase 0 before either's phase 1 and 2, completed in either order.
        for order in [[0, 1], [1, 0]] {
            let res = run_rounds(r#"{"bins": 2}"#, &["a", "b"], &[r0.clone(), r1.clone()], &order);
            let a_only = canopy_wire::event_id("a");
            let a_b = canopy_wire::event_id("a\nb");
            let mut ids0: Vec<u64> = vec![a_only, a_b];
            ids0.sort();
            assert_eq!(
                res[0].classes.iter().map(|c| c.class_id).collect::<Vec<_>>(),
                ids0
            );
            let c0 = res[0].classes.iter().find(|c| c.class_id == a_only).unwrap();
            assert_eq!((c0.size, c0.example_event.as_str()), (2, "a"));
            assert_eq!(res[1].classes.len(), 1);
            assert_eq!(members(&res[1]), vec![vec![(0, 2)]]);
            let h = res[1].classes[0]
                .histograms
                .iter()
                .find(|h| h.metric == Metric::Inclusive as i32)
                .unwrap();
            assert_eq!((h.lo, h.hi, h.counts.clone()), (1.0, 9.0, vec![1, 2]));
        }
    }

    #[test]
    fn a_rejected_input_is_reported_and_the_rest_merges() {
        let mut leaf = named("{}", Level::Leaf, &["a"]);
        let bad = vec![0x0a, 0x05, 0x01];
        let (p0, p1) = (profile(0, &[("a", 1.0)]), profile(1, &[("a", 2.0)]));
        let mut out = Collect::default();
        leaf.upstream(0, 0, &[&p0, &bad, &p1], &mut out).unwrap();
        assert_eq!(out.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
        let mut relay = ClassifyFilter::create("{}", Level::Relay).unwrap();
        let mut out2 = Collect::default();
        relay.upstream(0, 0, &[&bad, &out.up[0].1], &mut out2).unwrap();
        assert_eq!(out2.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0]);
        let packet = ClassPacket::decode(out2.up[0].1.as_slice()).unwrap();
        assert_eq!(packet.classes.len(), 1);
        assert_eq!(packet.classes[0].size, 2);

        // Every input rejected: the leaf still answers both of its phases.
        let mut out = Collect::default();
        leaf.upstream(1, 0, &[&bad], &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
        let mut out = Collect::default();
        leaf.downstream(1, 1, &[], &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
    }

    #[test]
    fn unknown_names_fall_back_to_hex_ids() {
        let id = canopy_wire::event_id("MPI_Send()");
        let mut leaf = ClassifyFilter::create("{}", Level::Leaf).unwrap();
        let p = RankProfile {
            events: vec![EventSample {
                event_id: id,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            leaf.class_of(&p),
            (canopy_wire::event_id(&format!("{id:016x}")), format!("{id:016x}"))
        );
        // Once the name is known, it is used.
        leaf.names(&[(id, "MPI_Send()")]);
        assert_eq!(
            leaf.class_of(&p),
            (canopy_wire::event_id("MPI_Send()"), "MPI_Send()".to_string())
        );
    }

    #[test]
    fn class_id_hashes_sorted_selected_names_of_events_only() {
        let mut leaf = named(
            r#"{"scheme": "pattern", "pattern": "^MPI_"}"#,
            Level::Leaf,
            &["main", "MPI_Send", "MPI_Recv"],
        );
        let ev = |n: &str| EventSample {
            event_id: canopy_wire::event_id(n),
            ..Default::default()
        };
        let p = RankProfile {
            events: vec![ev("main"), ev("MPI_Send"), ev("MPI_Recv"), ev("MPI_Send")],
            counters: vec![canopy_wire::v1::CounterSample {
                counter_id: canopy_wire::event_id("MPI_x"),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            leaf.class_of(&p),
            (
                canopy_wire::event_id("MPI_Recv\nMPI_Send"),
                "MPI_Recv".to_string()
            )
        );
        let none = RankProfile {
            events: vec![ev("main")],
            ..Default::default()
        };
        assert_eq!(leaf.class_of(&none), (canopy_wire::event_id(""), String::new()));
    }

    #[test]
    fn result_bytes_and_reduction_factor() {
        let res = run_rounds(
            "{}",
            &["a"],
            &[vec![profile(0, &[("a", 1.0)]), profile(1, &[("a", 2.0)])]],
            &[0],
        );
        let r = &res[0];
        let mut bare = r.clone();
        bare.result_bytes = 0;
        bare.reduction_factor = 0.0;
        assert_eq!(r.result_bytes, bare.encoded_len() as u64);
        assert_eq!(r.reduction_factor, r.raw_bytes as f64 / r.result_bytes as f64);
        assert_eq!((r.scheme.as_str(), r.bins), ("all", 5));
        assert!(r.raw_bytes > 0);
    }

    #[test]
    fn descriptors_define_the_result_type() {
        let fds = prost_types::FileDescriptorSet::decode(ClassifyFilter::descriptors()).unwrap();
        let (pkg, name) = ClassifyFilter::RESULT_TYPE.rsplit_once('.').unwrap();
        assert!(
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        );
    }
}
