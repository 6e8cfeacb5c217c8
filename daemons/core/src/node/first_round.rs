//! A stream's first round. A stream opened while ranks dump starts at a round that every leaf feeds whole, so its
//! first result is not short of the ranks of a leaf that heard of it one dump later than another:
//!
//! - each leaf keeps the stream's dumps from the first round it has not dumped yet, and tells the root that round
//!   (`StreamReady`, passed up by the relays);
//! - the root takes the highest round of all the leaves as the stream's first round (its spec's `first_round`),
//!   once the leaves that answered hold every rank below it, or at a deadline;
//! - each leaf then feeds the stream what it kept from that round on, and every dump after.
//!
//! A stream opened while no rank dumps gets its first round at once. A leaf keeps at most [`KEPT_ROUNDS`] rounds
//! of a stream's dumps: past them it starts the stream itself at the oldest round it kept (the root may be gone).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Arrival;

/// The most rounds of a stream's dumps a leaf keeps while it waits for the stream's first round.
pub(crate) const KEPT_ROUNDS: usize = 64;

/// How long the root waits for the leaves' rounds before it sets a stream's first round with the answers it has.
pub(crate) const ROOT_WAIT: Duration = Duration::from_secs(1);

/// At a leaf: the streams whose first round the root has not set yet, and their dumps kept meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    streams: HashMap<u32, Kept>,
}

#[derive(Debug)]
struct Kept {
    /// The first round the leaf had not dumped when it heard of the stream: the dumps it keeps are of this round
    /// and later.
    from: u64,
    /// The dumps kept, by round.
    rounds: BTreeMap<u64, Vec<Arrival>>,
}

/// What a leaf does with a dump of a stream.
#[derive(Debug)]
pub(crate) enum Fed {
    /// Into the stream's round now.
    Now(Arrival),
    /// Kept until the stream's first round is set.
    Kept,
    /// Not fed: the round is below the stream's first round (or came before the stream).
    Before,
    /// Kept, and the stream waited too long: it starts now at `from`, with these rounds of dumps kept.
    GaveUp {
        from: u64,
        dumps: Vec<(u64, Vec<Arrival>)>,
    },
}

impl Waiting {
    /// The leaf heard of `stream` with no first round: it keeps the stream's dumps from `from`, the first round it
    /// has not dumped.
    pub(crate) fn wait(&mut self, stream: u32, from: u64) {
        self.streams.entry(stream).or_insert(Kept {
            from,
            rounds: BTreeMap::new(),
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
        kept.rounds.entry(round).or_default().push(arrival);
        if kept.rounds.len() <= KEPT_ROUNDS {
            return Fed::Kept;
        }
        let kept = self.streams.remove(&stream).expect("present");
        let from = kept.rounds.keys().next().copied().unwrap_or(kept.from);
        Fed::GaveUp {
            from,
            dumps: kept.rounds.into_iter().collect(),
        }
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

    /// The streams whose wait ended at `now`, each with the highest round answered (`None`: no leaf answered).
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(u32, Option<u64>)> {
        let due: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, a)| a.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter()
            .map(|id| (id, self.streams.remove(&id).and_then(|a| a.next_round)))
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
            coverage: Coverage::default(),
            payload: bytes::Bytes::new(),
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
    fn a_leaf_that_waits_too_long_starts_the_stream_at_the_oldest_round_it_kept() {
        let mut w = Waiting::default();
        w.wait(3, 4);
        for round in 4..4 + KEPT_ROUNDS as u64 {
            assert!(matches!(w.feed(3, None, round, dump(0)), Fed::Kept));
        }
        match w.feed(3, None, 4 + KEPT_ROUNDS as u64, dump(0)) {
            Fed::GaveUp { from, dumps } => {
                assert_eq!(from, 4);
                assert_eq!(dumps.len(), KEPT_ROUNDS + 1);
            }
            other => panic!("{other:?}"),
        }
        // It no longer waits: a later first round from the root finds nothing kept.
        assert!(w.release(3, 4).is_empty());
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
        assert_eq!(s.due(now + ROOT_WAIT), [(2, Some(7))]);
        s.begin(3, now);
        assert_eq!(s.due(now + ROOT_WAIT), [(3, None)]);
        assert_eq!(s.next_deadline(), None);
    }
}
