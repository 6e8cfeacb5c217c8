//! When a leaf whose ranks have finished says Fin: at the pace of its rounds.
//!
//! A parallel program's ranks finish together, right after their last dump, so every leaf of the tree would say Fin
//! while that last round is still on its way up. The Fins, the node events they raise at every level and the
//! front-end's store writes for them would then share the nodes' cores with the last round: on the peer kit's tree of
//! 16 agents of 4 ranks under 4 relays, on two cores, they added about 2 ms of CPU to it, and its latency grew by a
//! third. A leaf therefore holds its Fin until its next round would have closed (its last round's close plus the gap
//! between its last two rounds, at most [`MAX_HOLD`]): the tree is between rounds then, as it is at every round's
//! end. The run ends that much later. Until the Fin arrives the parent counts the leaf's ranks as live: when other
//! leaves have already delivered a later round (an application that runs ahead of another, in rounds that are not
//! time rounds), that round waits at the parent for the Fin, for the hold at most.

use std::time::Duration;

use tokio::time::Instant;

/// The longest a Fin is held: rounds a second or more apart need no more for their last round to arrive.
pub(crate) const MAX_HOLD: Duration = Duration::from_millis(250);

/// A leaf's rounds as their Fin paces them: when the last one closed, and how far apart they came.
#[derive(Debug, Default)]
pub(crate) struct FinPace {
    /// The highest round closed here and when.
    last: Option<(u64, Instant)>,
    /// The time between two rounds, from the last two closes (per round, if rounds were skipped between them).
    gap: Option<Duration>,
    /// The Fin is held until then.
    held: Option<Instant>,
}

impl FinPace {
    /// Round `round` closed here at `now` (a round closed again for another stream, or an older one, changes
    /// nothing).
    pub(crate) fn closed(&mut self, round: u64, now: Instant) {
        match self.last {
            Some((last, _)) if round <= last => {}
            Some((last, at)) => {
                let rounds = u32::try_from(round - last).unwrap_or(u32::MAX);
                self.gap = Some(now.saturating_duration_since(at) / rounds);
                self.last = Some((round, now));
            }
            None => self.last = Some((round, now)),
        }
    }

    /// A Fin could go at `now`: whether it waits (until [`FinPace::deadline`]).
    pub(crate) fn hold(&mut self, now: Instant) -> bool {
        self.held = self.hold_until(now);
        self.held.is_some()
    }

    /// The Fin cannot go (a rank attached, a round opened): nothing is held.
    pub(crate) fn release(&mut self) {
        self.held = None;
    }

    /// When a held Fin may go.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.held
    }

    /// Until when a Fin that could go at `now` waits; `None`: it goes now (no two rounds closed here yet, or the
    /// next round's time has passed).
    fn hold_until(&self, now: Instant) -> Option<Instant> {
        let (_, at) = self.last?;
        let due = at + self.gap?.min(MAX_HOLD);
        (due > now).then_some(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fin_waits_for_the_time_the_next_round_would_have_closed() {
        let t0 = Instant::now();
        let mut pace = FinPace::default();
        assert_eq!(pace.hold_until(t0), None, "no round closed");
        pace.closed(0, t0);
        assert_eq!(pace.hold_until(t0), None, "one round gives no pace");
        pace.closed(1, t0 + 40 * MS);
        // Round 1 closed again for a second stream, a little later: the pace is the rounds'.
        pace.closed(1, t0 + 41 * MS);
        pace.closed(0, t0 + 42 * MS);
        assert!(pace.hold(t0 + 45 * MS));
        assert_eq!(pace.deadline(), Some(t0 + 80 * MS));
        assert!(!pace.hold(t0 + 80 * MS));
        assert_eq!(pace.deadline(), None, "the Fin went");
        assert!(pace.hold(t0 + 60 * MS));
        pace.release();
        assert_eq!(pace.deadline(), None, "nothing held once the Fin cannot go");
    }

    #[test]
    fn skipped_rounds_count_in_the_pace_and_the_hold_is_bounded() {
        let t0 = Instant::now();
        let mut pace = FinPace::default();
        pace.closed(10, t0);
        pace.closed(14, t0 + 100 * MS);
        assert_eq!(pace.hold_until(t0 + 100 * MS), Some(t0 + 125 * MS));
        pace.closed(15, t0 + 10_100 * MS);
        assert_eq!(
            pace.hold_until(t0 + 10_100 * MS),
            Some(t0 + 10_100 * MS + MAX_HOLD)
        );
    }
}
