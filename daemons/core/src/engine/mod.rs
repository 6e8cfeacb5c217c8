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

use members::{Members, Number, Numbers};

pub use crate::coverage::{
    Composition, add_coverage, add_missing, add_missing_of, composition, coverage_is_exact, missing_for,
    name_unreachable, uncover_all, uncover_input,
};

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

/// Where a source stands; decides the reason its absent ranks are counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    Live,
    /// Gone for good as far as this node can tell (a rank that hung up, a child unreachable for longer than it
    /// keeps what it sent): its ranks count as lost.
    Lost,
    /// A child node whose link ended without a finish, `since` then: it keeps what it sent for a session hold and
    /// sends it again when it is back, so its ranks count as unreachable (and it is named) until
    /// [`RoundEngine::give_up_unreachable`] takes it for lost.
    Unreachable {
        since: Instant,
    },
    /// Finished: still expected in the rounds below `end` (their later phases), stopped from `end` on.
    Finished {
        end: u64,
    },
    /// Collection stopped at the source (a rank told to stop at its dump): expected below `end`, counted as
    /// stopped from there on, and not finished: it reports again when collection restarts.
    Stopped {
        end: u64,
    },
}

impl SourceState {
    /// Whether a group of `round` waits for a source in this state.
    fn expected_in(self, round: u64) -> bool {
        match self {
            SourceState::Live => true,
            SourceState::Lost | SourceState::Unreachable { .. } => false,
            SourceState::Finished { end } | SourceState::Stopped { end } => round < end,
        }
    }

    /// The end of a finished or stopped source's rounds.
    fn end(self) -> Option<u64> {
        match self {
            SourceState::Finished { end } | SourceState::Stopped { end } => Some(end),
            _ => None,
        }
    }

    /// Lost, or unreachable: gone without a finish.
    pub fn is_gone(self) -> bool {
        matches!(self, SourceState::Lost | SourceState::Unreachable { .. })
    }
}

#[derive(Debug, Clone)]
struct Source {
    /// The ranks the source answers for in rounds not yet closed: the most it ever reported, less the ranks that
    /// left below it before their first dump.
    ranks_below: u32,
    /// The count the source itself reported last (its hello or its latest node event). A report below it means
    /// ranks left below the source before their first dump: `ranks_below` goes down by as many.
    reported: u32,
    /// The most ranks the source ever answered for: the bound on the coverage of its packets (a packet of a
    /// round that opened before ranks left still counts them).
    ceiling: u32,
    state: SourceState,
    /// The first round the source takes part in: a rank that attached (or came back) at its k-th dump is not
    /// waited for in the rounds below k.
    from: u64,
    /// Why the rounds below `from` lack it: it was stopped (resumed after a Stop), or not attached (lost).
    stopped_before: bool,
    /// Rounds [from, end) whose dumps never left the rank (its SDK's queue was full): not waited for, and
    /// counted as dropped.
    dropped: std::collections::VecDeque<(u64, u64)>,
    /// When its last packet arrived.
    heard: Option<Instant>,
    /// Ranks taken off this source because the nodes below it that served them were adopted elsewhere, which its
    /// own count still includes until it hears of the adoption: a lower count it reports next takes these off
    /// first, as they are off already.
    moved_unheard: u32,
    /// The source came back after its nodes below were adopted elsewhere: what it sends for rounds below this
    /// was held from before its loss, and was sent again by the adopted nodes.
    stale_before: Option<u64>,
    /// How its ranks divide among applications, as its latest packet's coverage (or, for a rank, its
    /// attachment) said: the ranks it misses in a round count in their applications' coverage too.
    apps: Composition,
    /// Its number in the sets of sources, for as long as it is known.
    number: Number,
}

impl Source {
    /// Whether the groups of `round` wait for this source (before its dropped rounds are taken out). A source
    /// that answers for no ranks (a relay whose children are elsewhere, or not there yet) is never waited for.
    fn attached_in(&self, round: u64) -> bool {
        self.ranks_below > 0 && round >= self.from && self.state.expected_in(round)
    }

    fn expected_in(&self, round: u64) -> bool {
        self.attached_in(round) && !self.dropped_in(round)
    }

