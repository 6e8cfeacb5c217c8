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
mod tests;
