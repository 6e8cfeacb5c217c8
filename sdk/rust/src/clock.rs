//! Time rounds' clock: which round a rank dumps at a time, counted from the tree's start and period.

/// Where time rounds count from: round `first` began at `start` (Unix ns), one every `period_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clock {
    pub(crate) start: u64,
    pub(crate) first: u64,
    pub(crate) period_ns: u64,
}

impl Clock {
    /// The round `k` windows after `first`: (round, its window's start and end).
    pub(crate) fn round(&self, k: u64) -> (u64, u64, u64) {
        let from = self.start + k * self.period_ns;
        (self.first + k, from, from + self.period_ns)
    }

    /// The round to dump next at `now`, given the next round not yet dumped: that one, or, when its window and
    /// later ones have ended already (the rank had no clock, or could not run), the latest that has ended.
    pub(crate) fn due(&self, now: u64, next_round: u64) -> (u64, u64, u64) {
        let ended = now.saturating_sub(self.start) / self.period_ns;
        let next = next_round.saturating_sub(self.first);
        self.round(if ended > next + 1 { ended - 1 } else { next })
    }

    /// The round whose window holds `now` (or the next not yet dumped, if later).
    pub(crate) fn current(&self, now: u64, next_round: u64) -> (u64, u64, u64) {
        let under_way = now.saturating_sub(self.start) / self.period_ns;
        self.round(under_way.max(next_round.saturating_sub(self.first)))
    }
}
