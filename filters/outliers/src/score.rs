//! A rank's score (seed 002, section 4.1): over the events it reports, the sum of its distance from each
//! event's mean in standard deviations, `|value - mean| / std`, each optionally weighted by the event's average
//! share of the group's total, `|mean| / sum of |mean|` over the group's events. An event whose values do not
//! deviate (std 0) adds nothing, and neither does a value within rounding of its mean ([`ROUNDING`]).

use canopy_filter_proto::v1::{OutlierEvent, StatsColumns};

/// A value this close to its event's mean, relative to the larger of the two, does not deviate from it: the mean
/// a tree merges level by level and the mean over all ranks at once differ in their last bits, and a rank that
/// sits at the mean must not be named for an event by one tree shape and not by another.
pub const ROUNDING: f64 = 1e-12;

/// Each event's mean, standard deviation and weight in one group of ranks, taken from the group's summaries.
#[derive(Debug, Clone, Default)]
pub struct Moments {
    /// Sorted, each once.
    ids: Vec<u64>,
    mean: Vec<f64>,
    std: Vec<f64>,
    weight: Vec<f64>,
}

impl Moments {
    /// From summaries of one metric (checked columns: rows sorted by id). The deviation is the population's,
    /// `sqrt(m2 / count)`, as the stats filter reports it.
    pub fn of(c: &StatsColumns, weighted: bool) -> Moments {
        let std: Vec<f64> =
            c.m2.iter()
                .zip(&c.count)
                .map(|(m2, n)| (m2.max(0.0) / *n as f64).sqrt())
                .collect();
        let total: f64 = c.mean.iter().map(|m| m.abs()).sum();
        let weight = c
            .mean
            .iter()
            .map(|m| match (weighted, total > 0.0) {
                (false, _) => 1.0,
                (true, true) => m.abs() / total,
                (true, false) => 0.0,
            })
            .collect();
        Moments {
            ids: c.id.clone(),
            mean: c.mean.clone(),
            std,
            weight,
        }
    }

    /// The contribution of `value` of event `id` and where the event is; `None` for an event the group's
    /// summaries lack (its rank's phase 0 missed the round at the root).
    fn contribution(&self, id: u64, value: f64) -> Option<(usize, f64)> {
        let i = self.ids.binary_search(&id).ok()?;
        let (mean, std) = (self.mean[i], self.std[i]);
        let deviation = (value - mean).abs();
        let c = if std > 0.0 && deviation > ROUNDING * value.abs().max(mean.abs()) {
            deviation / std * self.weight[i]
        } else {
            0.0
        };
        Some((i, c))
    }

    /// The score of a rank's `(event id, value)` pairs, summed in the order given (sorted by id).
    pub fn score(&self, values: &[(u64, f64)]) -> f64 {
        // From +0.0, not the -0.0 `sum` starts from: protobuf does not send a zero, so a -0.0 would arrive as
        // +0.0 and sort differently at the next level.
        values
            .iter()
            .filter_map(|&(id, v)| self.contribution(id, v))
            .fold(0.0, |score, (_, c)| score + c)
    }

    /// The `n` events that weigh most in a rank's score: largest contribution first, then smallest id; events
    /// that add nothing are left out.
    pub fn top_events(&self, values: &[(u64, f64)], n: usize) -> Vec<OutlierEvent> {
        let mut events: Vec<OutlierEvent> = values
            .iter()
            .filter_map(|&(id, value)| {
                let (i, contribution) = self.contribution(id, value)?;
                (contribution > 0.0).then(|| OutlierEvent {
                    id,
                    value,
                    mean: self.mean[i],
                    std: self.std[i],
                    contribution,
                })
            })
            .collect();
        events.sort_by(|a, b| b.contribution.total_cmp(&a.contribution).then(a.id.cmp(&b.id)));
        events.truncate(n);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(rows: &[(u64, u64, f64, f64)]) -> StatsColumns {
        StatsColumns {
            id: rows.iter().map(|r| r.0).collect(),
            count: rows.iter().map(|r| r.1).collect(),
            mean: rows.iter().map(|r| r.2).collect(),
            m2: rows.iter().map(|r| r.3).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn distance_in_deviations_summed_over_events() {
        // Event 1: mean 10, std 2 (m2 16 over 4); event 2: mean 30, std 0; event 3: mean 60, std 5.
        let c = columns(&[(1, 4, 10.0, 16.0), (2, 4, 30.0, 0.0), (3, 1, 60.0, 25.0)]);
        let plain = Moments::of(&c, false);
        let values = [(1, 14.0), (2, 99.0), (3, 50.0), (9, 1e9)];
        // 4 / 2 + 0 (no deviation) + 10 / 5; event 9 is not in the group's summaries.
        assert_eq!(plain.score(&values), 4.0);
        let top = plain.top_events(&values, 3);
        assert_eq!(
            top.iter().map(|e| (e.id, e.contribution)).collect::<Vec<_>>(),
            vec![(1, 2.0), (3, 2.0)]
        );
        assert_eq!((top[1].value, top[1].mean, top[1].std), (50.0, 60.0, 5.0));
        assert_eq!(plain.top_events(&values, 1).len(), 1);
        // Weighted by each mean's share of 100: 2 * 0.1 + 2 * 0.6.
        let weighted = Moments::of(&c, true);
        assert!((weighted.score(&values) - 1.4).abs() < 1e-12);
        assert_eq!(weighted.top_events(&values, 3)[0].id, 3);
    }

    #[test]
    fn all_means_zero_weigh_nothing() {
        let c = columns(&[(1, 2, 0.0, 8.0)]);
        assert_eq!(Moments::of(&c, true).score(&[(1, 2.0)]), 0.0);
        assert_eq!(Moments::of(&c, false).score(&[(1, 2.0)]), 1.0);
    }

    #[test]
    fn a_value_within_rounding_of_its_mean_does_not_deviate() {
        // A mean merged level by level, one bit off the value a rank reports at the mean exactly.
        let mean = 0.1 + 0.2;
        let c = columns(&[(1, 3, mean, 2.0)]);
        let m = Moments::of(&c, false);
        assert_eq!(m.score(&[(1, 0.3)]), 0.0);
        assert!(m.top_events(&[(1, 0.3)], 2).is_empty());
        // A deviation beyond rounding still counts.
        assert!(m.score(&[(1, 0.3 + 1e-9)]) > 0.0);
    }
}
