//! The engine's sources: the children (or a leaf's ranks) it expects packets from, each with the ranks it answers
//! for, its state (attached, stopped, lost, given up, finished) and the rounds it joined, left or dropped; and the
//! engine's counts of the ranks expected, kept as sources come and go.

use super::*;

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
    pub(super) fn expected_in(self, round: u64) -> bool {
        match self {
            SourceState::Live => true,
            SourceState::Lost | SourceState::Unreachable { .. } => false,
            SourceState::Finished { end } | SourceState::Stopped { end } => round < end,
        }
    }

    /// The end of a finished or stopped source's rounds.
    pub(super) fn end(self) -> Option<u64> {
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
pub(super) struct Source {
    /// The ranks the source answers for in rounds not yet closed: the most it ever reported, less the ranks that
    /// left below it before their first dump.
    pub(super) ranks_below: u32,
    /// The count the source itself reported last (its hello or its latest node event). A report below it means
    /// ranks left below the source before their first dump: `ranks_below` goes down by as many.
    pub(super) reported: u32,
    /// The most ranks the source ever answered for: the bound on the coverage of its packets (a packet of a
    /// round that opened before ranks left still counts them).
    pub(super) ceiling: u32,
    pub(super) state: SourceState,
    /// The first round the source takes part in: a rank that attached (or came back) at its k-th dump is not
    /// waited for in the rounds below k.
    pub(super) from: u64,
    /// Why the rounds below `from` lack it: it was stopped (resumed after a Stop), or not attached (lost).
    pub(super) stopped_before: bool,
    /// Rounds [from, end) whose dumps never left the rank (its SDK's queue was full): not waited for, and
    /// counted as dropped.
    pub(super) dropped: std::collections::VecDeque<(u64, u64)>,
    /// When its last packet arrived.
    pub(super) heard: Option<Instant>,
    /// Ranks taken off this source because the nodes below it that served them were adopted elsewhere, which its
    /// own count still includes until it hears of the adoption: a lower count it reports next takes these off
    /// first, as they are off already.
    pub(super) moved_unheard: u32,
    /// The source came back after its nodes below were adopted elsewhere: what it sends for rounds below this
    /// was held from before its loss, and was sent again by the adopted nodes.
    pub(super) stale_before: Option<u64>,
    /// How its ranks divide among applications, as its latest packet's coverage (or, for a rank, its
    /// attachment) said: the ranks it misses in a round count in their applications' coverage too.
    pub(super) apps: Composition,
    /// Its number in the sets of sources, for as long as it is known.
    pub(super) number: Number,
}

impl Source {
    /// Whether the groups of `round` wait for this source (before its dropped rounds are taken out). A source
    /// that answers for no ranks (a relay whose children are elsewhere, or not there yet) is never waited for.
    pub(super) fn attached_in(&self, round: u64) -> bool {
        self.ranks_below > 0 && round >= self.from && self.state.expected_in(round)
    }

    pub(super) fn expected_in(&self, round: u64) -> bool {
        self.attached_in(round) && !self.dropped_in(round)
    }

    pub(super) fn dropped_in(&self, round: u64) -> bool {
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

impl RoundEngine {
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
    pub(super) fn remember_composition(&mut self, arrival: &Arrival) {
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
            source.apps = arrival.coverage.composition();
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
    pub(super) fn recount(&mut self) {
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

    pub(super) fn earliest_give_up(&self) -> Option<Instant> {
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

    /// `ranks` that a lost source answered for moved under another source (their node was adopted elsewhere
    /// below this node): the lost source answers for as many fewer from now on, so no rank is expected twice.
    pub fn ranks_moved_away(&mut self, id: &str, ranks: u32) {
        if let Some(s) = self.sources.get_mut(id) {
            s.ranks_below = s.ranks_below.saturating_sub(ranks);
            s.moved_unheard = s.moved_unheard.saturating_add(ranks);
        }
        self.recount();
    }
}
