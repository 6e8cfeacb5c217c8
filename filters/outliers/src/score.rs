//! A rank's score (seed 002, section 4.1): over the events it reports, in each metric scored, the sum of its
//! distance from each event's mean in standard deviations beyond a margin, `max(|value - mean| / std - margin,
//! 0)` (margin 1 by default; 0 is the paper's `|value - mean| / std`), each weighted (by default) by
//! the event's average share of the group's total in that metric, `|mean| / sum of |mean|` over the group's
//! events of the metric that two ranks or more report (one rank's own event has nothing to deviate from, and
//! takes no share). Weighted, each metric adds at most the deviation of its weighted mean event, so time in
//! microseconds and calls in counts weigh alike. An event whose values do not deviate (std 0) adds nothing, and
//! neither does a value within rounding of its mean ([`ROUNDING`]).

use canopy_filter_common::metrics::Key;
use canopy_filter_proto::v1::{OutlierEvent, StatsColumns};

/// A value this close to its event's mean, relative to the larger of the two, does not deviate from it: the mean
/// a tree merges level by level and the mean over all ranks at once differ in their last bits, and a rank that
/// sits at the mean must not be named for an event by one tree shape and not by another.
pub const ROUNDING: f64 = 1e-12;

/// A distance this close to the margin, relative to the distance, is not beyond it: two ranks of an event lie
/// exactly one deviation from their mean, which a tree computes a few bits either side of 1.
pub const MARGIN_ROUNDING: f64 = 1e-9;

/// How far `z` deviations lie beyond `margin`: nothing within it, or within rounding of it.
pub fn beyond(z: f64, margin: f64) -> f64 {
    let excess = z - margin;
    if excess > MARGIN_ROUNDING * z { excess } else { 0.0 }
}

/// Each (event, metric)'s mean, standard deviation and weight in one group of ranks, taken from the group's
/// summaries.
#[derive(Debug, Clone, Default)]
pub struct Moments {
    /// (event id, metric number), sorted, each once.
    keys: Vec<Key>,
    mean: Vec<f64>,
    std: Vec<f64>,
    weight: Vec<f64>,
    /// The standard deviations within which a value adds nothing.
    margin: f64,
}

impl Moments {
    /// From summaries (checked columns: rows sorted by id, then metric). The deviation is the population's,
    /// `sqrt(m2 / count)`, as the stats filter reports it. A value adds its distance beyond `margin` deviations.
    pub fn of(c: &StatsColumns, weighted: bool, margin: f64) -> Moments {
        let std: Vec<f64> =
            c.m2.iter()
                .zip(&c.count)
                .map(|(m2, n)| (m2.max(0.0) / *n as f64).sqrt())
                .collect();
        // Each metric's total over the events at least two ranks of the group report, summed in row order so that
        // every node sums alike. An event one rank alone reports has nothing to deviate from: it takes no share,
        // or a scenario whose ranks each time a task of their own (Uintah's level-0 patches, 97% of the time)
        // would leave the events ranks share a few percent of the weight.
        let mut totals: Vec<(i32, f64)> = Vec::new();
        let shared = c
            .metric
            .iter()
            .zip(&c.mean)
            .zip(&c.count)
            .filter(|(_, n)| **n >= 2);
        for ((m, mean), _) in shared {
            match totals.iter_mut().find(|(x, _)| x == m) {
                Some((_, t)) => *t += mean.abs(),
                None => totals.push((*m, mean.abs())),
            }
        }
        let total = |m: i32| totals.iter().find(|(x, _)| *x == m).map_or(0.0, |(_, t)| *t);
        let weight = c
            .mean
            .iter()
            .zip(&c.metric)
            .map(|(mean, m)| match (weighted, total(*m)) {
                (false, _) => 1.0,
                (true, t) if t > 0.0 => mean.abs() / t,
                (true, _) => 0.0,
            })
            .collect();
        Moments {
            keys: c.id.iter().copied().zip(c.metric.iter().copied()).collect(),
            mean: c.mean.clone(),
            std,
            weight,
            margin,
        }
    }

