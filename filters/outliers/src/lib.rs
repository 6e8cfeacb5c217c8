//! The outliers filter (seed 002, section 4.1): per round, each rank's score, the sum over the events it
//! reports, in each metric scored (exclusive time, calls and counters by default), of its distance from the
//! event's mean in standard deviations (weighted by default by each event's share of its metric), and the `k` ranks (or the `fraction` of the ranks) with the highest scores, each with the
//! events that weigh most in its score. With `"within": "class"` ranks are scored against their functional
//! class (classify's class ids, [`canopy_filter_common::classes`]) and each class gets its own top. Each
//! application's ranks are scored apart (`by_app`, the default): against their own application's means, with
//! their own top, a group per application ([`canopy_filter_common::classes::app_group`]) or per class of it.
//!
//! Computed in the tree, in ToM's three phases ([`canopy_filter_common::three_phase`]), so the root receives
//! O(k), not O(ranks): phase 0 up, per group its rank count and per-event count, mean and m2 (leaves keep their
//! ranks' values); phase 1 down, the global summaries, from which every leaf takes each event's mean and
//! deviation; phase 2 up, each leaf scores its own ranks and sends its top `k`, and relays merge the lists,
//! keeping `k`. Ties are broken by score descending, then app, then rank, so any tree keeps the same ranks.

#![forbid(unsafe_code)]

pub mod groups;
pub mod score;
pub mod settings;
pub mod top;
pub mod window;

use std::collections::BTreeMap;

use canopy_filter_common::classes::{Selection, app_group};
use canopy_filter_common::metrics::Key;
use canopy_filter_common::rounds::Rounds;
use canopy_filter_common::summary::StatsMap;
use canopy_filter_common::three_phase::{self, ThreePhase};
use canopy_filter_common::{columns, decode, metrics};
use canopy_filter_proto::v1::{Outlier, OutlierGroup, OutliersPacket, OutliersResult, RankRef, StatsColumns};
use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use prost::Message;

use crate::groups::Expect;
use crate::score::Moments;
use crate::settings::{Scored, Settings};
use crate::window::Window;

const PACKET: &str = "canopy.filters.v1.OutliersPacket";

/// One rank's values of the metrics scored, for the events scored, sorted by (event id, metric).
#[derive(Debug, Clone)]
struct RankValues {
    app: String,
    rank: u32,
    values: Vec<(Key, f64)>,
}

/// A leaf's ranks of a round, per group (sorted by class id), kept from phase 0 until the means arrive.
#[derive(Debug, Default)]
pub struct Buffer {
    groups: Vec<(u64, Vec<RankValues>)>,
}

/// One instance per stream per node.
#[derive(Debug)]
pub struct OutliersFilter {
    level: Level,
    settings: Settings,
    /// Which events are scored and, at the leaves, the names the host gave (and so the classes).
    selection: Selection,
    /// Leaf: the values of each open round.
    buffers: Rounds<Buffer>,
    /// Leaf: each rank's values of the last rounds, with a window of several.
    window: Window,
    /// Root: each round's merged phase 0 until its tops come up.
    phase0: Rounds<OutliersPacket>,
}

impl OutliersFilter {
    fn expect(&self) -> Expect {
        Expect {
            by_class: self.settings.by_class,
            by_app: self.settings.by_app,
            metric: self.settings.metric,
            top_events: self.settings.top_events,
        }
    }

    /// One group's ranks scored against its moments: the first `keep`, with their weighing events.
    fn score_group(&self, ranks: &[RankValues], moments: &Moments, keep: usize) -> Vec<Outlier> {
        // Scores are cheap; the events of the ranks that stay are worked out once they are known.
        let scored: Vec<(Outlier, &RankValues)> = ranks
            .iter()
            .map(|r| {
                let o = Outlier {
                    app: r.app.clone(),
                    rank: r.rank,
                    score: moments.score(&r.values),
                    events: Vec::new(),
                };
                (o, r)
            })
            .collect();
        let kept = top::select_by(scored, keep, |(o, _)| o);
        let n = self.settings.top_events as usize;
        let several = self.settings.metric == Scored::All;
        kept.into_iter()
            .map(|(mut o, r)| {
                o.events = moments.top_events(&r.values, n, several);
                o
            })
            .collect()
    }
}

