//! Scores over a window of rounds (`"window": N`): seed 002 locates outliers over steps, not single
//! iterations, and a rank slowed for one round by the machine (a preemption, an interrupt storm) must weigh
//! little beside one slow in every round. Each leaf keeps, per rank, its values of the last `N` rounds, and the
//! rank is scored on one value per event and metric over the rounds it reported of `round - N + 1 ..= round`: by
//! default their median, which one slow round in three (two in five) does not move, or with `"window_stat":
//! "sum"` their sum, which totals the steps. An event a rank did not report in one of those rounds counts 0 there.
//! A rank always reports to the same leaf, so the window a tree sees is the window over all ranks at once.

use std::collections::{BTreeMap, HashMap, VecDeque};

use canopy_filter_common::metrics::Key;

/// The longest window a stream may ask: the leaf keeps this many rounds of each of its ranks' values.
pub const MAX_WINDOW: u32 = 64;

/// One rank's values in a round, sorted by key.
type Values = Vec<(Key, f64)>;

/// What a rank's values over the rounds of its window become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statistic {
    /// Per key, the median over the rounds (the mean of the middle two over an even number).
    Median,
    /// Per key, the sum over the rounds.
    Sum,
}

impl Statistic {
    /// The statistic of `vs` (not empty), summed in their order; `vs` may be reordered.
    fn of(self, vs: &mut [f64]) -> f64 {
        match self {
            Statistic::Sum => vs.iter().sum(),
            Statistic::Median => median(vs),
        }
    }

    /// The parameter's word.
    pub fn word(self) -> &'static str {
        match self {
            Statistic::Median => "median",
            Statistic::Sum => "sum",
        }
    }
}

/// A leaf's ranks' values over the last rounds.
#[derive(Debug)]
pub struct Window {
    rounds: u64,
    statistic: Statistic,
    /// Per app, per rank, its rounds in the window, oldest first.
    ranks: HashMap<String, HashMap<u32, VecDeque<(u64, Values)>>>,
}

impl Window {
    /// A window of `rounds` rounds (1: each round alone, and nothing is kept).
    pub fn new(rounds: u32, statistic: Statistic) -> Window {
        Window {
            rounds: u64::from(rounds.max(1)),
            statistic,
            ranks: HashMap::new(),
        }
    }

    /// The rank's values over the rounds of the window ending at `round` (this one's included), sorted by key:
    /// per key, the window's statistic of its values in the rounds the rank reported.
    pub fn over(&mut self, app: &str, rank: u32, round: u64, values: Values) -> Values {
        if self.rounds == 1 {
            return values;
        }
        let n = self.rounds;
        let ranks = match self.ranks.get_mut(app) {
            Some(ranks) => ranks,
            None => self.ranks.entry(app.to_string()).or_default(),
        };
        let kept = ranks.entry(rank).or_default();
        kept.retain(|(r, _)| *r < round && r + n > round);
        kept.push_back((round, values));
        let (_, newest) = kept.back().expect("just pushed");
        let same_keys = kept
            .iter()
            .all(|(_, v)| v.len() == newest.len() && v.iter().zip(newest).all(|(a, b)| a.0 == b.0));
        if same_keys {
            // The usual case, a rank reporting the same events every round: column by column.
            let mut column = Vec::with_capacity(kept.len());
            return (0..newest.len())
                .map(|i| {
                    column.clear();
                    column.extend(kept.iter().map(|(_, v)| v[i].1));
                    (newest[i].0, self.statistic.of(&mut column))
                })
                .collect();
        }
        // Per key, its values in the rounds that had it; the others count 0.
        let mut by_key: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
        for (_, values) in kept.iter() {
            for (key, v) in values {
                by_key.entry(*key).or_default().push(*v);
            }
        }
        let reported = kept.len();
        by_key
            .into_iter()
            .map(|(key, mut vs)| {
                if self.statistic == Statistic::Median {
                    vs.resize(reported, 0.0);
                }
                (key, self.statistic.of(&mut vs))
            })
            .collect()
    }

    /// Forgets the ranks that reported no round of the window ending at `round` (ranks that left).
    pub fn forget_before(&mut self, round: u64) {
        if self.rounds == 1 {
            return;
        }
        let n = self.rounds;
        for ranks in self.ranks.values_mut() {
            ranks.retain(|_, kept| kept.back().is_some_and(|(r, _)| r + n > round));
        }
        self.ranks.retain(|_, ranks| !ranks.is_empty());
    }
}

