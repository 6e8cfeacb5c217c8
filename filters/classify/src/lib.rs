//! The classify filter (ToM's ClassFilter): ranks are grouped into functional classes by a hash of the event
//! names they report, and each class gets its members (as rank ranges) and, for every event a member reports,
//! the histogram of the members' values of one metric (exclusive time unless the `metric` parameter says
//! otherwise). With `"summaries": true` a class also gets, per event, the members' summary of that metric.
//!
//! The class id of a rank is the xxh3-64 ([`canopy_wire::event_id`]) of its selected event names, sorted,
//! deduplicated and joined with "\n". Scheme `all` selects every event the rank reports (events only, not
//! counters); scheme `pattern` only the names the regex matches (anywhere in the name: anchor it with `^` for a
//! prefix). A rank that selects nothing is in the class of the empty string. An event whose name this node was
//! never told (through `names`) takes its id in 16 hex digits as its name, so the class is still stable
//! across ranks; the host should give the leaves the names before the first round. The scheme and the class
//! id are [`canopy_filter_common::classes`], which other filters group ranks by too.
//!
//! Broken down by application (`by_app`, the default, as the stats filter), a class holds the ranks of one
//! application only: its id hashes the application's name with the selected names, so a simulation and an
//! analysis that call the same functions are still two classes. The ranges stay one per event over every rank.
//!
//! The histograms follow ToM's three phases ([`canopy_filter_common::three_phase`]) with one range per event,
//! shared by every class: phase 0 up, the classes' members (and summaries) and each event's min and max over
//! the packet's ranks (leaves buffer their values per class); phase 1 down, the global ranges; phase 2 up, per
//! class the counts of its events, `bins` per event. The result carries the ranges once and, per class, its
//! rank ranges, its event ids and one flat array of counts, so a class costs a few bytes per event. Every list
//! in a packet is sorted by id with no id twice, so a relay merges its children's packets in one pass. The
//! result reports the reduction factor: raw profile bytes over the size of the result (ToM Fig. 7).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use canopy_filter_common::classes::{Scheme, Selection};
use canopy_filter_common::histogram::bin_index;
use canopy_filter_common::rounds::Rounds;
use canopy_filter_common::summary::StatsMap;
use canopy_filter_common::three_phase::{self, ThreePhase};
use canopy_filter_common::{Params, Values, columns, decode, metrics, ranks};
use canopy_filter_proto::v1::{
    BinRanges, Class, ClassPacket, ClassPart, ClassResult, Metric, RankRange, RankRef, StatsColumns,
};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use prost::Message;

/// The default number of bins, as ToM's Fig. 7.
pub const DEFAULT_BINS: u32 = 5;
/// The most bins a stream may ask for.
pub const MAX_BINS: u32 = 10_000;

const PACKET: &str = "canopy.filters.v1.ClassPacket";

/// One class as a leaf builds it in phase 0.
#[derive(Debug, Default)]
struct LeafClass {
    members: Vec<RankRange>,
    example: String,
    /// (event id, value) of every member.
    values: Vec<(u64, f64)>,
    stats: StatsMap,
}

/// A leaf's values for a round, kept from phase 0 until the ranges arrive.
#[derive(Debug, Default)]
pub struct Buffer {
    /// Per class, sorted by class id: its members' (event id, value) pairs, sorted by event id.
    classes: Vec<(u64, Vec<(u64, f64)>)>,
    raw_bytes: u64,
}

/// One instance per stream per node.
#[derive(Debug)]
pub struct ClassifyFilter {
    level: Level,
    values: Values,
    metric: Metric,
    summaries: bool,
    bins: u32,
    /// Which names make a class; at the leaves, the names the host gave.
    selection: Selection,
    /// Leaf: the values of each open round.
    buffers: Rounds<Buffer>,
    /// Root: each round's merged phase 0 (classes and ranges) until its counts come up.
    classes: Rounds<ClassPacket>,
}

impl ClassifyFilter {
    /// Refuses a phase-0 packet this node cannot merge; the message names what is wrong.
    fn check_summaries_packet(&self, p: &ClassPacket) -> Result<(), String> {
        check_ranges(p.ranges.as_ref())?;
        check_class_order(&p.classes)?;
        for c in &p.classes {
            if c.ranks.is_empty() {
                return Err(format!("class {:#018x} has no ranks", c.class_id));
            }
            match (&c.summaries, self.summaries) {
                (Some(_), false) => {
                    return Err(format!(
                        "class {:#018x} carries summaries, but this stream's summaries are off",
                        c.class_id
                    ));
                }
                (Some(s), true) => {
                    columns::check(s)
                        .and_then(|()| columns::check_breakdown(s, false))
                        .map_err(|e| format!("class {:#018x}: summaries: {e}", c.class_id))?;
                    if let Some(m) = s.metric.iter().find(|m| **m != self.metric as i32) {
                        return Err(format!(
                            "class {:#018x}: summaries of metric {m}, this stream's is {}",
                            c.class_id, self.metric as i32
                        ));
                    }
                }
                (None, _) => {}
            }
        }
        Ok(())
    }

