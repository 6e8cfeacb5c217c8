//! The recent means of every event of a stream of summaries, for the sparklines under its table.

use std::collections::{HashMap, VecDeque};

use canopy_proto::filters::v1::EventStats;

/// Rounds a sparkline spans.
pub const SPAN: usize = 60;
/// The value of a full sparkline cell.
pub const TOP: u64 = 1000;

/// Each (application, event, metric)'s mean over the latest `SPAN` rounds, oldest first; a round without the
/// event counts 0. The application is "" for a row over every application.
#[derive(Debug, Default)]
pub struct Means {
    series: HashMap<(String, u64, i32), VecDeque<f64>>,
    rounds: usize,
}

impl Means {
    pub fn push(&mut self, stats: &[EventStats]) {
        self.rounds += 1;
        let mut seen = std::collections::HashSet::new();
        for s in stats {
            let key = (s.app.clone(), s.id, s.metric);
            seen.insert(key.clone());
            let mean = s.summary.as_ref().map_or(0.0, |x| x.mean);
            let rounds = self.rounds;
            let series = self.series.entry(key).or_insert_with(|| {
                // A new event: the rounds before it appeared are zeros.
                std::iter::repeat_n(0.0, (rounds - 1).min(SPAN - 1)).collect()
            });
            series.push_back(mean);
        }
        for (key, series) in &mut self.series {
            if !seen.contains(key) {
                series.push_back(0.0);
            }
            while series.len() > SPAN {
                series.pop_front();
            }
        }
    }

    /// The series of an event's metric for a sparkline whose top is `TOP`: scaled between the series' smallest
    /// mean (an eighth of the top) and its largest (the top), so that the changes of a mean that stays far from
    /// zero show; a series that never changes is drawn at half height.
    pub fn bars(&self, app: &str, id: u64, metric: i32) -> Vec<u64> {
        let Some(s) = self.series.get(&(app.to_string(), id, metric)) else {
            return Vec::new();
        };
        let most = s.iter().copied().fold(f64::MIN, f64::max);
        let least = s.iter().copied().fold(f64::MAX, f64::min);
        if most - least <= f64::EPSILON * most.abs().max(1.0) {
            return vec![TOP / 2; s.len()];
        }
        s.iter()
            .map(|v| TOP / 8 + ((v - least) / (most - least) * (TOP - TOP / 8) as f64).round() as u64)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::Summary;

    fn stat(id: u64, mean: f64) -> EventStats {
        EventStats {
            id,
            metric: 3,
            summary: Some(Summary {
                mean,
                ..Default::default()
            }),
            quantiles: Vec::new(),
            app: String::new(),
        }
    }

    #[test]
    fn means_keep_the_latest_rounds_scaled_to_the_largest() {
        let mut m = Means::default();
        m.push(&[stat(1, 10.0)]);
        m.push(&[stat(1, 20.0), stat(2, 5.0)]);
        m.push(&[stat(2, 5.0)]);
        // 0 (absent), 10 and 20: the smallest an eighth, the largest whole.
        assert_eq!(m.bars("", 1, 3), vec![563, 1000, 125]);
        assert_eq!(m.bars("", 2, 3), vec![125, 1000, 1000]);
        assert!(m.bars("", 9, 3).is_empty());
        let mut flat = Means::default();
        flat.push(&[stat(1, 7.0)]);
        flat.push(&[stat(1, 7.0)]);
        assert_eq!(flat.bars("", 1, 3), vec![TOP / 2, TOP / 2]);
        for k in 0..100 {
            m.push(&[stat(1, f64::from(k))]);
        }
        let bars = m.bars("", 1, 3);
        assert_eq!(bars.len(), SPAN);
        assert_eq!(*bars.last().unwrap(), 1000);
    }

    #[test]
    fn each_application_has_its_own_series() {
        let of = |app: &str, mean| EventStats {
            app: app.into(),
            ..stat(1, mean)
        };
        let mut m = Means::default();
        m.push(&[of("sim", 10.0), of("viz", 1.0)]);
        m.push(&[of("sim", 20.0), of("viz", 1.0)]);
        assert_eq!(m.bars("sim", 1, 3), vec![125, 1000]);
        assert_eq!(m.bars("viz", 1, 3), vec![TOP / 2, TOP / 2]);
        assert!(m.bars("", 1, 3).is_empty());
    }
}
