//! Mergeable summaries over ranks: count, mean and m2 combined pairwise (Chan, Golub and LeVeque), min and
//! max with the rank holding each.
//!
//! The sum of squares minus the square of the sum is never used: it cancels catastrophically when the mean is
//! large next to the deviation (times of 1e15 microseconds differing by a few).
//!
//! Accuracy: each merge rounds the mean to a double, so the deviation's error is bounded relative to the
//! mean's last bit, not to the deviation itself. For values of about 1e15 spread over about 1000 (a spread
//! of 1e-12 of their size) the tests saw relative errors near 1e-8; for well-spread values they stay near
//! 1e-15. Carrying the mean's rounding error between levels would fix that, at the cost of a proto field.

use std::cmp::Ordering;
use std::collections::HashMap;

use canopy_filter_proto::v1::{EventStats, RankRef, Summary};

use crate::metrics::Key;

/// The summary of one value held by `rank`: count 1, mean `v`, m2 0.
pub fn single(v: f64, rank: &RankRef) -> Summary {
    Summary {
        count: 1,
        mean: v,
        m2: 0.0,
        std: 0.0,
        min: v,
        max: v,
        min_rank: Some(rank.clone()),
        max_rank: Some(rank.clone()),
    }
}

/// Orders ranks by (app, rank); a missing rank sorts last so a real one wins a tie.
fn cmp_rank(a: &Option<RankRef>, b: &Option<RankRef>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => (a.app.as_str(), a.rank).cmp(&(b.app.as_str(), b.rank)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Count, mean and m2 of a non-empty set of values.
pub type Moments = (u64, f64, f64);

/// The moments of two non-empty sets together (Chan, Golub and LeVeque), the one place this arithmetic is
/// written: `n = na + nb; delta = mb - ma; mean = ma + delta * nb / n; m2 = m2a + m2b + delta^2 * na * nb / n`.
pub fn merge_moments(a: Moments, b: Moments) -> Moments {
    let na = a.0 as f64;
    let nb = b.0 as f64;
    let n = na + nb;
    let delta = b.1 - a.1;
    (
        // Saturating: a hostile child's count cannot wrap a relay's to zero or panic it.
        a.0.saturating_add(b.0),
        a.1 + delta * nb / n,
        a.2 + b.2 + delta * delta * na * nb / n,
    )
}

/// Merges `b` into `a` ([`merge_moments`] for count, mean and m2).
///
/// A tie on min (max) goes to the smallest (app, rank), so the result does not depend on merge order.
/// `std` is left alone; [`finish`] fills it once all merging is done.
pub fn merge(a: &mut Summary, b: &Summary) {
    if b.count == 0 {
        return;
    }
    if a.count == 0 {
        *a = b.clone();
        return;
    }
    (a.count, a.mean, a.m2) = merge_moments((a.count, a.mean, a.m2), (b.count, b.mean, b.m2));
    if b.min < a.min || (b.min == a.min && cmp_rank(&b.min_rank, &a.min_rank) == Ordering::Less) {
        a.min = b.min;
        a.min_rank = b.min_rank.clone();
    }
    if b.max > a.max || (b.max == a.max && cmp_rank(&b.max_rank, &a.max_rank) == Ordering::Less) {
        a.max = b.max;
        a.max_rank = b.max_rank.clone();
    }
}

/// Merges one value held by `rank` into `a`, exactly as `merge(a, &single(v, rank))` does.
pub fn add_value(a: &mut Summary, v: f64, rank: &RankRef) {
    if a.count == 0 {
        *a = single(v, rank);
        return;
    }
    (a.count, a.mean, a.m2) = merge_moments((a.count, a.mean, a.m2), (1, v, 0.0));
    let wins = |held: &Option<RankRef>| match held {
        Some(h) => (rank.app.as_str(), rank.rank) < (h.app.as_str(), h.rank),
        None => true,
    };
    if v < a.min || (v == a.min && wins(&a.min_rank)) {
        a.min = v;
        a.min_rank = Some(rank.clone());
    }
    if v > a.max || (v == a.max && wins(&a.max_rank)) {
        a.max = v;
        a.max_rank = Some(rank.clone());
    }
}

/// Fills `std`: the population standard deviation `sqrt(m2 / count)`.
pub fn finish(s: &mut Summary) {
    s.std = if s.count == 0 {
        0.0
    } else {
        (s.m2.max(0.0) / s.count as f64).sqrt()
    };
}

/// Summaries keyed by (id, metric), iterated in key order. A hash map with a hasher made for these keys
/// (ids are already hashes) takes the leaf's hundreds of thousands of values per round; the key order is
/// made when the summaries leave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsMap {
    map: HashMap<Key, Summary, BuildKeyHasher>,
}

/// Hashes a `Key`: the event id is an xxh3 hash already, so mixing in the metric is enough.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // A final multiply spreads the metric's few values over the high bits the table uses.
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
    fn write_i32(&mut self, n: i32) {
        self.0 = self.0.rotate_left(5) ^ n as u64;
    }
}

pub type BuildKeyHasher = std::hash::BuildHasherDefault<KeyHasher>;

impl StatsMap {
    pub fn new() -> StatsMap {
        StatsMap::default()
    }

    /// Adds one rank's value: the same arithmetic as merging `single(v, rank)`, without building it (the rank
    /// is copied only when it holds a new minimum or maximum).
    pub fn add(&mut self, key: Key, v: f64, rank: &RankRef) {
        add_value(self.map.entry(key).or_default(), v, rank);
    }