    /// Refuses a phase-2 packet this node cannot merge; the message names what is wrong.
    fn check_counts_packet(&self, p: &ClassPacket) -> Result<(), String> {
        check_class_order(&p.classes)?;
        let bins = self.bins as usize;
        for c in &p.classes {
            if c.counts.len() != c.events.len() * bins {
                return Err(format!(
                    "class {:#018x} has {} counts for {} events of {bins} bins",
                    c.class_id,
                    c.counts.len(),
                    c.events.len()
                ));
            }
            check_sorted(&c.events)
                .map_err(|(i, id)| format!("class {:#018x}: {}", c.class_id, unsorted("event", i, id)))?;
        }
        Ok(())
    }
}

/// Where a list of ids first fails to increase: (position, id).
fn check_sorted(ids: &[u64]) -> Result<(), (usize, u64)> {
    match ids.windows(2).position(|w| w[1] <= w[0]) {
        Some(i) => Err((i + 1, ids[i + 1])),
        None => Ok(()),
    }
}

fn unsorted(what: &str, i: usize, id: u64) -> String {
    format!("{what} {id:#018x} at {i} does not follow the previous one (sorted, each once)")
}

fn check_class_order(classes: &[ClassPart]) -> Result<(), String> {
    let ids: Vec<u64> = classes.iter().map(|c| c.class_id).collect();
    check_sorted(&ids).map_err(|(i, id)| unsorted("class", i, id))
}

/// Checks ranges as a packet brings them: columns of one length, ids sorted and each once, and every range
/// finite with lo <= hi (they are the min and max of finite values).
fn check_ranges(ranges: Option<&BinRanges>) -> Result<(), String> {
    let Some(r) = ranges else { return Ok(()) };
    for (column, len) in [("lo", r.lo.len()), ("hi", r.hi.len())] {
        if len != r.id.len() {
            return Err(format!(
                "ranges: column {column} has {len} entries for {} ids",
                r.id.len()
            ));
        }
    }
    check_sorted(&r.id).map_err(|(i, id)| format!("ranges: {}", unsorted("event", i, id)))?;
    for (i, &id) in r.id.iter().enumerate() {
        let (lo, hi) = (r.lo[i], r.hi[i]);
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(format!(
                "ranges: event {id:#018x} has the range [{lo}, {hi}] (finite, lo <= hi)"
            ));
        }
    }
    Ok(())
}

/// Walks the union of lists that are each sorted by `key` with no key twice: `f` gets each key once, in
/// order, with where it is, (list, position), in every list that holds it, in the lists' order.
fn union<T>(lists: &[&[T]], key: impl Fn(&T) -> u64, mut f: impl FnMut(u64, &[(usize, usize)])) {
    let mut at = vec![0usize; lists.len()];
    let mut found: Vec<(usize, usize)> = Vec::with_capacity(lists.len());
    loop {
        let next = lists
            .iter()
            .zip(&at)
            .filter_map(|(l, &i)| l.get(i))
            .map(&key)
            .min();
        let Some(k) = next else { break };
        found.clear();
        for (list, (l, i)) in lists.iter().zip(at.iter_mut()).enumerate() {
            if l.get(*i).is_some_and(|item| key(item) == k) {
                found.push((list, *i));
                *i += 1;
            }
        }
        f(k, &found);
    }
}

/// The smaller of two values in IEEE total order, so that -0.0 and 0.0 merge the same in any order.
fn min_total(a: f64, b: f64) -> f64 {
    if b.total_cmp(&a).is_lt() { b } else { a }
}

fn max_total(a: f64, b: f64) -> f64 {
    if b.total_cmp(&a).is_gt() { b } else { a }
}

/// Several packets' ranges as one: per event the smallest lo and the largest hi.
fn merge_ranges(all: &[&BinRanges]) -> BinRanges {
    let ids: Vec<&[u64]> = all.iter().map(|r| r.id.as_slice()).collect();
    let mut out = BinRanges::default();
    union(
        &ids,
        |id| *id,
        |id, at| {
            out.id.push(id);
            out.lo.push(
                at.iter()
                    .map(|&(l, i)| all[l].lo[i])
                    .fold(f64::INFINITY, min_total),
            );
            out.hi.push(
                at.iter()
                    .map(|&(l, i)| all[l].hi[i])
                    .fold(f64::NEG_INFINITY, max_total),
            );
        },
    );
    out
}

