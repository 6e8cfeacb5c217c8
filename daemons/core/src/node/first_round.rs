//! A stream's first round. A stream opened while ranks dump starts at a round that every leaf feeds whole, so its
//! first result is not short of the ranks of a leaf that heard of it one dump later than another:
//!
//! - each leaf keeps the stream's dumps from the first round it has not dumped yet, and tells the root that round
//!   (`StreamReady`, passed up by the relays);
//! - once the leaves that answered hold every rank, the root takes the highest round they answered as the
//!   stream's first round (its spec's `first_round`). At a deadline with answers missing it takes the first round
//!   its window has not admitted: no leaf can have dumped that round, whether or not its answer came;
//! - each leaf then feeds the stream what it kept from that round on, and every dump after.
//!
//! The root alone sets the first round, so every node agrees on it. A stream opened while no rank dumps gets its
//! first round at once. A leaf keeps the payloads of at most [`KEPT_ROUNDS`] rounds of a stream's dumps while it
//! waits: past them the oldest round keeps only which ranks dumped it, and should the stream start at or before
//! that round its ranks count there as dropped. At most [`NOTED_ROUNDS`] rounds are noted at all; a round past
//! that bound and still wanted is short of this leaf's ranks, which its parent counts as late.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use canopy_proto::v1::MissingReason;
use tokio::time::Instant;

use crate::engine::Arrival;

/// The most rounds of a stream's dumps a leaf keeps whole while it waits for the stream's first round.
pub(crate) const KEPT_ROUNDS: usize = 64;

/// The most rounds of a stream a leaf notes while it waits: the whole ones, and the older ones whose payloads it
/// let go.
pub(crate) const NOTED_ROUNDS: usize = 256;

/// How long the root waits for the leaves' rounds before it sets a stream's first round without them.
pub(crate) const ROOT_WAIT: Duration = Duration::from_secs(1);

/// At a leaf: the streams whose first round the root has not set yet, and their dumps kept meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    streams: HashMap<u32, Kept>,
}

#[derive(Debug)]
struct Kept {
    /// The first round the leaf had not dumped when it heard of the stream, then (once rounds are let go
    /// entirely) the oldest round noted: the dumps kept are of this round and later.
    from: u64,
    /// The dumps noted, by round: whole from `whole_from` on, below it without their payloads and with their
    /// ranks counted as dropped.
    rounds: BTreeMap<u64, Vec<Arrival>>,
    whole_from: u64,
}

/// What a leaf does with a dump of a stream.
#[derive(Debug)]
pub(crate) enum Fed {
    /// Into the stream's round now.
    Now(Arrival),
    /// Kept until the stream's first round is set.
    Kept,
    /// Kept, and the stream's oldest whole round let its payloads go: this is the first time for the stream.
    KeptShort { round: u64 },
    /// Not fed: the round is below the stream's first round (or came before the stream).
    Before,
}

impl Waiting {
    /// The leaf heard of `stream` with no first round: it keeps the stream's dumps from `from`, the first round it
    /// has not dumped.
    pub(crate) fn wait(&mut self, stream: u32, from: u64) {
        self.streams.entry(stream).or_insert(Kept {
            from,
            rounds: BTreeMap::new(),
            whole_from: from,
        });
    }

    /// Where a dump of `round` goes for a stream whose first round is `first_round` (`None`: not set yet).
    pub(crate) fn feed(
        &mut self,
        stream: u32,
        first_round: Option<u64>,
        round: u64,
        arrival: Arrival,
    ) -> Fed {
        let Some(kept) = self.streams.get_mut(&stream) else {
            return match first_round {
                Some(first) if round < first => Fed::Before,
                _ => Fed::Now(arrival),
            };
        };
        if round < kept.from {
            return Fed::Before;
        }
        let mut arrival = arrival;
        if round < kept.whole_from {
            let_go(&mut arrival);
        }
        kept.rounds.entry(round).or_default().push(arrival);
        kept.bound()
    }

    /// The root set `stream`'s first round: the dumps kept of that round and later, by round, to feed now.
    pub(crate) fn release(&mut self, stream: u32, first_round: u64) -> Vec<(u64, Vec<Arrival>)> {
        let Some(kept) = self.streams.remove(&stream) else {
            return Vec::new();
        };
        kept.rounds
            .into_iter()
            .filter(|(round, _)| *round >= first_round)
            .collect()
    }

