//! The round engine: groups packets by (stream, round, phase) and decides when each group closes.
//!
//! It is synchronous and clock-agnostic (the caller passes `now`), so the coverage rules can be property-tested
//! without a runtime. A group closes when every live source has delivered (wait-for-all), when its time-out
//! expires, or at once (don't-wait). The time-out is for silence, not for being behind: a group past its time-out
//! still waits while a source it lacks was heard within the time-out (delivering older rounds under load; the
//! window of rounds in flight bounds how far behind it can be), and closes once every source it lacks has been
//! silent that long. Every expected rank of a closed group is either covered or counted under
//! exactly one missing reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use canopy_proto::v1::{Coverage, MissingReason, SyncMode};
use tokio::time::Instant;

mod members;
mod sources;

use members::{Members, Number, Numbers};
use sources::Source;
pub use sources::{SourceState, UNREACHABLE_HOLD};

pub use canopy_proto::coverage::Composition;

/// Identifies a source of packets: a child node, or a rank at the leaf agent.
pub type SourceId = String;

/// The key of one group of packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub stream: u32,
    pub round: u64,
    pub phase: u32,
}

/// How a stream synchronizes its rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSync {
    pub mode: SyncMode,
    pub timeout: Duration,
}

/// One arrived packet.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub source: SourceId,
    pub coverage: Coverage,
    /// Shared, not copied, when one rank's dump feeds several streams.
    pub payload: bytes::Bytes,
    pub first_dump_unix_ns: u64,
}

#[derive(Debug)]
struct OpenGroup {
    arrived: Vec<Arrival>,
    from: Members,
    /// Sources forgotten while this group was open, before they delivered to it, with their ranks then: it still
    /// counts them, as lost; one that is back under its name when the group closes counts as itself, and only
    /// the ranks it no longer answers for as lost. At most one entry per name, for as long as the group is open.
    left: Vec<(SourceId, u32)>,
    /// How many of the arrivals come from sources this group waits for; compared with the number of such
    /// sources, so completion is checked without walking the sources per packet.
    live_arrived: usize,
    deadline: Instant,
}

/// A closed round that counted a source's ranks late or unreachable, though the source finished before it (its
/// rounds ended earlier): none of its ranks was in the round, so they count as stopped there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recount {
    pub stream: u32,
    pub round: u64,
    /// How the round counted the source's ranks: `Late` or `Unreachable`.
    pub counted: MissingReason,
    pub ranks: u32,
    pub source: String,
    /// The ranks by application, when the round's coverage split them so (else empty).
    pub apps: Composition,
}

/// A source a closed round counted without its data: its number, the reason its ranks were counted under
/// (`Late` or `Unreachable`), how many, and their applications (as the round's coverage split them).
type Absent = (Number, MissingReason, u32, Composition);

/// A group that closed: its inputs, in arrival order, and the merged coverage.
#[derive(Debug)]
pub struct Closed {
    pub key: GroupKey,
    pub inputs: Vec<Arrival>,
    pub coverage: Coverage,
    pub first_dump_unix_ns: u64,
    /// True when some live source had not delivered (closed by time-out or by a drain).
    pub partial: bool,
}

/// What became of an accepted packet.
#[derive(Debug)]
pub enum Accepted {
    /// Waiting for more sources.
    Pending,
    /// The packet completed its group (or the stream does not wait).
    Closed(Closed),
    /// The group had closed already: the packet is handed back so the caller can forward or record it.
    Late(Arrival),
    /// The group had closed already with this source's data in it (or its late packet): a copy sent again after
    /// a broken link, which counts once.
    Again,
}

/// Engine errors: a packet the engine cannot place.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("packet from unknown source {0}")]
    UnknownSource(String),
    #[error("packet for stream {0}, which is not open")]
    UnknownStream(u32),
    #[error("source {source_id} sent round {round} phase {phase} of stream {stream} twice")]
    Duplicate {
        source_id: String,
        stream: u32,
        round: u64,
        phase: u32,
    },
    #[error(
        "source {source_id} sent phase {phase} of round {round} of stream {stream}, but the round's phase 0 did not \
         close here: a later phase answers a packet this node sent down"
    )]
    NoFirstPhase {
        source_id: String,
        stream: u32,
        round: u64,
        phase: u32,
    },
}