/// Several parts of one class as one: the union of their events, each event's counts added (saturating).
fn merge_counts_of(parts: &[&ClassPart], bins: usize, out: &mut ClassPart) {
    let events: Vec<&[u64]> = parts.iter().map(|p| p.events.as_slice()).collect();
    union(
        &events,
        |id| *id,
        |id, at| {
            let base = out.counts.len();
            out.counts.resize(base + bins, 0);
            for &(p, i) in at {
                let add = &parts[p].counts[i * bins..(i + 1) * bins];
                for (sum, add) in out.counts[base..].iter_mut().zip(add) {
                    *sum = sum.saturating_add(*add);
                }
            }
            out.events.push(id);
        },
    );
}

/// How many ranks normalized ranges hold, saturating at u32::MAX.
fn size(members: &[RankRange]) -> u32 {
    u32::try_from(ranks::count(members)).unwrap_or(u32::MAX)
}

impl ThreePhase for ClassifyFilter {
    const PACKET: &'static str = PACKET;
    type Packet = ClassPacket;
    type Buffer = Buffer;
    /// The classes' members, examples and summaries, and the ranges.
    type Summaries = ClassPacket;
    /// The classes' events and counts, and the raw bytes they stand for.
    type Counts = ClassPacket;

    fn level(&self) -> Level {
        self.level
    }

    fn buffers(&mut self) -> &mut Rounds<Buffer> {
        &mut self.buffers
    }

    fn summaries(&mut self) -> &mut Rounds<ClassPacket> {
        &mut self.classes
    }

    /// Classes with members (and summaries) and the leaf's ranges up; the values buffered per class.
    fn leaf_summaries(&mut self, _round: u64, inputs: &[&[u8]], out: &mut dyn Emit) -> (ClassPacket, Buffer) {
        let (profiles, raw_bytes) = decode::profiles(inputs, out);
        let mut classes: BTreeMap<u64, LeafClass> = BTreeMap::new();
        for p in &profiles {
            let (id, example) = self.selection.class_of(p);
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
            let rank = self.summaries.then(|| RankRef {
                app: p.app.clone(),
                rank: p.rank,
            });
            let metric = self.metric as i32;
            metrics::each_value(p, self.values, self.metric, |id, v| {
                class.values.push((id, v));
                if let Some(rank) = &rank {
                    class.stats.add((id, metric), v, rank);
                }
            });
        }
        let mut packet = ClassPacket::default();
        let mut buffer = Buffer {
            raw_bytes,
            ..Default::default()
        };
        // (id, lo, hi) of every event in every class, merged into the leaf's ranges below.
        let mut extremes: Vec<(u64, f64, f64)> = Vec::new();
        for (id, mut c) in classes {
            c.values.sort_unstable_by_key(|(event, _)| *event);
            for run in c.values.chunk_by(|a, b| a.0 == b.0) {
                let lo = run.iter().map(|v| v.1).fold(f64::INFINITY, min_total);
                let hi = run.iter().map(|v| v.1).fold(f64::NEG_INFINITY, max_total);
                extremes.push((run[0].0, lo, hi));
            }
            let summaries = self.summaries.then(|| {
                let mut s = StatsColumns::default();
                columns::from_map(&c.stats, 0, &mut s);
                s
            });
            packet.classes.push(ClassPart {
                class_id: id,
                ranks: ranks::normalize(c.members),
                example_event: c.example,
                summaries,
                ..Default::default()
            });
            buffer.classes.push((id, c.values));
        }
        extremes.sort_unstable_by_key(|(id, _, _)| *id);
        let mut ranges = BinRanges::default();
        for run in extremes.chunk_by(|a, b| a.0 == b.0) {
            ranges.id.push(run[0].0);
            ranges
                .lo
                .push(run.iter().map(|e| e.1).fold(f64::INFINITY, min_total));
            ranges
                .hi
                .push(run.iter().map(|e| e.2).fold(f64::NEG_INFINITY, max_total));
        }
        packet.ranges = Some(ranges);
        (packet, buffer)
    }