    /// The stream closed: what it kept goes.
    pub(crate) fn forget(&mut self, stream: u32) {
        self.streams.remove(&stream);
    }
}

impl Kept {
    /// Holds the stream to its bounds after a dump was kept: past [`KEPT_ROUNDS`] whole rounds the oldest lets
    /// its payloads go, past [`NOTED_ROUNDS`] the oldest goes.
    fn bound(&mut self) -> Fed {
        let mut short = None;
        while self.rounds.range(self.whole_from..).count() > KEPT_ROUNDS {
            let Some((&round, dumps)) = self.rounds.range_mut(self.whole_from..).next() else {
                break;
            };
            dumps.iter_mut().for_each(let_go);
            if self.whole_from == self.from {
                short = Some(round);
            }
            self.whole_from = round + 1;
        }
        while self.rounds.len() > NOTED_ROUNDS {
            if let Some((round, _)) = self.rounds.pop_first() {
                self.from = round + 1;
            }
        }
        match short {
            Some(round) => Fed::KeptShort { round },
            None => Fed::Kept,
        }
    }
}

/// A kept dump lets its payload go: its rank counts as dropped in the round.
fn let_go(a: &mut Arrival) {
    a.payload = bytes::Bytes::new();
    a.coverage.uncover_all(MissingReason::Dropped);
}

/// At the root: the streams waiting for the leaves' rounds before their first round is set.
#[derive(Debug, Default)]
pub(crate) struct Starting {
    streams: HashMap<u32, Answers>,
}

#[derive(Debug)]
struct Answers {
    /// The highest round the leaves that answered have not dumped.
    next_round: Option<u64>,
    /// The ranks of the leaves that answered.
    ranks: u32,
    deadline: Instant,
}

impl Starting {
    pub(crate) fn begin(&mut self, stream: u32, now: Instant) {
        self.streams.insert(
            stream,
            Answers {
                next_round: None,
                ranks: 0,
                deadline: now + ROOT_WAIT,
            },
        );
    }

    /// A leaf's answer. Once the leaves that answered hold `expected` ranks, the stream's first round: the
    /// highest round they have not dumped.
    pub(crate) fn answer(&mut self, stream: u32, next_round: u64, ranks: u32, expected: u32) -> Option<u64> {
        let a = self.streams.get_mut(&stream)?;
        a.next_round = Some(a.next_round.map_or(next_round, |n| n.max(next_round)));
        a.ranks = a.ranks.saturating_add(ranks);
        if a.ranks < expected {
            return None;
        }
        self.streams.remove(&stream).and_then(|a| a.next_round)
    }

    /// The streams whose wait ended at `now`, each with the ranks its answers held.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(u32, u32)> {
        let due: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, a)| a.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter()
            .filter_map(|id| self.streams.remove(&id).map(|a| (id, a.ranks)))
            .collect()
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.streams.values().map(|a| a.deadline).min()
    }

    pub(crate) fn forget(&mut self, stream: u32) {
        self.streams.remove(&stream);
    }
}

#[cfg(test)]
mod tests {
    use canopy_proto::v1::Coverage;

    use super::*;

    fn dump(rank: u32) -> Arrival {
        Arrival {
            source: format!("app/{rank}"),
            coverage: Coverage::full("app"),
            payload: bytes::Bytes::from_static(b"profile"),
            first_dump_unix_ns: 0,
        }
    }

    fn rounds(dumps: &[(u64, Vec<Arrival>)]) -> Vec<(u64, usize)> {
        dumps.iter().map(|(r, a)| (*r, a.len())).collect()
    }

