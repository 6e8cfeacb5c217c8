//! Rounds the store could not write before the writer's bound on what it keeps for retry was reached: each keeps
//! its coverage but not its result, its covered ranks counted as `store_failed`, so the round still gets its row
//! (with the reason) once the store writes again. Consecutive rounds of a stream with the same coverage are one
//! run, so a disk full for an hour costs a few records, not one per round.

use canopy_proto::v1::MissingReason;

use crate::rounds::RoundRecord;

/// Consecutive rounds of one stream that lost their results, all with the coverage of `first`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GapRun {
    /// The first round's record, its covered ranks moved to `store_failed` (boxed: a run is passed around by
    /// value while it grows).
    pub first: Box<RoundRecord>,
    /// The last round of the run (inclusive).
    pub last: u64,
}

impl GapRun {
    /// The round `record` with its result let go.
    pub fn of(mut record: RoundRecord) -> GapRun {
        let covered = std::mem::take(&mut record.covered);
        add_store_failed(&mut record.missing, covered);
        for app in &mut record.apps {
            let covered = std::mem::take(&mut app.covered);
            add_store_failed(&mut app.missing, covered);
        }
        let last = record.round;
        GapRun {
            first: Box::new(record),
            last,
        }
    }

    /// Rounds in the run.
    pub fn rounds(&self) -> u64 {
        self.last - self.first.round + 1
    }

    /// Takes `next` into the run if it is the stream's next round with the same coverage (`forced`: whatever its
    /// coverage, counted as the run's first round's); returns it back otherwise.
    pub fn extend(&mut self, next: GapRun, forced: bool) -> Result<(), GapRun> {
        let follows = next.first.stream_id == self.first.stream_id
            && next.first.round == self.last.saturating_add(1)
            && next.last >= next.first.round;
        let same = || {
            next.first.expected == self.first.expected
                && next.first.missing == self.first.missing
                && next.first.apps == self.first.apps
                && next.first.unreachable == self.first.unreachable
        };
        if follows && (forced || same()) {
            self.last = next.last;
            Ok(())
        } else {
            Err(next)
        }
    }

    /// Each round's record, as its row is written.
    pub fn records(&self) -> impl Iterator<Item = RoundRecord> + '_ {
        (self.first.round..=self.last).map(|round| RoundRecord {
            round,
            ..(*self.first).clone()
        })
    }
}

fn add_store_failed(missing: &mut Vec<(MissingReason, u32)>, ranks: u32) {
    if ranks == 0 {
        return;
    }
    match missing.iter_mut().find(|(r, _)| *r == MissingReason::StoreFailed) {
        Some((_, n)) => *n = n.saturating_add(ranks),
        None => missing.push((MissingReason::StoreFailed, ranks)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rounds::AppRecord;

    fn record(round: u64, covered: u32, expected: u32) -> RoundRecord {
        RoundRecord {
            stream_id: 1,
            stream_name: "stats".into(),
            round,
            covered,
            expected,
            missing: match expected - covered {
                0 => vec![],
                n => vec![(MissingReason::Late, n)],
            },
            first_dump_unix_ns: 0,
            closed_unix_ns: 5,
            apps: vec![AppRecord {
                app: "a".into(),
                covered,
                expected,
                missing: vec![],
            }],
            unreachable: vec![],
        }
    }

    #[test]
    fn a_rounds_covered_ranks_become_store_failed_and_its_missing_ones_keep_their_reason() {
        let g = GapRun::of(record(7, 6, 8));
        assert_eq!(g.first.covered, 0);
        assert_eq!(
            g.first.missing,
            vec![(MissingReason::Late, 2), (MissingReason::StoreFailed, 6)]
        );
        assert_eq!(g.first.apps[0].covered, 0);
        assert_eq!(g.first.apps[0].missing, vec![(MissingReason::StoreFailed, 6)]);
        assert_eq!(g.rounds(), 1);
    }

    #[test]
    fn consecutive_rounds_of_the_same_coverage_make_one_run() {
        let mut g = GapRun::of(record(3, 8, 8));
        for r in 4..10 {
            g.extend(GapRun::of(record(r, 8, 8)), false).unwrap();
        }
        assert_eq!((g.first.round, g.last, g.rounds()), (3, 9, 7));
        // Another coverage, a hole, another stream: a run of their own.
        assert!(g.extend(GapRun::of(record(10, 7, 8)), false).is_err());
        assert!(g.extend(GapRun::of(record(11, 8, 8)), false).is_err());
        let mut other = record(10, 8, 8);
        other.stream_id = 2;
        assert!(g.extend(GapRun::of(other), false).is_err());
        // Forced, another coverage joins.
        g.extend(GapRun::of(record(10, 7, 8)), true).unwrap();
        let rounds: Vec<u64> = g.records().map(|r| r.round).collect();
        assert_eq!(rounds, (3..=10).collect::<Vec<_>>());
        assert!(g.records().all(|r| r.covered == 0 && r.expected == 8));
    }
}