    /// The children's classes merged by class id, and their ranges by event.
    fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> ClassPacket {
        let packets: Vec<ClassPacket> = decode::packets(inputs, PACKET, out, |p: &ClassPacket| {
            self.check_summaries_packet(p)
        });
        let lists: Vec<&[ClassPart]> = packets.iter().map(|p| p.classes.as_slice()).collect();
        let ranges: Vec<&BinRanges> = packets.iter().filter_map(|p| p.ranges.as_ref()).collect();
        let mut merged = ClassPacket {
            ranges: Some(merge_ranges(&ranges)),
            ..Default::default()
        };
        union(
            &lists,
            |c| c.class_id,
            |class_id, at| {
                let parts: Vec<&ClassPart> = at.iter().map(|&(l, i)| &lists[l][i]).collect();
                let ranks = ranks::normalize(parts.iter().flat_map(|p| p.ranks.iter().cloned()).collect());
                // Members of a class share their names, so their examples agree; the smallest settles a hash
                // collision the same way whatever the arrival order.
                let example_event = parts
                    .iter()
                    .map(|p| p.example_event.as_str())
                    .min()
                    .unwrap_or_default()
                    .to_string();
                let summaries = self.summaries.then(|| {
                    let of: Vec<&StatsColumns> = parts.iter().filter_map(|p| p.summaries.as_ref()).collect();
                    let mut s = StatsColumns::default();
                    columns::merge(&of, &mut s);
                    s
                });
                merged.classes.push(ClassPart {
                    class_id,
                    ranks,
                    example_event,
                    summaries,
                    ..Default::default()
                });
            },
        );
        merged
    }

    fn summaries_packet(&self, merged: &ClassPacket) -> ClassPacket {
        merged.clone()
    }

    /// The global range of every event, for every class.
    fn ranges_packet(&self, merged: &ClassPacket) -> ClassPacket {
        ClassPacket {
            ranges: merged.ranges.clone(),
            ..Default::default()
        }
    }

    /// Per class, the counts of its events' values in the bins of each event's global range. An event without
    /// a range (the root never saw it, which a complete round cannot produce) is left out rather than binned
    /// against a guess.
    fn bin(&mut self, buffer: Buffer, down: ClassPacket) -> Result<ClassPacket, String> {
        check_ranges(down.ranges.as_ref())?;
        let ranges = down.ranges.unwrap_or_default();
        let bins = self.bins as usize;
        let mut up = ClassPacket {
            raw_bytes: buffer.raw_bytes,
            ..Default::default()
        };
        for (class_id, values) in buffer.classes {
            let mut part = ClassPart {
                class_id,
                ..Default::default()
            };
            // Both lists are sorted by event id: one walk finds every range.
            let mut r = 0usize;
            for run in values.chunk_by(|a, b| a.0 == b.0) {
                let id = run[0].0;
                r += ranges.id[r..].partition_point(|x| *x < id);
                if ranges.id.get(r) != Some(&id) {
                    continue;
                }
                let (lo, hi) = (ranges.lo[r], ranges.hi[r]);
                let base = part.counts.len();
                part.counts.resize(base + bins, 0);
                for &(_, v) in run {
                    part.counts[base + bin_index(v, lo, hi, bins)] += 1;
                }
                part.events.push(id);
            }
            if !part.events.is_empty() {
                up.classes.push(part);
            }
        }
        Ok(up)
    }

    fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> ClassPacket {
        let packets: Vec<ClassPacket> =
            decode::packets(inputs, PACKET, out, |p: &ClassPacket| self.check_counts_packet(p));
        let bins = self.bins as usize;
        let lists: Vec<&[ClassPart]> = packets.iter().map(|p| p.classes.as_slice()).collect();
        let mut merged = ClassPacket {
            raw_bytes: packets
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(p.raw_bytes)),
            ..Default::default()
        };
        union(
            &lists,
            |c| c.class_id,
            |class_id, at| {
                let parts: Vec<&ClassPart> = at.iter().map(|&(l, i)| &lists[l][i]).collect();
                let mut part = ClassPart {
                    class_id,
                    ..Default::default()
                };
                merge_counts_of(&parts, bins, &mut part);
                merged.classes.push(part);
            },
        );
        merged
    }

    fn counts_packet(&self, counts: ClassPacket) -> ClassPacket {
        counts
    }

    /// The round's classes with their counts and the ranges. Counts of a class the root did not see in phase 0
    /// (a child late then, on time now) have no members to stand beside and are left out.
    fn root_packet(&self, counts: ClassPacket, mut phase0: ClassPacket) -> ClassPacket {
        let mut counted = counts.classes.into_iter().peekable();
        for c in &mut phase0.classes {
            while counted.next_if(|k| k.class_id < c.class_id).is_some() {}
            if let Some(k) = counted.next_if(|k| k.class_id == c.class_id) {
                c.events = k.events;
                c.counts = k.counts;
            }
        }
        phase0.raw_bytes = counts.raw_bytes;
        phase0
    }

    /// The result, `result_bytes` its own encoded size without the two size fields, and the reduction factor
    /// `raw_bytes / result_bytes`.
    fn result(&self, packet: ClassPacket) -> Vec<u8> {
        let classes = packet
            .classes
            .into_iter()
            .map(|c| Class {
                class_id: c.class_id,
                size: size(&c.ranks),
                ranks: c.ranks,
                stats: c.summaries.map(|s| columns::to_stats(&s)).unwrap_or_default(),
                example_event: c.example_event,
                events: c.events,
                counts: c.counts,
            })
            .collect();
        let mut result = ClassResult {
            classes,
            raw_bytes: packet.raw_bytes,
            result_bytes: 0,
            reduction_factor: 0.0,
            scheme: self.selection.scheme().describe(),
            bins: self.bins,
            metric: self.metric as i32,
            ranges: packet.ranges,
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
    /// "bins": 1..=10000 (5), "metric": "exclusive" | "inclusive" | "calls" | "counter",
    /// "summaries": false | true, "values": "round" | "cumulative", "by_app": true | false}`.
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let params = Params::parse(
            params,
            &[
                "scheme",
                "pattern",
                "bins",
                "metric",
                "summaries",
                "values",
                "by_app",
            ],
        )?;
        let scheme = Scheme::from_params(&params, "scheme")?;
        let metric = params.metric()?;
        Ok(ClassifyFilter {
            level,
            values: params.values()?,
            metric,
            summaries: params.bool("summaries", false)?,
            bins: params.u32_between("bins", DEFAULT_BINS, 1, MAX_BINS)?,
            selection: Selection::new(scheme).by_app(params.bool("by_app", true)?),
            buffers: Rounds::new(),
            classes: Rounds::new(),
        })
    }

    canopy_filter_common::three_phase_calls!();

    fn names(&mut self, names: &[(u64, &str)]) {
        self.selection.names(names);
    }
}