    /// Merges summaries from a packet; an entry without a summary counts nothing.
    pub fn merge_stats(&mut self, stats: &[EventStats]) {
        for es in stats {
            if let Some(s) = &es.summary {
                merge(self.map.entry((es.id, es.metric)).or_default(), s);
            }
        }
    }

    /// Merges another map into this one.
    pub fn merge_map(&mut self, other: &StatsMap) {
        for (key, s) in &other.map {
            merge(self.map.entry(*key).or_default(), s);
        }
    }

    pub fn get(&self, key: &Key) -> Option<&Summary> {
        self.map.get(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The summaries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Summary)> {
        let mut all: Vec<(&Key, &Summary)> = self.map.iter().collect();
        all.sort_unstable_by_key(|(k, _)| **k);
        all.into_iter()
    }

    /// The summaries sorted by (id, metric), `std` left 0 (packets between levels do not need it).
    pub fn to_stats(&self) -> Vec<EventStats> {
        self.iter()
            .map(|(&(id, metric), s)| EventStats {
                id,
                metric,
                summary: Some(s.clone()),
                quantiles: Vec::new(),
                app: String::new(),
            })
            .collect()
    }

    /// The summaries sorted by (id, metric), with `std` filled: what a result stores.
    pub fn to_final_stats(&self) -> Vec<EventStats> {
        let mut out = self.to_stats();
        for es in &mut out {
            if let Some(s) = &mut es.summary {
                finish(s);
            }
        }
        out
    }
}

/// Fills `std` of every summary in a list of stats.
pub fn finish_all(stats: &mut [EventStats]) {
    for es in stats {
        if let Some(s) = &mut es.summary {
            finish(s);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn adding_a_value_is_merging_its_single_summary_bit_for_bit() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let (mut added, mut merged) = (Summary::default(), Summary::default());
        for i in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Many ties (values from a small set), ranks out of order, and one huge value.
            let v = if i == 77 { 1e15 } else { (x % 7) as f64 * 0.5 };
            let rank = RankRef {
                app: if x.is_multiple_of(3) {
                    "a".into()
                } else {
                    "b".into()
                },
                rank: (x % 97) as u32,
            };
            add_value(&mut added, v, &rank);
            merge(&mut merged, &single(v, &rank));
            assert_eq!(added, merged, "after {i} values");
        }
    }

    use super::*;

    fn r(app: &str, rank: u32) -> RankRef {
        RankRef {
            app: app.into(),
            rank,
        }
    }

    fn of(values: &[(f64, u32)]) -> Summary {
        let mut s = Summary::default();
        for &(v, rank) in values {
            merge(&mut s, &single(v, &r("a", rank)));
        }
        s
    }

    #[test]
    fn single_value() {
        let mut s = single(4.5, &r("a", 1));
        finish(&mut s);
        assert_eq!(
            (s.count, s.mean, s.m2, s.std, s.min, s.max),
            (1, 4.5, 0.0, 0.0, 4.5, 4.5)
        );
    }

    #[test]
    fn known_mean_and_population_std() {
        let mut s = of(&[
            (2.0, 0),
            (4.0, 1),
            (4.0, 2),
            (4.0, 3),
            (5.0, 4),
            (5.0, 5),
            (7.0, 6),
            (9.0, 7),
        ]);
        finish(&mut s);
        assert_eq!(s.count, 8);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.m2, 32.0);
        assert_eq!(s.std, 2.0);
        assert_eq!(
            (s.min, s.min_rank.unwrap().rank, s.max, s.max_rank.unwrap().rank),
            (2.0, 0, 9.0, 7)
        );
    }

    #[test]
    fn huge_mean_small_spread_does_not_cancel() {
        // Sum of squares minus square of sums gives garbage here (1e30 terms, spread 1).
        let base = 1e15;
        let mut s = of(&[(base, 0), (base + 2.0, 1), (base + 4.0, 2)]);
        finish(&mut s);
        assert_eq!(s.mean, base + 2.0);
        assert!((s.std - (8.0f64 / 3.0).sqrt()).abs() < 1e-12, "{}", s.std);
    }

    #[test]
    fn ties_go_to_the_smallest_rank_whatever_the_order() {
        let a = of(&[(1.0, 5), (3.0, 9)]);
        let b = of(&[(1.0, 2), (3.0, 4)]);
        let mut ab = a.clone();
        merge(&mut ab, &b);
        let mut ba = b.clone();
        merge(&mut ba, &a);
        assert_eq!(ab, ba);
        assert_eq!(ab.min_rank.unwrap().rank, 2);
        assert_eq!(ab.max_rank.unwrap().rank, 4);
        // The app comes first in the order.
        let mut x = single(1.0, &r("b", 0));
        merge(&mut x, &single(1.0, &r("a", 7)));
        assert_eq!(x.min_rank.unwrap(), r("a", 7));
    }

    #[test]
    fn empty_sides_merge_to_the_other() {
        let a = of(&[(1.0, 0), (2.0, 1)]);
        let mut e = Summary::default();
        merge(&mut e, &a);
        assert_eq!(e, a);
        let mut a2 = a.clone();
        merge(&mut a2, &Summary::default());
        assert_eq!(a2, a);
    }

    #[test]
    fn stats_map_is_sorted_by_key() {
        let mut m = StatsMap::new();
        m.add((9, 1), 1.0, &r("a", 0));
        m.add((2, 3), 1.0, &r("a", 0));
        m.add((2, 1), 1.0, &r("a", 0));
        let keys: Vec<Key> = m.to_stats().iter().map(|e| (e.id, e.metric)).collect();
        assert_eq!(keys, vec![(2, 1), (2, 3), (9, 1)]);
    }
}