/// How many closed rounds per (stream, phase) are remembered exactly to tell late packets from new ones.
const CLOSED_MEMORY: usize = 4096;

#[derive(Debug, Default)]
struct ClosedRounds {
    exact: BTreeSet<u64>,
    /// Every round below this is treated as closed.
    horizon: u64,
    /// Every round below this is closed (at least `horizon`): kept as rounds close, so the lowest round not
    /// closed is known without walking the rounds remembered.
    contiguous: u64,
}

impl ClosedRounds {
    fn contains(&self, round: u64) -> bool {
        round < self.horizon || self.exact.contains(&round)
    }

    fn insert(&mut self, round: u64) {
        self.exact.insert(round);
        while self.exact.len() > CLOSED_MEMORY {
            if let Some(r) = self.exact.pop_first() {
                self.horizon = self.horizon.max(r + 1);
            }
        }
        self.contiguous = self.contiguous.max(self.horizon);
        while self.contains(self.contiguous) {
            self.contiguous += 1;
        }
    }
}

/// Counters the node reports in its status.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Rounds that closed here: a round number counts once, whatever its streams and phases, so the rate of
    /// this count is the tree's rounds per second.
    pub closed: u64,
    /// Streams' rounds closed without every source below (in any of their phases; each counts once).
    pub partial: u64,
    /// Rank-rounds in the first phase of the groups closed here: covered, and missing by reason (indexed by the
    /// `MissingReason` number).
    pub covered_ranks: u64,
    pub missing_ranks: [u64; MISSING_REASONS],
    pub late_packets: u64,
    pub late_ranks: u64,
}

/// The round engine of one node.
#[derive(Debug, Default)]
pub struct RoundEngine {
    sources: BTreeMap<SourceId, Source>,
    streams: HashMap<u32, StreamSync>,
    open: BTreeMap<GroupKey, OpenGroup>,
    closed: HashMap<(u32, u32), ClosedRounds>,
    /// Per stream, the rounds an earlier run of this root closed and stored: every round below is closed here.
    resumed: HashMap<u32, u64>,
    stats: EngineStats,
    live: usize,
    /// Live sources by their first round (almost always 0).
    live_from: BTreeMap<u64, usize>,
    /// Finished and stopped sources by the end of their rounds: those still waited for in earlier rounds.
    finished_ends: BTreeMap<u64, usize>,
    /// Finished and stopped sources that joined late: (from, end), rarely any.
    finished_spans: Vec<(u64, u64)>,
    /// The sources whose phase-0 packet made each round: the later phases of a round (a histogram's counts)
    /// wait for these only, so every phase of a round describes the same ranks.
    participants: HashMap<(u32, u64), Members>,
    /// The sources' numbers in `participants` and the open groups.
    numbers: Numbers,
    participants_order: std::collections::VecDeque<(u32, u64)>,
    /// The sources whose late phase-0 packet reached each of the rounds in `participants`: a second copy counts
    /// no more.
    late_from: HashMap<(u32, u64), Members>,
    /// The sources each of the rounds in `participants` counted late or unreachable, with their ranks: one that
    /// finishes before such a round was never in it ([`RoundEngine::finished_before`]).
    absent: HashMap<(u32, u64), Vec<Absent>>,
    /// When the earliest unreachable source is due to count as lost.
    give_up_at: Option<Instant>,
    /// Some source has dropped rounds (rare): only then do the waited-for counts look at them.
    any_dropped: bool,
    /// The latest round numbers that closed a group here, so each counts once in `stats.closed`.
    rounds_counted: BTreeSet<u64>,
    /// The latest (stream, round) that closed a group partial here, so each counts once in `stats.partial`.
    partials_counted: BTreeSet<(u32, u64)>,
}

/// Room for every `MissingReason` number in [`EngineStats::missing_ranks`].
pub const MISSING_REASONS: usize = 16;

/// How many of the latest closed round numbers the engine remembers, so a round's other streams and phases do
/// not count it again: far more than the rounds in flight at once.
const ROUNDS_REMEMBERED: usize = 4096;

impl RoundEngine {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Closes every open group that has all it waits for (after the sources changed).
    fn close_ready(&mut self) -> Vec<Closed> {
        let ready: Vec<GroupKey> = self
            .open
            .iter()
            .filter(|(k, g)| self.all_live_arrived(**k, g))
            .map(|(k, _)| *k)
            .collect();
        ready.into_iter().map(|k| self.close(k)).collect()
    }

