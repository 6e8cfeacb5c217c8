//! Scores over a window of rounds (`"window": N`): seed 002 locates outliers over steps, not single
//! iterations, and a rank slowed for one round by the machine (a preemption, an interrupt storm) weighs little
//! beside one slow every round. Each leaf keeps, per rank, its values of the last `N` rounds, and the rank is
//! scored on their sums over the rounds it reported of `round - N + 1 ..= round`. A rank always reports to the
//! same leaf, so the window a tree sees is the window over all ranks at once.

use std::collections::{BTreeMap, HashMap, VecDeque};

use canopy_filter_common::metrics::Key;

/// The longest window a stream may ask: the leaf keeps this many rounds of each of its ranks' values.
pub const MAX_WINDOW: u32 = 64;

/// One rank's values in a round, sorted by key.
type Values = Vec<(Key, f64)>;

/// A leaf's ranks' values over the last rounds.
#[derive(Debug)]
pub struct Window {
    rounds: u64,
    /// Per (app, rank), its rounds in the window, oldest first.
    ranks: HashMap<(String, u32), VecDeque<(u64, Values)>>,
}

impl Window {
    /// A window of `rounds` rounds (1: each round alone, and nothing is kept).
    pub fn new(rounds: u32) -> Window {
        Window {
            rounds: u64::from(rounds.max(1)),
            ranks: HashMap::new(),
        }
    }

    /// The rank's values summed over the rounds of the window ending at `round` (this one's included), oldest
    /// first, sorted by key.
    pub fn sum(&mut self, app: &str, rank: u32, round: u64, values: Values) -> Values {
        if self.rounds == 1 {
            return values;
        }
        let n = self.rounds;
        let kept = self.ranks.entry((app.to_string(), rank)).or_default();
        kept.retain(|(r, _)| *r < round && r + n > round);
        kept.push_back((round, values));
        let mut sums: BTreeMap<Key, f64> = BTreeMap::new();
        for (_, values) in kept.iter() {
            for (key, v) in values {
                *sums.entry(*key).or_insert(0.0) += v;
            }
        }
        sums.into_iter().collect()
    }

    /// Forgets the ranks that reported no round of the window ending at `round` (ranks that left).
    pub fn forget_before(&mut self, round: u64) {
        if self.rounds == 1 {
            return;
        }
        let n = self.rounds;
        self.ranks
            .retain(|_, kept| kept.back().is_some_and(|(r, _)| r + n > round));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i32 = 3;

    #[test]
    fn sums_the_rounds_of_the_window_a_rank_reported() {
        let mut w = Window::new(3);
        assert_eq!(w.sum("a", 0, 0, vec![((1, T), 1.0)]), [((1, T), 1.0)]);
        assert_eq!(
            w.sum("a", 0, 1, vec![((1, T), 2.0), ((2, T), 5.0)]),
            [((1, T), 3.0), ((2, T), 5.0)]
        );
        // Round 3's window is rounds 1 to 3: round 0 has left it; the rank skipped round 2.
        assert_eq!(
            w.sum("a", 0, 3, vec![((1, T), 4.0)]),
            [((1, T), 6.0), ((2, T), 5.0)]
        );
        // Another rank, and the same rank number of another application, have windows of their own.
        assert_eq!(w.sum("b", 0, 3, vec![((1, T), 7.0)]), [((1, T), 7.0)]);
        w.forget_before(6);
        assert!(w.ranks.is_empty());
    }

    #[test]
    fn a_window_of_one_keeps_nothing() {
        let mut w = Window::new(1);
        assert_eq!(w.sum("a", 0, 0, vec![((1, T), 1.0)]), [((1, T), 1.0)]);
        assert_eq!(w.sum("a", 0, 1, vec![((1, T), 2.0)]), [((1, T), 2.0)]);
        assert!(w.ranks.is_empty());
    }
}