/// The median of `vs` (not empty, finite, as the values scored are), the mean of the middle two of an even count;
/// `vs` is left sorted.
pub fn median(vs: &mut [f64]) -> f64 {
    let n = vs.len();
    if n > 16 {
        vs.sort_unstable_by(f64::total_cmp);
    } else {
        // A window is a few rounds: odd-even transposition, whose compare-exchanges are a min and a max with no
        // branch on the data (a sort's branches mispredict on values in random order).
        for pass in 0..n {
            for j in (pass % 2..n.saturating_sub(1)).step_by(2) {
                let (a, b) = (vs[j], vs[j + 1]);
                vs[j] = a.min(b);
                vs[j + 1] = a.max(b);
            }
        }
    }
    let (lo, hi) = (vs[(n - 1) / 2], vs[n / 2]);
    if n % 2 == 1 { hi } else { lo / 2.0 + hi / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i32 = 3;

    #[test]
    fn sums_the_rounds_of_the_window_a_rank_reported() {
        let mut w = Window::new(3, Statistic::Sum);
        assert_eq!(w.over("a", 0, 0, vec![((1, T), 1.0)]), [((1, T), 1.0)]);
        assert_eq!(
            w.over("a", 0, 1, vec![((1, T), 2.0), ((2, T), 5.0)]),
            [((1, T), 3.0), ((2, T), 5.0)]
        );
        // Round 3's window is rounds 1 to 3: round 0 has left it; the rank skipped round 2.
        assert_eq!(
            w.over("a", 0, 3, vec![((1, T), 4.0)]),
            [((1, T), 6.0), ((2, T), 5.0)]
        );
        // Another rank, and the same rank number of another application, have windows of their own.
        assert_eq!(w.over("b", 0, 3, vec![((1, T), 7.0)]), [((1, T), 7.0)]);
        w.forget_before(6);
        assert!(w.ranks.is_empty());
    }

    #[test]
    fn the_median_of_a_window_ignores_a_minority_of_slow_rounds() {
        let mut w = Window::new(5, Statistic::Median);
        let mut last = Vec::new();
        // Rounds of 10 us but two of 500 (a preemption, say): the median stays 10.
        for (round, us) in [10.0, 500.0, 10.0, 10.0, 500.0].into_iter().enumerate() {
            last = w.over("a", 0, round as u64, vec![((1, T), us)]);
        }
        assert_eq!(last, [((1, T), 10.0)]);
        // The first rounds have fewer values: two give their mean, one itself.
        let mut w = Window::new(5, Statistic::Median);
        assert_eq!(w.over("a", 0, 0, vec![((1, T), 10.0)]), [((1, T), 10.0)]);
        assert_eq!(w.over("a", 0, 1, vec![((1, T), 30.0)]), [((1, T), 20.0)]);
        // An event reported in one round of three counts 0 in the other two.
        assert_eq!(
            w.over("a", 0, 2, vec![((1, T), 20.0), ((2, T), 7.0)]),
            [((1, T), 20.0), ((2, T), 0.0)]
        );
        // A slow rank slow in every round stays slow.
        for round in 3..8 {
            last = w.over("a", 0, round, vec![((1, T), 30.0 + round as f64)]);
        }
        assert_eq!(last, [((1, T), 35.0)]);
    }

    #[test]
    fn a_window_of_one_keeps_nothing() {
        for statistic in [Statistic::Median, Statistic::Sum] {
            let mut w = Window::new(1, statistic);
            assert_eq!(w.over("a", 0, 0, vec![((1, T), 1.0)]), [((1, T), 1.0)]);
            assert_eq!(w.over("a", 0, 1, vec![((1, T), 2.0)]), [((1, T), 2.0)]);
            assert!(w.ranks.is_empty());
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [3.0, 1.0]), 2.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [f64::MAX, f64::MAX]), f64::MAX);
        assert_eq!(median(&mut [2.0, 1.0, 2.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [-0.0, 0.0]), 0.0);
        // Past 16 rounds, by sorting.
        let mut many: Vec<f64> = (0..40).map(|i| f64::from((i * 17) % 40)).collect();
        assert_eq!(median(&mut many), 19.5);
        many.pop();
        let mut small: Vec<f64> = (0..9).map(|i| f64::from((i * 5) % 9)).collect();
        assert_eq!(median(&mut small), 4.0);
        assert_eq!(median(&mut many), 19.0);
    }
}