    fn dropped_in(&self, round: u64) -> bool {
        self.dropped
            .iter()
            .any(|(from, end)| *from <= round && round < *end)
    }
}

/// How long a child whose link ended counts as unreachable before it counts as lost: as long as it keeps what it
/// sent for a parent to ask for again.
pub const UNREACHABLE_HOLD: Duration = crate::transport::kept::OLD_SESSION_HOLD;

/// Spans of dropped rounds remembered per source; the oldest is forgotten beyond this.
const DROPPED_SPANS: usize = 256;

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

    /// Adds a source, or revives one that was lost or finished (a restarted child re-attaches under its id).
    pub fn add_source(&mut self, id: &str, ranks_below: u32) {
        self.add_source_from(id, ranks_below, 0);
    }

    /// Adds or revives a source that takes part from round `from` on: rounds below it do not wait for it.
    ///
    /// A source's ranks never shrink within a run: a restarted relay that reports fewer ranks than it had (its
    /// children not back yet) still answers for all of them, and the missing ones count as lost.
    pub fn add_source_from(&mut self, id: &str, ranks_below: u32, from: u64) {
        let (known, ceiling) = self
            .sources
            .get(id)
            .map_or((0, 0), |s| (s.ranks_below, s.ceiling));
        let (dropped, apps, number) = match self.sources.remove(id) {
            Some(s) => (s.dropped, s.apps, s.number),
            None => (Default::default(), Default::default(), self.numbers.give(id)),
        };
        self.sources.insert(
            id.to_string(),
            Source {
                ranks_below: ranks_below.max(known),
                reported: ranks_below,
                ceiling: ceiling.max(ranks_below).max(known),
                state: SourceState::Live,
                from,
                stopped_before: false,
                dropped,
                heard: None,
                moved_unheard: 0,
                stale_before: None,
                apps,
                number,
            },
        );
        self.recount();
    }

    /// Remembers how the source of a whole packet (wait-for-all, phase 0, taken into a group) divides its ranks
    /// among applications, when the packet says so for all of them.
    fn remember_composition(&mut self, arrival: &Arrival) {
        let Some(source) = self.sources.get_mut(&arrival.source) else {
            return;
        };
        let apps = &arrival.coverage.apps;
        let told: u64 = apps.iter().map(|a| u64::from(a.expected)).sum();
        if apps.is_empty() || told != u64::from(arrival.coverage.expected) {
            return;
        }
        // The common case, the same applications as before, costs no allocation.
        let same = apps.len() == source.apps.len()
            && apps
                .iter()
                .zip(&source.apps)
                .all(|(a, (app, n))| a.app == *app && a.expected == *n);
        if !same {
            source.apps = composition(&arrival.coverage);
        }
    }

    /// Says how a source's ranks divide among applications (a rank: its own application, one rank), until its
    /// packets say otherwise.
    pub fn set_composition(&mut self, id: &str, apps: Composition) {
        if let Some(s) = self.sources.get_mut(id) {
            s.apps = apps;
        }
    }

    /// Revives a lost source some of whose nodes below were adopted elsewhere while it was away (a relay that
    /// was stopped, say): it answers for the ranks of `ranks_below` less the adopted ones, takes part from round
    /// `from` on, and what it sends for earlier rounds is stale ([`RoundEngine::is_stale`]). Returns the ranks
    /// taken off, 0 if none were adopted (then it is revived as [`RoundEngine::add_source`] does).
    pub fn rejoin_source(&mut self, id: &str, ranks_below: u32, from: u64) -> u32 {
        let moved = self
            .sources
            .get(id)
            .filter(|s| s.state.is_gone())
            .map_or(0, |s| s.moved_unheard);
        if moved == 0 {
            self.add_source(id, ranks_below);
            return 0;
        }
        // Its count may still include the adopted nodes (it has not heard that they left), or already leave them
        // out (their links to it ended before it came back): either way, what it held from before is stale.
        let still_counted = moved.min(ranks_below);
        let s = self.sources.get_mut(id).expect("a lost source");
        s.ranks_below = ranks_below.saturating_sub(still_counted).max(s.ranks_below);
        s.reported = ranks_below;
        s.ceiling = s.ceiling.max(ranks_below);
        s.moved_unheard = still_counted;
        s.state = SourceState::Live;
        s.from = from;
        s.stopped_before = false;
        s.heard = None;
        s.stale_before = Some(from);
        self.recount();
        moved
    }

    /// Whether a packet of `round` from `id` is stale: sent by a source that came back after its nodes below
    /// were adopted, for a round before it came back. Its ranks were sent again by the adopted nodes.
    pub fn is_stale(&self, id: &str, round: u64) -> bool {
        self.sources
            .get(id)
            .and_then(|s| s.stale_before)
            .is_some_and(|before| round < before)
    }

    /// The round after every round open or closed here: a source that comes back takes part from it on.
    pub fn next_unseen_round(&self) -> u64 {
        let open = self.open.keys().map(|k| k.round + 1).max().unwrap_or(0);
        let closed = self
            .closed
            .values()
            .filter_map(|c| c.exact.last().map(|r| r + 1).or(Some(c.horizon)))
            .max()
            .unwrap_or(0);
        open.max(closed)
    }

    /// Makes a stopped source live again from round `from` on: the rounds it skipped count it as stopped.
    pub fn resume_source(&mut self, id: &str, from: u64) {
        if let Some(s) = self.sources.get_mut(id) {
            s.state = SourceState::Live;
            s.from = from;
            s.stopped_before = true;
        }
        self.recount();
    }

    /// Every source stopped before round `from` is expected again from `from` (a window of rounds tells every
    /// rank to report from its first round, a stopped one too); rounds before it still count it stopped.
    pub fn resume_stopped(&mut self, from: u64) {
        for s in self.sources.values_mut() {
            if let SourceState::Stopped { end } = s.state
                && end <= from
            {
                s.state = SourceState::Live;
                s.from = from;
                s.stopped_before = true;
            }
        }
        self.recount();
    }

    /// A source reports its count of ranks below. A count above its last report grows what it answers for
    /// (children attached; never below what it had: a restarted relay still answers for the children not back
    /// yet). A count below its last report can only mean ranks left below it before their first dump (a node's
    /// count otherwise never goes down within its run): it answers for as many fewer from now on, so rounds not
    /// yet open stop expecting them. Returns whether the count went down.
    pub fn set_ranks_below(&mut self, id: &str, ranks_below: u32) -> bool {
        let Some(s) = self.sources.get_mut(id) else {
            return false;
        };
        let before = s.ranks_below;
        let mut shrunk = false;
        if ranks_below < s.reported {
            let fewer = s.reported - ranks_below;
            // Ranks adopted elsewhere while the source was away are off already.
            let off = fewer.min(s.moved_unheard);
            s.moved_unheard -= off;
            s.ranks_below = s.ranks_below.saturating_sub(fewer - off);
            shrunk = fewer > off;
        } else {
            s.ranks_below = s.ranks_below.max(ranks_below.saturating_sub(s.moved_unheard));
        }
        s.reported = ranks_below;
        s.ceiling = s.ceiling.max(ranks_below);
        let had = s.ranks_below;
        if (before == 0) != (had == 0) {
            // A source that answers for no ranks is not waited for.
            self.recount();
        }
        shrunk
    }

    /// Forgets a source that left before it ever delivered (a rank that hung up or finished before its first
    /// dump): rounds that open from now on do not expect it; the groups open now count it once more, as lost
    /// (they were opened expecting it). Groups that were waiting only for it close now.
    pub fn forget_source(&mut self, id: &str) -> Vec<Closed> {
        let Some(s) = self.sources.remove(id) else {
            return Vec::new();
        };
        for g in self.open.values_mut() {
            let at = g.left.iter().position(|(name, _)| name == id);
            match at {
                // It came back and delivered: its packet counts it.
                Some(at) if g.from.contains(s.number) => {
                    g.left.swap_remove(at);
                }
                Some(at) => g.left[at].1 = s.ranks_below,
                None if !g.from.contains(s.number) && s.ranks_below > 0 => {
                    g.left.push((id.to_string(), s.ranks_below));
                }
                None => {}
            }
        }
        // What it delivered stays in the sets under its number: if it comes back under its name (a relay's
        // child that re-attaches), a group it delivered to counts it, and a resend is a duplicate.
        if self.numbers.retire(s.number) {
            let mut held = Members::default();
            self.open.values().for_each(|g| held.union_with(&g.from));
            self.participants.values().for_each(|p| held.union_with(p));
            self.late_from.values().for_each(|p| held.union_with(p));
            self.numbers.sweep(&held);
        }
        self.recount();
        self.close_ready()
    }

    /// Withdraws a source whose ranks other sources answer for now (the ranks a restarted root awaited, attached
    /// again under their own children): unlike [`RoundEngine::forget_source`], the groups open now do not count
    /// it either, since its ranks are counted under the sources that took them. Groups that waited only for it
    /// close now.
    pub fn withdraw_source(&mut self, id: &str) -> Vec<Closed> {
        if self.sources.remove(id).is_none() {
            return Vec::new();
        }
        for g in self.open.values_mut() {
            g.left.retain(|(name, _)| name != id);
        }
        self.recount();
        self.close_ready()
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

    /// The most ranks a source ever answered for: no packet of it may cover more.
    pub fn ranks_ceiling(&self, id: &str) -> Option<u32> {
        self.sources.get(id).map(|s| s.ceiling)
    }

    pub fn source_state(&self, id: &str) -> Option<SourceState> {
        self.sources.get(id).map(|s| s.state)
    }

    /// The first round a source takes part in.
    pub fn source_from(&self, id: &str) -> Option<u64> {
        self.sources.get(id).map(|s| s.from)
    }

    /// Ranks served below this node, live or not: the `expected` of every round.
    pub fn ranks_expected(&self) -> u32 {
        self.sources
            .values()
            .fold(0u32, |sum, s| sum.saturating_add(s.ranks_below))
    }

    /// The ranks a source answers for, if it is known.
    pub fn ranks_below(&self, id: &str) -> Option<u32> {
        self.sources.get(id).map(|s| s.ranks_below)
    }

    /// Live sources that answer for ranks (one with none has nothing to deliver or finish).
    pub fn live_sources(&self) -> usize {
        self.live
    }

    /// Recomputes the live counts after a source changed state (rare: attach, loss, finish).
    fn recount(&mut self) {
        self.live = self
            .sources
            .values()
            .filter(|s| s.state == SourceState::Live && s.ranks_below > 0)
            .count();
        self.live_from.clear();
        self.finished_ends.clear();
        self.finished_spans.clear();
        for s in self.sources.values().filter(|s| s.ranks_below > 0) {
            match s.state.end() {
                Some(end) if s.from == 0 => *self.finished_ends.entry(end).or_default() += 1,
                Some(end) => self.finished_spans.push((s.from, end)),
                None if s.state == SourceState::Live => *self.live_from.entry(s.from).or_default() += 1,
                None => {}
            }
        }
        let counts: Vec<(GroupKey, usize)> = self
            .open
            .iter()
            .map(|(key, g)| {
                let waited = g.from.iter().filter_map(|n| self.source_numbered(n));
                (*key, waited.filter(|s| self.waits_for(*key, s)).count())
            })
            .collect();
        for (key, n) in counts {
            if let Some(g) = self.open.get_mut(&key) {
                g.live_arrived = n;
            }
        }
    }

    pub fn has_sources(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Whether some source has finished (rather than every absent one being lost).
    /// Sources that are stopped by collection control: attached, but reporting nothing for now.
    pub fn stopped_sources(&self) -> usize {
        self.sources
            .values()
            .filter(|s| matches!(s.state, SourceState::Stopped { .. }))
            .count()
    }

    pub fn any_finished(&self) -> bool {
        self.sources
            .values()
            .any(|s| matches!(s.state, SourceState::Finished { .. }))
    }

    /// Marks a source lost or finished; groups that were waiting only for it close now.
    pub fn set_source_state(&mut self, id: &str, state: SourceState) -> Vec<Closed> {
        if let Some(s) = self.sources.get_mut(id) {
            s.state = state;
        }
        if let SourceState::Unreachable { since } = state {
            let at = since + UNREACHABLE_HOLD;
            self.give_up_at = Some(self.give_up_at.map_or(at, |t| t.min(at)));
        }
        self.recount();
        self.close_ready()
    }

    /// Takes the sources unreachable for [`UNREACHABLE_HOLD`] or longer (what a child keeps for resending is gone
    /// by then) for lost: rounds that close from now on count their ranks as lost. Returns their ids.
    pub fn give_up_unreachable(&mut self, now: Instant) -> Vec<SourceId> {
        let mut given_up = Vec::new();
        for (id, s) in &mut self.sources {
            if let SourceState::Unreachable { since } = s.state
                && now.saturating_duration_since(since) >= UNREACHABLE_HOLD
            {
                s.state = SourceState::Lost;
                given_up.push(id.clone());
            }
        }
        self.give_up_at = self.earliest_give_up();
        given_up
    }

    /// When [`RoundEngine::give_up_unreachable`] is next due (or was, for a source that came back since).
    pub fn next_give_up(&self) -> Option<Instant> {
        self.give_up_at
    }

    fn earliest_give_up(&self) -> Option<Instant> {
        self.sources
            .values()
            .filter_map(|s| match s.state {
                SourceState::Unreachable { since } => Some(since + UNREACHABLE_HOLD),
                _ => None,
            })
            .min()
    }

    /// A source's dumps of rounds [from, end) were dropped before they left it: those rounds do not wait for it
    /// and count its ranks as dropped. Groups that were waiting only for it close now.
    pub fn drop_rounds(&mut self, id: &str, from: u64, end: u64) -> Vec<Closed> {
        let Some(s) = self.sources.get_mut(id) else {
            return Vec::new();
        };
        if from >= end {
            return Vec::new();
        }
        match s.dropped.back_mut() {
            Some(last) if last.1 == from => last.1 = end,
            _ => s.dropped.push_back((from, end)),
        }
        while s.dropped.len() > DROPPED_SPANS {
            s.dropped.pop_front();
        }
        self.any_dropped = true;
        let ready: Vec<GroupKey> = self
            .open
            .iter()
            .filter(|(k, g)| from <= k.round && k.round < end && self.all_live_arrived(**k, g))
            .map(|(k, _)| *k)
            .collect();
        ready.into_iter().map(|k| self.close(k)).collect()
    }

    pub fn open_stream(&mut self, stream: u32, sync: StreamSync) {
        self.streams.insert(stream, sync);
    }

    /// Closes a stream; its open groups are returned closed (partial where sources were missing).
    /// `ranks` that a lost source answered for moved under another source (their node was adopted elsewhere
    /// below this node): the lost source answers for as many fewer from now on, so no rank is expected twice.
    pub fn ranks_moved_away(&mut self, id: &str, ranks: u32) {
        if let Some(s) = self.sources.get_mut(id) {
            s.ranks_below = s.ranks_below.saturating_sub(ranks);
            s.moved_unheard = s.moved_unheard.saturating_add(ranks);
        }
        self.recount();
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
            add_missing(&mut coverage, MissingReason::NotWaited, others);
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
            add_coverage(&mut coverage, &a.coverage);
            // A source that answers for fewer ranks than it has had (a restarted relay whose children are not
            // all back): the others are lost for this round, not forgotten.
            let known = self.sources.get(&a.source).map_or(0, |s| s.ranks_below);
            if a.coverage.expected < known {
                let gone = known - a.coverage.expected;
                coverage.expected += gone;
                add_missing(&mut coverage, MissingReason::Lost, gone);
            }
        }
        for (name, ranks) in &group.left {
            // Back under its name, it counts below as itself: only the ranks it no longer answers for are lost.
            let lost = match self.sources.get(name) {
                Some(s) => ranks.saturating_sub(s.ranks_below),
                None => *ranks,
            };
            coverage.expected = coverage.expected.saturating_add(lost);
            add_missing(&mut coverage, MissingReason::Lost, lost);
        }
        let mut partial = false;
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
            add_missing_of(&mut coverage, reason, s.ranks_below, &s.apps);
            if reason == MissingReason::Unreachable {
                name_unreachable(&mut coverage, id, s.ranks_below);
            }
        }
        if key.phase == 0 {
            self.participants.insert((key.stream, key.round), group.from);
            self.participants_order.push_back((key.stream, key.round));
            while self.participants_order.len() > CLOSED_MEMORY {
                if let Some(k) = self.participants_order.pop_front() {
                    self.participants.remove(&k);
                    self.late_from.remove(&k);
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