impl ThreePhase for OutliersFilter {
    const PACKET: &'static str = PACKET;
    type Packet = OutliersPacket;
    type Buffer = Buffer;
    /// The groups' rank counts and summaries.
    type Summaries = OutliersPacket;
    /// The groups' tops.
    type Counts = OutliersPacket;

    fn level(&self) -> Level {
        self.level
    }

    fn buffers(&mut self) -> &mut Rounds<Buffer> {
        &mut self.buffers
    }

    fn summaries(&mut self) -> &mut Rounds<OutliersPacket> {
        &mut self.phase0
    }

    /// Per group, its rank count and summaries up; its ranks' values buffered.
    fn leaf_summaries(
        &mut self,
        round: u64,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> (OutliersPacket, Buffer) {
        let (profiles, raw_bytes) = decode::profiles(inputs, out);
        let scored = self.settings.metric.metrics();
        let mut groups: BTreeMap<u64, (String, Vec<RankValues>, StatsMap)> = BTreeMap::new();
        for p in &profiles {
            let (class, example) = match (self.settings.by_class, self.settings.by_app) {
                (true, _) => self.selection.class_of(p),
                (false, true) => (app_group(&p.app), String::new()),
                (false, false) => (0, String::new()),
            };
            let mut values = Vec::new();
            for metric in &scored {
                metrics::each_value(p, self.settings.values, *metric, |id, v| {
                    values.push(((id, *metric as i32), v))
                });
            }
            values.retain(|((id, _), _)| self.selection.selects(*id));
            values.sort_by_key(|(key, _)| *key);
            let values = self.window.over(&p.app, p.rank, round, values);
            let (ex, ranks, stats) = groups
                .entry(class)
                .or_insert_with(|| (example.clone(), Vec::new(), StatsMap::new()));
            if example < *ex {
                *ex = example;
            }
            let holder = RankRef {
                app: p.app.clone(),
                rank: p.rank,
            };
            for &(key, v) in &values {
                stats.add(key, v, &holder);
            }
            ranks.push(RankValues {
                app: p.app.clone(),
                rank: p.rank,
                values,
            });
        }
        self.window.forget_before(round);
        let mut packet = OutliersPacket {
            groups: Vec::with_capacity(groups.len()),
            raw_bytes,
        };
        let mut buffer = Buffer::default();
        for (class_id, (example_event, ranks, stats)) in groups {
            let mut summaries = StatsColumns::default();
            columns::from_map(&stats, 0, &mut summaries);
            // Per application, a group's ranks are all of one.
            let app = match (self.settings.by_app, ranks.first()) {
                (true, Some(r)) => r.app.clone(),
                _ => String::new(),
            };
            packet.groups.push(OutlierGroup {
                class_id,
                ranks: ranks.len() as u64,
                example_event,
                summaries: Some(summaries),
                app,
                ..Default::default()
            });
            buffer.groups.push((class_id, ranks));
        }
        (packet, buffer)
    }

    fn merge_summaries(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> OutliersPacket {
        let expect = self.expect();
        let packets: Vec<OutliersPacket> = decode::packets(inputs, PACKET, out, |p: &OutliersPacket| {
            groups::check_summaries(p, expect)
        });
        groups::merge_summaries(&packets)
    }

    fn summaries_packet(&self, merged: &OutliersPacket) -> OutliersPacket {
        merged.clone()
    }

    /// The global summaries down; the examples stay at the root.
    fn ranges_packet(&self, merged: &OutliersPacket) -> OutliersPacket {
        OutliersPacket {
            groups: merged
                .groups
                .iter()
                .map(|g| OutlierGroup {
                    class_id: g.class_id,
                    ranks: g.ranks,
                    summaries: g.summaries.clone(),
                    app: g.app.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_bytes: 0,
        }
    }

    /// The leaf's ranks scored against the global means and deviations; per group its top `keep`.
    fn bin(&mut self, buffer: Buffer, down: OutliersPacket) -> Result<OutliersPacket, String> {
        groups::check_summaries(&down, self.expect())?;
        let mut packet = OutliersPacket::default();
        for (class_id, ranks) in buffer.groups {
            // A group the root did not hear of in phase 0 (this leaf's packet came too late) is not scored:
            // the round's coverage reports its ranks missing.
            let Ok(at) = down.groups.binary_search_by_key(&class_id, |g| g.class_id) else {
                continue;
            };
            let g = &down.groups[at];
            let moments = Moments::of(
                g.summaries.as_ref().unwrap_or(&StatsColumns::default()),
                self.settings.weighted,
                self.settings.margin,
            );
            let keep = self.settings.keep.of(g.ranks);
            packet.groups.push(OutlierGroup {
                class_id,
                keep,
                top: self.score_group(&ranks, &moments, keep as usize),
                app: g.app.clone(),
                ..Default::default()
            });
        }
        Ok(packet)
    }

    fn merge_counts(&self, inputs: &[&[u8]], out: &mut dyn Emit) -> OutliersPacket {
        let expect = self.expect();
        let packets: Vec<OutliersPacket> = decode::packets(inputs, PACKET, out, |p: &OutliersPacket| {
            groups::check_tops(p, expect)
        });
        groups::merge_tops(packets)
    }

    fn counts_packet(&self, counts: OutliersPacket) -> OutliersPacket {
        counts
    }

    /// Every group the root heard of in phase 0, with its rank count, example and top.
    fn root_packet(&self, counts: OutliersPacket, phase0: OutliersPacket) -> OutliersPacket {
        let mut tops: BTreeMap<u64, Vec<Outlier>> =
            counts.groups.into_iter().map(|g| (g.class_id, g.top)).collect();
        let groups = phase0
            .groups
            .into_iter()
            .map(|g| {
                let keep = self.settings.keep.of(g.ranks);
                let top = top::select(tops.remove(&g.class_id).unwrap_or_default(), keep as usize);
                OutlierGroup {
                    class_id: g.class_id,
                    ranks: g.ranks,
                    keep,
                    top,
                    example_event: g.example_event,
                    summaries: None,
                    app: g.app,
                }
            })
            .collect();
        OutliersPacket {
            groups,
            raw_bytes: phase0.raw_bytes,
        }
    }

    fn result(&self, packet: OutliersPacket) -> Vec<u8> {
        let mut groups = packet.groups;
        for g in &mut groups {
            g.summaries = None;
        }
        OutliersResult {
            groups,
            within: self.settings.within().to_string(),
            weighted: self.settings.weighted,
            metric: self.settings.metric.single() as i32,
            metrics: self
                .settings
                .metric
                .metrics()
                .into_iter()
                .map(|m| m as i32)
                .collect(),
            events: self.selection.scheme().describe(),
            raw_bytes: packet.raw_bytes,
            window: self.settings.window,
            margin: self.settings.margin,
            window_stat: match self.settings.window {
                0 | 1 => String::new(),
                _ => self.settings.window_stat.word().to_string(),
            },
        }
        .encode_to_vec()
    }
}

impl Filter for OutliersFilter {
    const NAME: &'static str = "outliers";
    const RESULT_TYPE: &'static str = "canopy.filters.v1.OutliersResult";
    const PHASES: u32 = three_phase::PHASES;

    /// Params: see [`Settings::parse`].
    fn create(params: &str, level: Level) -> Result<Self, String> {
        let settings = Settings::parse(params)?;
        Ok(OutliersFilter {
            level,
            selection: Selection::new(settings.events.clone()).by_app(settings.by_app),
            window: Window::new(settings.window, settings.window_stat),
            settings,
            buffers: Rounds::new(),
            phase0: Rounds::new(),
        })
    }

    canopy_filter_common::three_phase_calls!();

    fn names(&mut self, names: &[(u64, &str)]) {
        self.selection.names(names);
    }
}

export_filter!(OutliersFilter);