    pub fn open_stream(&mut self, stream: u32, sync: StreamSync) {
        self.streams.insert(stream, sync);
    }

    /// A stream continued from an earlier run of this root, whose rounds below `below` were closed and stored
    /// then: their packets are late here, so no round is stored twice.
    pub fn closed_below(&mut self, stream: u32, below: u64) {
        self.resumed.insert(stream, below);
    }

    pub fn close_stream(&mut self, stream: u32) -> Vec<Closed> {
        let keys: Vec<GroupKey> = self.open.keys().filter(|k| k.stream == stream).copied().collect();
        let out = keys.into_iter().map(|k| self.close(k)).collect();
        self.streams.remove(&stream);
        self.closed.retain(|(s, _), _| *s != stream);
        self.resumed.remove(&stream);
        out
    }

    pub fn has_open_groups(&self) -> bool {
        !self.open.is_empty()
    }

    /// The lowest round still open, if any: the bottom of the window of rounds in flight.
    pub fn lowest_open_round(&self) -> Option<u64> {
        self.open.keys().map(|k| k.round).min()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.open.values().map(|g| g.deadline).min()
    }

    /// Counts the rank-rounds of a group that closed (its first phase: later ones describe the same ranks).
    fn count_ranks(&mut self, key: GroupKey, coverage: &Coverage) {
        if key.phase != 0 {
            return;
        }
        self.stats.covered_ranks += u64::from(coverage.covered);
        for m in &coverage.missing {
            if let Some(n) = usize::try_from(m.reason)
                .ok()
                .and_then(|r| self.stats.missing_ranks.get_mut(r))
            {
                *n += u64::from(m.ranks);
            }
        }
    }

    /// Counts a round that closed a group, once whatever its streams and phases.
    fn count_round(&mut self, round: u64) {
        if self.rounds_counted.insert(round) {
            self.stats.closed += 1;
            if self.rounds_counted.len() > ROUNDS_REMEMBERED {
                self.rounds_counted.pop_first();
            }
        }
    }

    /// Places one packet.
    pub fn accept(&mut self, key: GroupKey, arrival: Arrival, now: Instant) -> Result<Accepted, EngineError> {
        let Some(source) = self.sources.get_mut(&arrival.source) else {
            return Err(EngineError::UnknownSource(arrival.source));
        };
        source.heard = Some(now);
        let source_number = source.number;
        let sync = *self
            .streams
            .get(&key.stream)
            .ok_or(EngineError::UnknownStream(key.stream))?;
        if self
            .closed
            .get(&(key.stream, key.phase))
            .is_some_and(|c| c.contains(key.round))
            || self
                .resumed
                .get(&key.stream)
                .is_some_and(|below| key.round < *below)
        {
            // A source's data counts once in a round: what it delivered in time, or its first late packet. (A
            // copy sent again after a broken link, whose first copy was still on its way.)
            if key.phase == 0 && self.participants.contains_key(&(key.stream, key.round)) {
                let delivered = self.participants[&(key.stream, key.round)].contains(source_number);
                let late = self.late_from.entry((key.stream, key.round)).or_default();
                if delivered || !late.insert(source_number) {
                    return Ok(Accepted::Again);
                }
            }
            self.stats.late_packets += 1;
            self.stats.late_ranks += u64::from(arrival.coverage.covered);
            return Ok(Accepted::Late(arrival));
        }
        if sync.mode == SyncMode::DontWait {
            // Each arrival is its own group; the round is never marked closed, so later pieces are not late.
            // The piece accounts for every rank below this node: the other sources' ranks were not waited for.
            self.count_round(key.round);
            let mut coverage = arrival.coverage.clone();
            let others = self.ranks_expected().saturating_sub(coverage.expected);
            coverage.expected += others;
            coverage.add_missing(MissingReason::NotWaited, others);
            self.count_ranks(key, &coverage);
            let first = arrival.first_dump_unix_ns;
            return Ok(Accepted::Closed(Closed {
                key,
                inputs: vec![arrival],
                coverage,
                first_dump_unix_ns: first,
                partial: false,
            }));
        }
        if key.phase > 0 {
            let Some(participants) = self.later_phase_participants(key) else {
                // Nothing went down for this round, so nothing may answer it: a later phase cannot open a round.
                return Err(EngineError::NoFirstPhase {
                    source_id: arrival.source,
                    stream: key.stream,
                    round: key.round,
                    phase: key.phase,
                });
            };
            if !participants.contains(source_number) {
                // Its phase 0 missed the round here, so the round's result does not count its ranks: later
                // phases from it are late too, or the phases would describe different ranks.
                self.stats.late_packets += 1;
                self.stats.late_ranks += u64::from(arrival.coverage.covered);
                return Ok(Accepted::Late(arrival));
            }
        }
        if key.phase == 0 {
            self.remember_composition(&arrival);
        }
        let waits = self
            .sources
            .get(&arrival.source)
            .is_some_and(|s| self.waits_for(key, s));
        let group = self.open.entry(key).or_insert_with(|| OpenGroup {
            arrived: Vec::new(),
            from: Members::default(),
            left: Vec::new(),
            live_arrived: 0,
            deadline: now + sync.timeout,
        });
        if group.from.contains(source_number) {
            return Err(EngineError::Duplicate {
                source_id: arrival.source,
                stream: key.stream,
                round: key.round,
                phase: key.phase,
            });
        }
        if waits {
            group.live_arrived += 1;
        }
        group.from.insert(source_number);
        group.arrived.push(arrival);
        let group = &self.open[&key];
        if self.all_live_arrived(key, group) {
            Ok(Accepted::Closed(self.close(key)))
        } else {
            Ok(Accepted::Pending)
        }
    }