    #[test]
    fn a_leaf_keeps_a_streams_dumps_from_its_next_round_and_feeds_those_from_the_first_round_set() {
        let mut w = Waiting::default();
        w.wait(1, 10);
        // A dump of a round the leaf had dumped before it heard of the stream feeds nothing.
        assert!(matches!(w.feed(1, None, 9, dump(0)), Fed::Before));
        for (round, rank) in [(10, 0), (10, 1), (11, 0), (12, 1)] {
            assert!(matches!(w.feed(1, None, round, dump(rank)), Fed::Kept));
        }
        // Another stream, not waiting, is fed at once from its first round.
        assert!(matches!(w.feed(2, Some(5), 5, dump(0)), Fed::Now(_)));
        assert!(matches!(w.feed(2, Some(5), 4, dump(0)), Fed::Before));
        // The root chose round 11 (another leaf had dumped round 10): round 10 goes, the rest is fed.
        assert_eq!(rounds(&w.release(1, 11)), [(11, 1), (12, 1)]);
        assert!(matches!(w.feed(1, Some(11), 13, dump(0)), Fed::Now(_)));
        assert!(matches!(w.feed(1, Some(11), 10, dump(1)), Fed::Before));
        assert!(w.release(1, 11).is_empty());
    }

    #[test]
    fn a_leaf_that_waits_long_keeps_its_newest_rounds_whole_and_counts_the_older_ranks_as_dropped() {
        let mut w = Waiting::default();
        w.wait(3, 4);
        for round in 4..4 + KEPT_ROUNDS as u64 {
            assert!(matches!(w.feed(3, None, round, dump(0)), Fed::Kept));
        }
        // One round too many: the oldest lets its payloads go (said once), and a late dump of it lets its own go.
        let newest = 4 + KEPT_ROUNDS as u64;
        assert!(matches!(
            w.feed(3, None, newest, dump(0)),
            Fed::KeptShort { round: 4 }
        ));
        assert!(matches!(w.feed(3, None, newest + 1, dump(0)), Fed::Kept));
        assert!(matches!(w.feed(3, None, 4, dump(1)), Fed::Kept));
        // The stream starts at round 4: both of its dumps feed it without payload, their ranks dropped.
        let released = w.release(3, 4);
        assert_eq!(released.len(), KEPT_ROUNDS + 2);
        let (round, first) = &released[0];
        assert_eq!((*round, first.len()), (4, 2));
        for a in first {
            assert!(a.payload.is_empty());
            assert_eq!((a.coverage.covered, a.coverage.expected), (0, 1));
            assert_eq!(a.coverage.missing_for(MissingReason::Dropped), 1);
            assert!(a.coverage.is_exact());
        }
        assert!(
            released[2..]
                .iter()
                .all(|(_, d)| d.iter().all(|a| a.coverage.covered == 1))
        );
        assert!(w.release(3, 4).is_empty());
    }

    #[test]
    fn a_leaf_notes_no_more_than_its_bound_of_rounds() {
        let mut w = Waiting::default();
        w.wait(5, 0);
        for round in 0..NOTED_ROUNDS as u64 + 10 {
            w.feed(5, None, round, dump(0));
        }
        // The oldest ten went: their dumps are before what the leaf keeps.
        assert!(matches!(w.feed(5, None, 9, dump(1)), Fed::Before));
        let released = w.release(5, 0);
        assert_eq!(released.len(), NOTED_ROUNDS);
        assert_eq!(released[0].0, 10);
        let whole = released.iter().filter(|(_, d)| !d[0].payload.is_empty()).count();
        assert_eq!(whole, KEPT_ROUNDS);
    }

    #[test]
    fn the_root_sets_the_highest_round_once_the_answers_hold_every_rank_or_at_the_deadline() {
        let now = Instant::now();
        let mut s = Starting::default();
        s.begin(1, now);
        s.begin(2, now);
        assert_eq!(s.answer(1, 40, 8, 24), None);
        assert_eq!(s.answer(1, 41, 8, 24), None);
        assert_eq!(s.answer(1, 39, 8, 24), Some(41));
        // Answered: no more waiting on it; an answer for a stream not waiting is ignored.
        assert_eq!(s.answer(1, 50, 24, 24), None);
        assert_eq!(s.next_deadline(), Some(now + ROOT_WAIT));
        assert!(s.due(now).is_empty());
        s.answer(2, 7, 8, 24);
        assert_eq!(s.due(now + ROOT_WAIT), [(2, 8)]);
        s.begin(3, now);
        assert_eq!(s.due(now + ROOT_WAIT), [(3, 0)]);
        assert_eq!(s.next_deadline(), None);
    }
}
