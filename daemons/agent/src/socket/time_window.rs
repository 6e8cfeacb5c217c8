//! Where the time rounds are: the window of wall time under way, as the agent's SDK ranks count it, so a rank
//! that attaches mid-run is expected from the round it will dump first, not from its own round 0.

/// The tree's clock as an SDK rank that gets it now keeps it: round `first` began at `start` (Unix ns), and each
/// lasts the period in force now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TimeWindow {
    start: u64,
    first: u64,
    period_ns: u64,
}

impl TimeWindow {
    /// The clock of a Start (`start_unix_ns` 0: no Start yet, no clock).
    pub(super) fn from_start(start_unix_ns: u64, first_round: u64, period_ms: u64) -> Option<TimeWindow> {
        (start_unix_ns > 0 && period_ms > 0).then(|| TimeWindow {
            start: start_unix_ns,
            first: first_round,
            period_ns: period_ms.saturating_mul(1_000_000),
        })
    }

    /// The round whose window holds `now` (the round a rank that gets the clock now dumps first).
    pub(super) fn round_at(&self, now: u64) -> u64 {
        self.first + now.saturating_sub(self.start) / self.period_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_round_under_way_counts_from_the_start_in_whole_periods() {
        assert_eq!(TimeWindow::from_start(0, 3, 100), None);
        assert_eq!(TimeWindow::from_start(1_000 * MS, 3, 0), None);
        let w = TimeWindow::from_start(1_000 * MS, 3, 100).unwrap();
        assert_eq!(w.round_at(999 * MS), 3);
        assert_eq!(w.round_at(1_000 * MS), 3);
        assert_eq!(w.round_at(1_099 * MS), 3);
        assert_eq!(w.round_at(1_100 * MS), 4);
        assert_eq!(w.round_at(3_050 * MS), 23);
    }
}