    /// Closes every group whose time-out has passed and whose missing sources have all been silent for it; a
    /// group that lacks a source heard more recently waits until the time-out after that source was last heard.
    pub fn expire(&mut self, now: Instant) -> Vec<Closed> {
        let due: Vec<(GroupKey, Option<Instant>)> = self
            .open
            .iter()
            .filter(|(_, g)| g.deadline <= now)
            .map(|(k, g)| (*k, self.last_heard_missing(*k, g)))
            .collect();
        let mut closed = Vec::new();
        for (key, heard) in due {
            let timeout = self
                .streams
                .get(&key.stream)
                .map_or(Duration::ZERO, |s| s.timeout);
            match heard.map(|h| h + timeout).filter(|&later| later > now) {
                Some(later) => self.open.get_mut(&key).expect("a due group is open").deadline = later,
                None => closed.push(self.close(key)),
            }
        }
        closed
    }

    /// When a source the group waits for and lacks was last heard (the latest of them); `None` if none was.
    fn last_heard_missing(&self, key: GroupKey, group: &OpenGroup) -> Option<Instant> {
        self.sources
            .iter()
            .filter(|(_, s)| !group.from.contains(s.number) && self.waits_for(key, s))
            .filter_map(|(_, s)| s.heard)
            .max()
    }

    /// Closes every open group now, as a drain does.
    pub fn close_all(&mut self) -> Vec<Closed> {
        let keys: Vec<GroupKey> = self.open.keys().copied().collect();
        keys.into_iter().map(|k| self.close(k)).collect()
    }

    fn all_live_arrived(&self, key: GroupKey, group: &OpenGroup) -> bool {
        if let Some(p) = self.later_phase_participants(key) {
            let expected = p
                .iter()
                .filter_map(|n| self.source_numbered(n))
                .filter(|s| s.expected_in(key.round));
            return group.live_arrived == expected.count();
        }
        group.live_arrived == self.waited_in(key.round)
    }

    /// How many sources a phase-0 group of `round` waits for (those `expected_in` it).
    fn waited_in(&self, round: u64) -> usize {
        let live: usize = self.live_from.range(..=round).map(|(_, n)| n).sum();
        let finished: usize = self
            .finished_ends
            .range(round.saturating_add(1)..)
            .map(|(_, n)| n)
            .sum();
        let spans = self
            .finished_spans
            .iter()
            .filter(|(from, end)| *from <= round && round < *end)
            .count();
        let dropped = if self.any_dropped {
            self.sources
                .values()
                .filter(|s| s.attached_in(round) && s.dropped_in(round))
                .count()
        } else {
            0
        };
        live + finished + spans - dropped
    }