    /// The contribution of `value` of `key` and where the key is; `None` for one the group's summaries lack (its
    /// rank's phase 0 missed the round at the root).
    fn contribution(&self, key: Key, value: f64) -> Option<(usize, f64)> {
        let i = self.keys.binary_search(&key).ok()?;
        let (mean, std) = (self.mean[i], self.std[i]);
        let deviation = (value - mean).abs();
        let c = if std > 0.0 && deviation > ROUNDING * value.abs().max(mean.abs()) {
            beyond(deviation / std, self.margin) * self.weight[i]
        } else {
            0.0
        };
        Some((i, c))
    }

    /// The score of a rank's `((event id, metric), value)` pairs, summed in the order given (sorted by key).
    pub fn score(&self, values: &[(Key, f64)]) -> f64 {
        // From +0.0, not the -0.0 `sum` starts from: protobuf does not send a zero, so a -0.0 would arrive as
        // +0.0 and sort differently at the next level.
        values
            .iter()
            .filter_map(|&(id, v)| self.contribution(id, v))
            .fold(0.0, |score, (_, c)| score + c)
    }

    /// The `n` events that weigh most in a rank's score: largest contribution first, then smallest id, then
    /// metric; events that add nothing are left out. Each names its metric when `several` are scored.
    pub fn top_events(&self, values: &[(Key, f64)], n: usize, several: bool) -> Vec<OutlierEvent> {
        let mut events: Vec<OutlierEvent> = values
            .iter()
            .filter_map(|&((id, metric), value)| {
                let (i, contribution) = self.contribution((id, metric), value)?;
                (contribution > 0.0).then(|| OutlierEvent {
                    id,
                    value,
                    mean: self.mean[i],
                    std: self.std[i],
                    contribution,
                    metric: if several { metric } else { 0 },
                })
            })
            .collect();
        events.sort_by(|a, b| {
            b.contribution
                .total_cmp(&a.contribution)
                .then(a.id.cmp(&b.id))
                .then(a.metric.cmp(&b.metric))
        });
        events.truncate(n);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXCL: i32 = canopy_filter_proto::v1::Metric::Exclusive as i32;
    const CALLS: i32 = canopy_filter_proto::v1::Metric::Calls as i32;

    fn columns(rows: &[(u64, u64, f64, f64)]) -> StatsColumns {
        StatsColumns {
            id: rows.iter().map(|r| r.0).collect(),
            metric: vec![EXCL; rows.len()],
            count: rows.iter().map(|r| r.1).collect(),
            mean: rows.iter().map(|r| r.2).collect(),
            m2: rows.iter().map(|r| r.3).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn distance_in_deviations_summed_over_events() {
        // Event 1: mean 10, std 2 (m2 16 over 4); event 2: mean 30, std 0; event 3: mean 60, std 5.
        let c = columns(&[(1, 4, 10.0, 16.0), (2, 4, 30.0, 0.0), (3, 4, 60.0, 100.0)]);
        let plain = Moments::of(&c, false, 0.0);
        let values = [
            ((1, EXCL), 14.0),
            ((2, EXCL), 99.0),
            ((3, EXCL), 50.0),
            ((9, EXCL), 1e9),
        ];
        // 4 / 2 + 0 (no deviation) + 10 / 5; event 9 is not in the group's summaries.
        assert_eq!(plain.score(&values), 4.0);
        let top = plain.top_events(&values, 3, false);
        assert_eq!(
            top.iter().map(|e| (e.id, e.contribution)).collect::<Vec<_>>(),
            vec![(1, 2.0), (3, 2.0)]
        );
        assert_eq!((top[1].value, top[1].mean, top[1].std), (50.0, 60.0, 5.0));
        assert_eq!(plain.top_events(&values, 1, false).len(), 1);
        // Weighted by each mean's share of 100: 2 * 0.1 + 2 * 0.6.
        let weighted = Moments::of(&c, true, 0.0);
        assert!((weighted.score(&values) - 1.4).abs() < 1e-12);
        assert_eq!(weighted.top_events(&values, 3, false)[0].id, 3);
    }

    #[test]
    fn an_event_one_rank_alone_reports_takes_no_share() {
        // Event 1: 10 us on each of 4 ranks, std 2; event 2: 990 us, a task of one rank's own.
        let c = columns(&[(1, 4, 10.0, 16.0), (2, 1, 990.0, 0.0)]);
        let m = Moments::of(&c, true, 0.0);
        // 2 std in the only event ranks share, which holds the whole weight (not 10 / 1000 of it).
        assert_eq!(m.score(&[((1, EXCL), 14.0), ((2, EXCL), 990.0)]), 2.0);
    }

    #[test]
    fn a_margin_counts_only_the_distance_beyond_it() {
        // Event 1: mean 10, std 2: a value of 14 is 2 deviations out, 11 half of one.
        let c = columns(&[(1, 4, 10.0, 16.0)]);
        let m = Moments::of(&c, false, 1.0);
        assert_eq!(m.score(&[((1, EXCL), 14.0)]), 1.0);
        assert_eq!(m.score(&[((1, EXCL), 6.0)]), 1.0);
        assert_eq!(m.score(&[((1, EXCL), 11.0)]), 0.0);
        assert!(m.top_events(&[((1, EXCL), 11.0)], 2, false).is_empty());
        assert_eq!(Moments::of(&c, false, 0.0).score(&[((1, EXCL), 11.0)]), 0.5);
    }

    #[test]
    fn all_means_zero_weigh_nothing() {
        let c = columns(&[(1, 2, 0.0, 8.0)]);
        assert_eq!(Moments::of(&c, true, 0.0).score(&[((1, EXCL), 2.0)]), 0.0);
        assert_eq!(Moments::of(&c, false, 0.0).score(&[((1, EXCL), 2.0)]), 1.0);
    }

    #[test]
    fn a_value_within_rounding_of_its_mean_does_not_deviate() {
        // A mean merged level by level, one bit off the value a rank reports at the mean exactly.
        let mean = 0.1 + 0.2;
        let c = columns(&[(1, 3, mean, 2.0)]);
        let m = Moments::of(&c, false, 0.0);
        assert_eq!(m.score(&[((1, EXCL), 0.3)]), 0.0);
        assert!(m.top_events(&[((1, EXCL), 0.3)], 2, false).is_empty());
        // A deviation beyond rounding still counts.
        assert!(m.score(&[((1, EXCL), 0.3 + 1e-9)]) > 0.0);
    }

    #[test]
    fn each_metric_is_weighted_within_itself() {
        // Event 1: 90 us of 100 with std 1; event 2: 10 us with std 5 (noise in a small event). In calls, event
        // 1 makes 1,000 of 1,010 calls with std 10, event 2 10 calls, all alike.
        let c = StatsColumns {
            id: vec![1, 1, 2, 2],
            metric: vec![CALLS, EXCL, CALLS, EXCL],
            count: vec![4; 4],
            mean: vec![1000.0, 90.0, 10.0, 10.0],
            m2: vec![400.0, 4.0, 0.0, 100.0],
            ..Default::default()
        };
        let m = Moments::of(&c, true, 0.0);
        // A rank making 30 calls more of event 1: 3 std in calls, weighted 1000/1010.
        let calls = [
            ((1, CALLS), 1030.0),
            ((1, EXCL), 90.0),
            ((2, CALLS), 10.0),
            ((2, EXCL), 10.0),
        ];
        assert!((m.score(&calls) - 3.0 * 1000.0 / 1010.0).abs() < 1e-12);
        // A rank with 10 us more noise in event 2: 2 std, weighted 10/100, less than the calls imbalance.
        let noise = [
            ((1, CALLS), 1000.0),
            ((1, EXCL), 90.0),
            ((2, CALLS), 10.0),
            ((2, EXCL), 20.0),
        ];
        assert!((m.score(&noise) - 0.2).abs() < 1e-12);
        let top = m.top_events(&calls, 2, true);
        assert_eq!((top.len(), top[0].id, top[0].metric), (1, 1, CALLS));
    }
}