export_filter!(ClassifyFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_test::{Collect, encode_one};
    use canopy_wire::v1::{CounterSample, EventSample, RankProfile};

    /// A rank of application "a" whose events have `v` as inclusive time and `v / 2` as exclusive time.
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
                    excl_us: *v / 2.0,
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

    fn id(name: &str) -> u64 {
        canopy_wire::event_id(name)
    }

    /// The class of application a's ranks that select `names` (joined by "\n"), classes being per application
    /// by default.
    fn class(names: &str) -> u64 {
        canopy_wire::event_id(&format!("a\0{names}"))
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
            "unknown parameter \"schema\" (known: scheme, pattern, bins, metric, summaries, values, by_app)"
        );
        assert_eq!(
            err(r#"{"metric": "time"}"#),
            format!(
                "metric must be one of \"exclusive\", \"inclusive\", \"calls\", \"counter\" or a per-event metric \
                 (\"page-faults\", \"page-faults-inclusive\", \"heap\", ...: {}), got \"time\"",
                canopy_wire::event_metrics::metric_words().join(", ")
            )
        );
        assert_eq!(
            err(r#"{"summaries": "yes"}"#),
            "summaries must be true or false, got \"yes\""
        );
        let f = ClassifyFilter::create("", Level::Root).unwrap();
        assert_eq!(
            (f.bins, f.selection.scheme().describe(), f.metric, f.summaries),
            (5, "all".to_string(), Metric::Exclusive, false)
        );
        let f = ClassifyFilter::create(
            r#"{"scheme": "pattern", "pattern": "^MPI_", "metric": "counter", "summaries": true}"#,
            Level::Root,
        )
        .unwrap();
        assert_eq!(
            (f.selection.scheme().describe(), f.metric, f.summaries),
            ("pattern:^MPI_".to_string(), Metric::Counter, true)
        );
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
            profile(0, &[("a", 2.0)]),
            profile(1, &[("a", 10.0)]),
            profile(2, &[("a", 18.0)]),
        ];
        // Both rounds' phase 0 before either's phase 1 and 2, completed in either order.
        for order in [[0, 1], [1, 0]] {
            let res = run_rounds(r#"{"bins": 2}"#, &["a", "b"], &[r0.clone(), r1.clone()], &order);
            let mut ids0: Vec<u64> = vec![class("a"), class("a\nb")];
            ids0.sort();
            assert_eq!(
                res[0].classes.iter().map(|c| c.class_id).collect::<Vec<_>>(),
                ids0
            );
            let c0 = res[0].classes.iter().find(|c| c.class_id == class("a")).unwrap();
            assert_eq!((c0.size, c0.example_event.as_str()), (2, "a"));
            assert_eq!(res[1].classes.len(), 1);
            assert_eq!(members(&res[1]), vec![vec![(0, 2)]]);
            // Exclusive times 1, 5 and 9 in two bins of [1, 9].
            let c = &res[1].classes[0];
            assert_eq!((c.events.clone(), c.counts.clone()), (vec![id("a")], vec![1, 2]));
            let ranges = res[1].ranges.clone().unwrap();
            assert_eq!(
                (ranges.id, ranges.lo, ranges.hi),
                (vec![id("a")], vec![1.0], vec![9.0])
            );
        }
    }

    #[test]
    fn one_range_per_event_serves_every_class() {
        // Class {a}: ranks 0 and 1; class {a, b}: rank 2. Exclusive times of "a": 0, 4 and 8.
        let round = vec![
            profile(0, &[("a", 0.0)]),
            profile(1, &[("a", 8.0)]),
            profile(2, &[("a", 16.0), ("b", 6.0)]),
        ];
        let r = &run_rounds(r#"{"bins": 4}"#, &["a", "b"], &[round], &[0])[0];
        assert_eq!(r.metric, Metric::Exclusive as i32);
        let ranges = r.ranges.clone().unwrap();
        let mut want = [(id("a"), 0.0, 8.0), (id("b"), 3.0, 3.0)];
        want.sort_by_key(|w| w.0);
        assert_eq!(
            (ranges.id, ranges.lo, ranges.hi),
            (
                want.iter().map(|w| w.0).collect(),
                want.iter().map(|w| w.1).collect(),
                want.iter().map(|w| w.2).collect()
            )
        );
        let a_only = r.classes.iter().find(|c| c.class_id == class("a")).unwrap();
        assert_eq!(a_only.events, vec![id("a")]);
        assert_eq!(a_only.counts, vec![1, 0, 1, 0]);
        let a_b = r.classes.iter().find(|c| c.class_id == class("a\nb")).unwrap();
        let counts_of = |event: u64| {
            let i = a_b.events.iter().position(|e| *e == event).unwrap();
            a_b.counts[i * 4..(i + 1) * 4].to_vec()
        };
        // "a" at 8, the top of its range: the last bin. "b" alone: bin 0 of a one-point range.
        assert_eq!(
            (counts_of(id("a")), counts_of(id("b"))),
            (vec![0, 0, 0, 1], vec![1, 0, 0, 0])
        );
        // No summaries unless asked for.
        assert!(r.classes.iter().all(|c| c.stats.is_empty()));
    }

    #[test]
    fn the_metric_parameter_picks_the_values_and_summaries_come_on_request() {
        let p = |rank: u32, calls: u64, counter: f64| {
            encode_one(&RankProfile {
                app: "a".into(),
                rank,
                events: vec![EventSample {
                    event_id: id("a"),
                    calls,
                    incl_us: 100.0,
                    excl_us: f64::NAN,
                    ..Default::default()
                }],
                counters: vec![CounterSample {
                    counter_id: id("bytes"),
                    value: counter,
                    total: counter,
                }],
                ..Default::default()
            })
        };
        let round = vec![p(0, 1, 10.0), p(1, 3, 30.0), p(2, 5, 20.0)];
        let run = |params: &str| run_rounds(params, &["a"], std::slice::from_ref(&round), &[0]).remove(0);

        let calls = run(r#"{"metric": "calls", "bins": 2, "summaries": true}"#);
        assert_eq!(calls.metric, Metric::Calls as i32);
        let c = &calls.classes[0];
        assert_eq!((c.events.clone(), c.counts.clone()), (vec![id("a")], vec![1, 2]));
        assert_eq!(c.stats.len(), 1);
        let s = c.stats[0].summary.clone().unwrap();
        assert_eq!(c.stats[0].metric, Metric::Calls as i32);
        assert_eq!((s.count, s.mean, s.min, s.max), (3, 3.0, 1.0, 5.0));
        assert_eq!((s.min_rank.unwrap().rank, s.max_rank.unwrap().rank), (0, 2));
        assert!((s.std - (8.0f64 / 3.0).sqrt()).abs() < 1e-12, "{}", s.std);

        // Counters are binned by the counter's id; the class is still made of event names.
        let counter = run(r#"{"metric": "counter", "bins": 2}"#);
        let c = &counter.classes[0];
        assert_eq!(c.class_id, class("a"));
        assert_eq!(
            (c.events.clone(), c.counts.clone()),
            (vec![id("bytes")], vec![1, 2])
        );
        assert_eq!(counter.ranges.clone().unwrap().lo, vec![10.0]);

        // Exclusive time is NaN on every rank: left out, so the class has members but no histogram.
        let exclusive = run("{}");
        assert_eq!(exclusive.classes[0].size, 3);
        assert!(exclusive.classes[0].events.is_empty() && exclusive.classes[0].counts.is_empty());
        assert!(exclusive.ranges.clone().unwrap_or_default().id.is_empty());
    }

    /// A leaf's phase-0 packet over `ranks`, and the leaf.
    fn phase0(params: &str, ranks: &[Vec<u8>]) -> (ClassifyFilter, Vec<u8>) {
        let mut leaf = named(params, Level::Leaf, &["a", "b"]);
        let inputs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
        let mut out = Collect::default();
        leaf.upstream(0, 0, &inputs, &mut out).unwrap();
        (leaf, out.up.remove(0).1)
    }

    #[test]
    fn a_rejected_input_is_reported_and_the_rest_merges() {
        let mut leaf = named("{}", Level::Leaf, &["a"]);
        let bad = vec![0x0a, 0x05, 0x01];
        let (p0, p1) = (profile(0, &[("a", 1.0)]), profile(1, &[("a", 2.0)]));
        let mut out = Collect::default();
        leaf.upstream(1, 0, &[&p0, &bad, &p1], &mut out).unwrap();
        assert_eq!(out.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
        let mut relay = ClassifyFilter::create("{}", Level::Relay).unwrap();
        let mut out2 = Collect::default();
        relay.upstream(1, 0, &[&bad, &out.up[0].1], &mut out2).unwrap();
        assert_eq!(out2.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0]);
        let packet = ClassPacket::decode(out2.up[0].1.as_slice()).unwrap();
        assert_eq!(packet.classes.len(), 1);
        assert_eq!(ranks::count(&packet.classes[0].ranks), 2);

        // Every input rejected: the leaf still answers both of its phases.
        let mut out = Collect::default();
        leaf.upstream(2, 0, &[&bad], &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
        let mut out = Collect::default();
        leaf.downstream(2, 1, &[], &mut out).unwrap();
        assert_eq!(out.up.len(), 1);
    }

    /// The rejection a relay gives `bad` next to a good packet, which it still merges.
    fn rejection(params: &str, phase: u32, good: &[u8], bad: &ClassPacket) -> String {
        let mut relay = ClassifyFilter::create(params, Level::Relay).unwrap();
        let mut out = Collect::default();
        relay
            .upstream(0, phase, &[good, &bad.encode_to_vec()], &mut out)
            .unwrap();
        assert_eq!(out.rejects.len(), 1, "{:?}", out.rejects);
        assert_eq!(out.rejects[0].0, 1);
        let merged = ClassPacket::decode(out.up[0].1.as_slice()).unwrap();
        assert_eq!(
            merged,
            ClassPacket::decode(good).unwrap(),
            "the good input merged alone"
        );
        out.rejects[0].1.clone()
    }

    #[test]
    fn malformed_summaries_are_rejected_by_name() {
        let ranks = [profile(0, &[("a", 1.0)]), profile(1, &[("a", 4.0), ("b", 2.0)])];
        let (_, good) = phase0("{}", &ranks);
        let packet = ClassPacket::decode(good.as_slice()).unwrap();
        let prefix = "input is not a canopy.filters.v1.ClassPacket: ";
        let reject = |bad: &ClassPacket| rejection("{}", 0, &good, bad).replace(prefix, "");

        let mut swapped = packet.clone();
        swapped.classes.swap(0, 1);
        let second = swapped.classes[1].class_id;
        assert_eq!(
            reject(&swapped),
            format!("class {second:#018x} at 1 does not follow the previous one (sorted, each once)")
        );
        let mut no_ranks = packet.clone();
        no_ranks.classes[0].ranks.clear();
        assert_eq!(
            reject(&no_ranks),
            format!("class {:#018x} has no ranks", packet.classes[0].class_id)
        );
        let mut short = packet.clone();
        short.ranges.as_mut().unwrap().hi.pop();
        assert_eq!(reject(&short), "ranges: column hi has 1 entries for 2 ids");
        let mut upside_down = packet.clone();
        let r = upside_down.ranges.as_mut().unwrap();
        r.lo[0] = 9.0;
        let (first, hi) = (r.id[0], r.hi[0]);
        assert_eq!(
            reject(&upside_down),
            format!("ranges: event {first:#018x} has the range [9, {hi}] (finite, lo <= hi)")
        );
        let mut summarized = packet.clone();
        summarized.classes[0].summaries = Some(StatsColumns::default());
        assert_eq!(
            reject(&summarized),
            format!(
                "class {:#018x} carries summaries, but this stream's summaries are off",
                packet.classes[0].class_id
            )
        );

        // With summaries on, their columns are checked too.
        let on = r#"{"summaries": true}"#;
        let (_, good) = phase0(on, &ranks);
        let mut bad = ClassPacket::decode(good.as_slice()).unwrap();
        let s = bad.classes[0].summaries.as_mut().unwrap();
        s.mean.clear();
        let rows = s.id.len();
        assert_eq!(
            rejection(on, 0, &good, &bad).replace(prefix, ""),
            format!(
                "class {:#018x}: summaries: column mean has 0 entries for {rows} rows",
                bad.classes[0].class_id
            )
        );
        // A class's summaries are over all its members, never broken down by application.
        let mut by_app = ClassPacket::decode(good.as_slice()).unwrap();
        let s = by_app.classes[0].summaries.as_mut().unwrap();
        s.app = vec![0; s.id.len()];
        assert!(
            rejection(on, 0, &good, &by_app).contains("does not break rows down by application"),
            "{}",
            rejection(on, 0, &good, &by_app)
        );
    }

    #[test]
    fn malformed_counts_are_rejected_by_name_and_bad_ranges_fail_the_leaf() {
        let (mut leaf, up) = phase0(
            r#"{"bins": 3}"#,
            &[profile(0, &[("a", 1.0)]), profile(1, &[("a", 4.0), ("b", 2.0)])],
        );
        let mut root = ClassifyFilter::create(r#"{"bins": 3}"#, Level::Root).unwrap();
        let mut down = Collect::default();
        root.upstream(0, 0, &[&up], &mut down).unwrap();
        let ranges = down.down.remove(0).1;
        let mut out = Collect::default();
        leaf.downstream(0, 1, &ranges, &mut out).unwrap();
        let good = out.up.remove(0).1;
        let packet = ClassPacket::decode(good.as_slice()).unwrap();
        let prefix = "input is not a canopy.filters.v1.ClassPacket: ";
        let reject = |bad: &ClassPacket| rejection(r#"{"bins": 3}"#, 2, &good, bad).replace(prefix, "");

        let two = packet
            .classes
            .iter()
            .find(|c| c.events.len() == 2)
            .unwrap()
            .class_id;
        let mut short = packet.clone();
        short.classes.iter_mut().for_each(|c| {
            if c.class_id == two {
                c.counts.pop();
            }
        });
        assert_eq!(
            reject(&short),
            format!("class {two:#018x} has 5 counts for 2 events of 3 bins")
        );
        let mut unsorted = packet.clone();
        let c = unsorted.classes.iter_mut().find(|c| c.class_id == two).unwrap();
        c.events.swap(0, 1);
        let second = c.events[1];
        assert_eq!(
            reject(&unsorted),
            format!(
                "class {two:#018x}: event {second:#018x} at 1 does not follow the previous one (sorted, each once)"
            )
        );

        // Ranges a leaf cannot bin against fail its call, naming the round.
        let (mut leaf, _) = phase0("{}", &[profile(0, &[("a", 1.0)])]);
        let bad = ClassPacket {
            ranges: Some(BinRanges {
                id: vec![id("a")],
                lo: vec![f64::NAN],
                hi: vec![1.0],
            }),
            ..Default::default()
        };
        let err = leaf
            .downstream(0, 1, &bad.encode_to_vec(), &mut Collect::default())
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "round 0: the phase 1 packet is unusable: ranges: event {:#018x} has the range [NaN, 1] (finite, lo <= hi)",
                id("a")
            )
        );
    }

    #[test]
    fn unknown_names_fall_back_to_hex_ids() {
        let id = canopy_wire::event_id("MPI_Send()");
        let mut leaf = ClassifyFilter::create(r#"{"by_app": false}"#, Level::Leaf).unwrap();
        let p = RankProfile {
            events: vec![EventSample {
                event_id: id,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            leaf.selection.class_of(&p),
            (canopy_wire::event_id(&format!("{id:016x}")), format!("{id:016x}"))
        );
        // Once the name is known, it is used.
        leaf.names(&[(id, "MPI_Send()")]);
        assert_eq!(
            leaf.selection.class_of(&p),
            (canopy_wire::event_id("MPI_Send()"), "MPI_Send()".to_string())
        );
    }

    #[test]
    fn class_id_hashes_sorted_selected_names_of_events_only() {
        let mut leaf = named(
            r#"{"scheme": "pattern", "pattern": "^MPI_", "by_app": false}"#,
            Level::Leaf,
            &["main", "MPI_Send", "MPI_Recv"],
        );
        let ev = |n: &str| EventSample {
            event_id: canopy_wire::event_id(n),
            ..Default::default()
        };
        let p = RankProfile {
            events: vec![ev("main"), ev("MPI_Send"), ev("MPI_Recv"), ev("MPI_Send")],
            counters: vec![CounterSample {
                counter_id: canopy_wire::event_id("MPI_x"),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            leaf.selection.class_of(&p),
            (
                canopy_wire::event_id("MPI_Recv\nMPI_Send"),
                "MPI_Recv".to_string()
            )
        );
        let none = RankProfile {
            events: vec![ev("main")],
            ..Default::default()
        };
        assert_eq!(
            leaf.selection.class_of(&none),
            (canopy_wire::event_id(""), String::new())
        );
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