    /// For a later phase of a round whose phase 0 closed here: the sources that took part in it.
    fn later_phase_participants(&self, key: GroupKey) -> Option<&Members> {
        if key.phase == 0 {
            return None;
        }
        self.participants.get(&(key.stream, key.round))
    }

    /// Whether the group `key` waits for the source `s`.
    fn waits_for(&self, key: GroupKey, s: &Source) -> bool {
        s.expected_in(key.round)
            && self
                .later_phase_participants(key)
                .is_none_or(|p| p.contains(s.number))
    }

    /// The source holding the number `n`.
    fn source_numbered(&self, n: Number) -> Option<&Source> {
        self.numbers.name(n).and_then(|id| self.sources.get(id))
    }

    /// `source` finished with its rounds ending at `end`: the closed rounds from `end` on that counted its ranks
    /// late or unreachable (as far as this node remembers), and that it sent nothing late to, had none of its
    /// ranks in them. Each is returned once, to be recounted as stopped.
    pub fn finished_before(&mut self, source: &str, end: u64) -> Vec<Recount> {
        let Some(number) = self.sources.get(source).map(|s| s.number) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (&(stream, round), absent) in self.absent.iter_mut().filter(|((_, round), _)| *round >= end) {
            if self
                .late_from
                .get(&(stream, round))
                .is_some_and(|l| l.contains(number))
            {
                continue;
            }
            absent.retain_mut(|(n, counted, ranks, apps)| {
                if *n != number {
                    return true;
                }
                out.push(Recount {
                    stream,
                    round,
                    counted: *counted,
                    ranks: *ranks,
                    source: source.to_string(),
                    apps: std::mem::take(apps),
                });
                false
            });
        }
        out.sort_by_key(|r| (r.stream, r.round));
        out
    }

    /// The rounds of `stream` whose phase 0 `source` delivered here, as far as this node remembers (the open
    /// rounds, and the last closed ones), and every round an earlier run of this root stored (a restart on its
    /// store): spans `[from, end)`, ascending. Rounds of a stream that does not wait are never grouped, so none
    /// is known for it.
    pub fn delivered_by(&self, source: &str, stream: u32) -> Vec<(u64, u64)> {
        // Rounds an earlier run of this root stored are closed with what they had: sent again, a child's packet
        // of one would count its ranks twice.
        let stored = self.resumed.get(&stream).map(|below| (0, *below));
        let known = self.sources.get(source).map(|s| s.number);
        let Some(source) = known.or_else(|| self.numbers.retired(source)) else {
            return stored.into_iter().filter(|(_, end)| *end > 0).collect();
        };
        let closed = self
            .participants
            .iter()
            .filter(|((s, _), from)| *s == stream && from.contains(source))
            .map(|((_, round), _)| *round);
        let open = self
            .open
            .iter()
            .filter(|(k, g)| k.stream == stream && k.phase == 0 && g.from.contains(source))
            .map(|(k, _)| k.round);
        let below = stored.map_or(0, |(_, end)| end);
        let mut rounds: Vec<u64> = closed.chain(open).filter(|r| *r >= below).collect();
        rounds.sort_unstable();
        rounds.dedup();
        let mut spans: Vec<(u64, u64)> = stored.into_iter().filter(|(_, end)| *end > 0).collect();
        for r in rounds {
            match spans.last_mut() {
                Some((_, end)) if *end == r => *end = r + 1,
                _ => spans.push((r, r + 1)),
            }
        }
        spans
    }

    /// The lowest round that has not closed here in every stream that groups its rounds (`None` without such a
    /// stream): every round below it closed in each of them, whatever order they closed in.
    pub fn lowest_unclosed_round(&self) -> Option<u64> {
        self.streams
            .iter()
            .filter(|(_, sync)| sync.mode != SyncMode::DontWait)
            .map(|(id, _)| {
                let mut r = self.resumed.get(id).copied().unwrap_or(0);
                if let Some(closed) = self.closed.get(&(*id, 0)) {
                    r = r.max(closed.contiguous);
                    for c in closed.exact.range(r..) {
                        if *c != r {
                            break;
                        }
                        r += 1;
                    }
                }
                let open = self
                    .open
                    .keys()
                    .filter(|k| k.stream == *id)
                    .map(|k| k.round)
                    .min();
                open.map_or(r, |o| o.min(r))
            })
            .min()
    }

    /// Whether a stream groups its rounds (waits for its sources), rather than merging each arrival at once.
    pub fn groups_rounds(&self, stream: u32) -> bool {
        self.streams
            .get(&stream)
            .is_some_and(|s| s.mode != SyncMode::DontWait)
    }

    /// The sources that took part in phase 0 of a round, if it closed here (a node sends a round's later
    /// packets down to these only).
    pub fn participants(&self, stream: u32, round: u64) -> Option<Vec<&str>> {
        let p = self.participants.get(&(stream, round))?;
        Some(p.iter().filter_map(|n| self.numbers.name(n)).collect())
    }

    fn close(&mut self, key: GroupKey) -> Closed {
        let group = self.open.remove(&key).expect("closing a group that is open");
        self.closed
            .entry((key.stream, key.phase))
            .or_default()
            .insert(key.round);
        let mut coverage = Coverage::default();
        for a in &group.arrived {
            coverage.add(&a.coverage);
            // A source that answers for fewer ranks than it has had (a restarted relay whose children are not
            // all back): the others are lost for this round, not forgotten.
            let known = self.sources.get(&a.source).map_or(0, |s| s.ranks_below);
            if a.coverage.expected < known {
                let gone = known - a.coverage.expected;
                coverage.expected += gone;
                coverage.add_missing(MissingReason::Lost, gone);
            }
        }
        for (name, ranks) in &group.left {
            // Back under its name, it counts below as itself: only the ranks it no longer answers for are lost.
            let lost = match self.sources.get(name) {
                Some(s) => ranks.saturating_sub(s.ranks_below),
                None => *ranks,
            };
            coverage.expected = coverage.expected.saturating_add(lost);
            coverage.add_missing(MissingReason::Lost, lost);
        }
        let mut partial = false;
        let mut absent = Vec::new();
        for (id, s) in &self.sources {
            if group.from.contains(s.number) {
                continue;
            }
            let reason = match s.state {
                _ if s.attached_in(key.round) && s.dropped_in(key.round) => MissingReason::Dropped,
                _ if s.expected_in(key.round) => {
                    partial = true;
                    MissingReason::Late
                }
                // Not attached yet in this round (a rank that came back after it was lost), or stopped then.
                _ if key.round < s.from && s.stopped_before => MissingReason::Stopped,
                _ if key.round < s.from => MissingReason::Lost,
                SourceState::Lost => MissingReason::Lost,
                SourceState::Unreachable { .. } => MissingReason::Unreachable,
                _ => MissingReason::Stopped,
            };
            coverage.add_missing_of(reason, s.ranks_below, &s.apps);
            if matches!(reason, MissingReason::Late | MissingReason::Unreachable) && s.ranks_below > 0 {
                // As `add_missing_of` split them: by application only when the applications account for them all.
                let split =
                    s.apps.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() == u64::from(s.ranks_below);
                let apps = if split { s.apps.clone() } else { Composition::new() };
                absent.push((s.number, reason, s.ranks_below, apps));
            }
            if reason == MissingReason::Unreachable {
                coverage.name_unreachable(id, s.ranks_below);
            }
        }
        if key.phase == 0 {
            self.participants.insert((key.stream, key.round), group.from);
            if !absent.is_empty() {
                self.absent.insert((key.stream, key.round), absent);
            }
            self.participants_order.push_back((key.stream, key.round));
            while self.participants_order.len() > CLOSED_MEMORY {
                if let Some(k) = self.participants_order.pop_front() {
                    self.participants.remove(&k);
                    self.late_from.remove(&k);
                    self.absent.remove(&k);
                }
            }
        }
        self.count_round(key.round);
        self.count_ranks(key, &coverage);
        if partial && self.partials_counted.insert((key.stream, key.round)) {
            // A stream's round counts once, whichever of its phases closed without every source.
            self.stats.partial += 1;
            if self.partials_counted.len() > ROUNDS_REMEMBERED {
                self.partials_counted.pop_first();
            }
        }
        let first_dump_unix_ns = group
            .arrived
            .iter()
            .map(|a| a.first_dump_unix_ns)
            .filter(|t| *t > 0)
            .min()
            .unwrap_or(0);
        Closed {
            key,
            inputs: group.arrived,
            coverage,
            first_dump_unix_ns,
            partial,
        }
    }
}

#[cfg(test)]
mod tests;
