//! Which metrics explain the latency: Pearson's correlation, the CFS merit of a subset of metrics, and the
//! best-first search for the subset of highest merit.
//!
//! A subset's merit (Hall's correlation-based feature selection) rewards metrics correlated with the latency
//! and penalizes metrics correlated with each other: two copies of one driver explain no more than one.

use std::collections::HashSet;

use crate::Dataset;

/// A merit gain smaller than this is no progress (Weka's threshold for a forward search): it neither
/// replaces the best subset by a larger one nor resets the count of stale expansions.
const MIN_GAIN: f64 = 1e-5;

/// Pearson's correlation; 0 when either side is constant (no variance), so a constant metric explains nothing.
///
/// The values are scaled before they are multiplied, so any finite values give a finite result in [-1, 1];
/// fewer than 2 values give 0.
///
/// # Panics
/// If the slices differ in length.
#[must_use]
pub fn correlation(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(
        a.len(),
        b.len(),
        "correlation of {} values with {}",
        a.len(),
        b.len()
    );
    pearson(Centered::new(a).as_ref(), Centered::new(b).as_ref())
}

/// A non-constant series, scaled to at most 1 in magnitude and centered on its mean: what every correlation
/// of it needs, computed once.
struct Centered {
    deviations: Vec<f64>,
    /// The square root of the sum of the squared deviations.
    norm: f64,
}

impl Centered {
    /// `None` for a constant series (or one of fewer than 2 values).
    fn new(values: &[f64]) -> Option<Centered> {
        let first = *values.first()?;
        if values.iter().all(|&v| v == first) {
            return None;
        }
        // Dividing by the largest magnitude first keeps the squares below overflow for any finite values.
        let scale = values.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
        let mean = values.iter().map(|v| v / scale).sum::<f64>() / values.len() as f64;
        let deviations: Vec<f64> = values.iter().map(|v| v / scale - mean).collect();
        let norm = deviations.iter().map(|d| d * d).sum::<f64>().sqrt();
        (norm > 0.0).then_some(Centered { deviations, norm })
    }
}

/// The correlation of two centered series (symmetric to the bit); 0 when either is constant.
fn pearson(a: Option<&Centered>, b: Option<&Centered>) -> f64 {
    let (Some(a), Some(b)) = (a, b) else {
        return 0.0;
    };
    let dot: f64 = a.deviations.iter().zip(&b.deviations).map(|(x, y)| x * y).sum();
    (dot / (a.norm * b.norm)).clamp(-1.0, 1.0)
}

/// Hall's merit of a subset, given its features sorted by index and their absolute correlations: the sum of
/// the correlations with the target over the square root of k plus twice the sum of the correlations between
/// distinct pairs (k * mean r_cf / sqrt(k + k (k - 1) mean r_ff)). Every caller sums in the same order, so the
/// search and [`merit`] agree to the bit.
fn subset_merit(
    subset: &[usize],
    with_target: impl Fn(usize) -> f64,
    between: impl Fn(usize, usize) -> f64,
) -> f64 {
    if subset.is_empty() {
        return 0.0;
    }
    let relevance: f64 = subset.iter().map(|&f| with_target(f)).sum();
    let mut redundancy = 0.0;
    for (at, &f) in subset.iter().enumerate() {
        for &g in &subset[at + 1..] {
            redundancy += between(f, g);
        }
    }
    relevance / (subset.len() as f64 + 2.0 * redundancy).sqrt()
}

/// A subset sorted by feature index without repeats.
///
/// # Panics
/// If a feature is out of range.
fn normalized(ds: &Dataset, subset: &[usize]) -> Vec<usize> {
    let mut subset = subset.to_vec();
    subset.sort_unstable();
    subset.dedup();
    if let Some(&last) = subset.last() {
        assert!(
            last < ds.features(),
            "feature {last} is out of range: the set has {}",
            ds.features()
        );
    }
    subset
}

/// The merit of one subset (exposed for tests and for reporting the full set's merit).
///
/// The order of `subset` and repeats in it do not matter; the empty subset's merit is 0. The result equals, to
/// the bit, the merit [`select`] reports for the same subset.
///
/// # Panics
/// If a feature is out of range.
#[must_use]
pub fn merit(ds: &Dataset, subset: &[usize]) -> f64 {
    let subset = normalized(ds, subset);
    let target = Centered::new(&ds.target);
    let centered: Vec<Option<Centered>> = subset.iter().map(|&f| Centered::new(&ds.columns[f])).collect();
    let column = |f: usize| centered[subset.binary_search(&f).unwrap()].as_ref();
    subset_merit(
        &subset,
        |f| pearson(column(f), target.as_ref()).abs(),
        |f, g| pearson(column(f), column(g)).abs(),
    )
}

/// Every absolute correlation the search needs, computed once.
struct Correlations {
    features: usize,
    /// |r| of each feature with the target.
    with_target: Vec<f64>,
    /// |r| between features f and g at `f * features + g`, both ways.
    between: Vec<f64>,
}

impl Correlations {
    fn new(ds: &Dataset) -> Correlations {
        let features = ds.features();
        let target = Centered::new(&ds.target);
        let centered: Vec<Option<Centered>> = ds.columns.iter().map(|c| Centered::new(c)).collect();
        let with_target = centered
            .iter()
            .map(|c| pearson(c.as_ref(), target.as_ref()).abs())
            .collect();
        let mut between = vec![1.0; features * features];
        for f in 0..features {
            for g in f + 1..features {
                let r = pearson(centered[f].as_ref(), centered[g].as_ref()).abs();
                between[f * features + g] = r;
                between[g * features + f] = r;
            }
        }
        Correlations {
            features,
            with_target,
            between,
        }
    }

    fn merit(&self, subset: &[usize]) -> f64 {
        subset_merit(
            subset,
            |f| self.with_target[f],
            |f, g| self.between[f * self.features + g],
        )
    }
}

/// How far the best-first search looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Consecutive expansions without a better merit before the search stops (Weka's default 5). It is also
    /// how many open subsets the search keeps, the best ones, as Weka's does. 0 is taken as 1.
    pub max_stale: usize,
}

impl Default for SearchOptions {
    fn default() -> SearchOptions {
        SearchOptions { max_stale: 5 }
    }
}

/// One feature's place in the ranking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    /// The feature's index in the training set.
    pub feature: usize,
    /// |correlation| with the target
    pub correlation: f64,
}

/// What the search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Every feature, by |correlation with the target|, highest first (ties: lower index first).
    pub ranking: Vec<Ranked>,
    /// The subset the best-first search found, sorted by feature index.
    pub subset: Vec<usize>,
    /// Its CFS merit: k * mean |r_cf| / sqrt(k + k (k - 1) * mean |r_ff|).
    pub merit: f64,
    /// Subsets whose merit was computed (each at most once; the empty start is not counted).
    pub evaluated: usize,
}

/// A subset the search reached, with its merit.
struct Node {
    subset: Vec<usize>,
    merit: f64,
}

/// How a newly evaluated subset compares with the best one so far.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Its merit is higher by more than [`MIN_GAIN`]: it replaces the best, and the search made progress.
    Better,
    /// Its merit is no lower and it has fewer features: it replaces the best, but that is no progress.
    Smaller,
    /// Anything else (a tie of the same size included: the earlier found stays).
    Worse,
}

impl Verdict {
    fn of(merit: f64, len: usize, best: &Node) -> Verdict {
        if merit - best.merit > MIN_GAIN {
            Verdict::Better
        } else if merit >= best.merit && len < best.subset.len() {
            Verdict::Smaller
        } else {
            Verdict::Worse
        }
    }
}

/// The open subsets, highest merit first, equal merits in the order they came; at most `capacity` of them,
/// the lowest dropped.
struct Open {
    capacity: usize,
    nodes: Vec<Node>,
}

impl Open {
    fn push(&mut self, node: Node) {
        let at = self
            .nodes
            .iter()
            .position(|n| node.merit > n.merit)
            .unwrap_or(self.nodes.len());
        if at < self.capacity {
            self.nodes.insert(at, node);
            self.nodes.truncate(self.capacity);
        }
    }

    fn pop(&mut self) -> Option<Node> {
        (!self.nodes.is_empty()).then(|| self.nodes.remove(0))
    }
}

/// CfsSubsetEval with BestFirst, as Weka runs them by default: forward search from the empty set, a priority
/// queue of open subsets ordered by merit, each expansion adds one feature not in the subset, stop after
/// `max_stale` consecutive expansions that do not improve on the best merit seen; the best subset wins (ties: the
/// smaller, then the earlier found). Correlations are absolute Pearson, computed once into a matrix.
///
/// In detail: each subset is evaluated once (one reached again through another parent is skipped); an
/// expansion improves when one of its new subsets beats the best merit by more than 1e-5; a new subset also
/// becomes the best, without counting as an improvement, when its merit is no lower and it has fewer features.
/// The open queue keeps the `max_stale` best subsets. The result depends only on the data and the options.
#[must_use]
pub fn select(ds: &Dataset, opts: &SearchOptions) -> Selection {
    let corr = Correlations::new(ds);
    let mut ranking: Vec<Ranked> = corr
        .with_target
        .iter()
        .enumerate()
        .map(|(feature, &correlation)| Ranked { feature, correlation })
        .collect();
    // Stable: equal correlations keep the lower index first.
    ranking.sort_by(|a, b| b.correlation.total_cmp(&a.correlation));

    let max_stale = opts.max_stale.max(1);
    let mut open = Open {
        capacity: max_stale,
        nodes: vec![Node {
            subset: Vec::new(),
            merit: 0.0,
        }],
    };
    let mut seen: HashSet<Vec<usize>> = HashSet::from([Vec::new()]);
    let mut best = Node {
        subset: Vec::new(),
        merit: 0.0,
    };
    let mut evaluated = 0;
    let mut stale = 0;
    while stale < max_stale {
        let Some(node) = open.pop() else { break };
        let mut improved = false;
        for feature in 0..corr.features {
            let Err(at) = node.subset.binary_search(&feature) else {
                continue;
            };
            let mut subset = node.subset.clone();
            subset.insert(at, feature);
            if !seen.insert(subset.clone()) {
                continue;
            }
            let merit = corr.merit(&subset);
            evaluated += 1;
            let verdict = Verdict::of(merit, subset.len(), &best);
            if verdict != Verdict::Worse {
                improved |= verdict == Verdict::Better;
                best = Node {
                    subset: subset.clone(),
                    merit,
                };
            }
            open.push(Node { subset, merit });
        }
        stale = if improved { 0 } else { stale + 1 };
    }
    Selection {
        ranking,
        subset: best.subset,
        merit: best.merit,
        evaluated,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::testing::{SplitMix64, drivers_and_noise};

    fn dataset(target: Vec<f64>, columns: Vec<Vec<f64>>) -> Dataset {
        let names = (0..columns.len()).map(|i| format!("m{i}")).collect();
        Dataset::new(names, target, columns).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn correlation_of_lines_constants_and_a_hand_computed_pair() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!(close(correlation(&x, &[3.0, 5.0, 7.0, 9.0, 11.0]), 1.0));
        assert!(close(correlation(&x, &[-1.0, -3.0, -5.0, -7.0, -9.0]), -1.0));
        assert_eq!(correlation(&x, &[0.1; 5]), 0.0);
        assert_eq!(correlation(&[0.1; 5], &x), 0.0);
        // Deviations (-1.5, -0.5, 0.5, 1.5) and (-1.5, 0.5, -0.5, 1.5): 4 / sqrt(5 * 5).
        assert!(close(
            correlation(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 4.0]),
            0.8
        ));
        assert_eq!(correlation(&[1.0], &[2.0]), 0.0);
    }

    #[test]
    fn correlation_survives_values_whose_squares_overflow() {
        let r = correlation(&[1e300, 2e300, 3e300], &[-1e-300, 0.0, 1e-300]);
        assert!(close(r, 1.0), "{r}");
    }

    #[test]
    fn merit_of_two_features_by_hand() {
        // r(f0, t) = 0.8, r(f1, t) = -1, r(f0, f1) = -0.8: (0.8 + 1) / sqrt(2 + 2 * 0.8) = 1.8 / sqrt(3.6).
        let ds = dataset(
            vec![1.0, 2.0, 3.0, 4.0],
            vec![vec![1.0, 3.0, 2.0, 4.0], vec![4.0, 3.0, 2.0, 1.0]],
        );
        assert!(close(merit(&ds, &[0, 1]), 1.8 / 3.6_f64.sqrt()));
        assert!(close(merit(&ds, &[1, 0, 1]), 1.8 / 3.6_f64.sqrt()));
        assert!(close(merit(&ds, &[0]), 0.8));
        assert_eq!(merit(&ds, &[]), 0.0);
        // Uncorrelated features add up: r = 0.8 and 0.6 with the target, 0 between them.
        let ds = dataset(
            vec![1.0, 2.0, 3.0, 4.0],
            vec![vec![1.0, 3.0, 2.0, 4.0], vec![2.0, 1.0, 4.0, 3.0]],
        );
        assert!(close(merit(&ds, &[0, 1]), 1.4 / 2.0_f64.sqrt()));
    }

    #[test]
    #[should_panic(expected = "feature 2 is out of range: the set has 2")]
    fn merit_of_a_feature_out_of_range_panics() {
        let ds = dataset(vec![1.0, 2.0, 3.0], vec![vec![1.0, 2.0, 3.0]; 2]);
        let _ = merit(&ds, &[0, 2]);
    }

    #[test]
    fn the_drivers_are_chosen_once_each_and_the_noise_left_out() {
        for seed in 1..=5 {
            let (ds, [a, b, c]) = drivers_and_noise(seed, 200, 10);
            let sel = select(&ds, &SearchOptions::default());
            assert!(sel.subset.contains(&b), "seed {seed}: {sel:?}");
            assert!(
                sel.subset.contains(&a) != sel.subset.contains(&c),
                "seed {seed}: {sel:?}"
            );
            assert_eq!(sel.subset.len(), 2, "seed {seed}: {sel:?}");
            let mut top: Vec<usize> = sel.ranking[..3].iter().map(|r| r.feature).collect();
            top.sort_unstable();
            assert_eq!(top, [a, b, c], "seed {seed}: {:?}", sel.ranking);
            assert_eq!(sel.merit.to_bits(), merit(&ds, &sel.subset).to_bits());
        }
    }

    #[test]
    fn an_exact_copy_ties_and_the_earlier_column_is_kept() {
        let mut rng = SplitMix64::new(7);
        let (a, b) = (rng.column(50), rng.column(50));
        let target = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let ds = dataset(target, vec![rng.column(50), a.clone(), b, a]);
        let sel = select(&ds, &SearchOptions::default());
        assert_eq!(sel.subset, [1, 2]);
        assert_eq!(sel.ranking[0].correlation, sel.ranking[1].correlation);
        assert!(sel.ranking[0].feature < sel.ranking[1].feature);
    }

    #[test]
    fn a_constant_metric_explains_nothing() {
        let mut rng = SplitMix64::new(3);
        let a = rng.column(30);
        let ds = dataset(a.clone(), vec![vec![2.5; 30], a]);
        let sel = select(&ds, &SearchOptions::default());
        assert_eq!(sel.subset, [1]);
        assert_eq!(
            sel.ranking[1],
            Ranked {
                feature: 0,
                correlation: 0.0
            }
        );
    }

    #[test]
    fn nothing_correlated_selects_nothing() {
        let ds = dataset(vec![1.0, 2.0, 3.0], vec![vec![5.0; 3]; 3]);
        let sel = select(&ds, &SearchOptions::default());
        assert_eq!((sel.subset.len(), sel.merit, sel.evaluated), (0, 0.0, 7));
        let none = dataset(vec![1.0, 2.0, 3.0], Vec::new());
        assert_eq!(select(&none, &SearchOptions { max_stale: 0 }).evaluated, 0);
    }

    #[test]
    fn the_open_queue_keeps_the_best_in_arrival_order_among_equals() {
        let node = |id: usize, merit: f64| Node {
            subset: vec![id],
            merit,
        };
        let mut open = Open {
            capacity: 3,
            nodes: Vec::new(),
        };
        for n in [
            node(0, 0.5),
            node(1, 0.7),
            node(2, 0.5),
            node(3, 0.1),
            node(4, 0.6),
        ] {
            open.push(n);
        }
        let order: Vec<usize> = std::iter::from_fn(|| open.pop()).map(|n| n.subset[0]).collect();
        assert_eq!(order, [1, 4, 0]);
    }

    #[test]
    fn only_a_real_gain_counts_and_ties_go_to_the_smaller_subset() {
        let best = Node {
            subset: vec![0, 1],
            merit: 0.5,
        };
        assert_eq!(Verdict::of(0.5 + 2e-5, 3, &best), Verdict::Better);
        assert_eq!(Verdict::of(0.5 + 2e-5, 1, &best), Verdict::Better);
        assert_eq!(Verdict::of(0.5 + 5e-6, 3, &best), Verdict::Worse);
        assert_eq!(Verdict::of(0.5 + 5e-6, 1, &best), Verdict::Smaller);
        assert_eq!(Verdict::of(0.5, 1, &best), Verdict::Smaller);
        assert_eq!(Verdict::of(0.5, 2, &best), Verdict::Worse);
        assert_eq!(Verdict::of(0.5 - 1e-9, 1, &best), Verdict::Worse);
    }

    /// A small set with a few latent drivers: columns are noisy copies of a driver, pure noise or constant.
    fn random_set(seed: u64, observations: usize, features: usize) -> Dataset {
        let mut rng = SplitMix64::new(seed);
        let drivers: Vec<Vec<f64>> = (0..3).map(|_| rng.column(observations)).collect();
        let weights = [rng.symmetric(), rng.symmetric(), rng.symmetric()];
        let target = (0..observations)
            .map(|i| (0..3).map(|d| weights[d] * drivers[d][i]).sum::<f64>() + 0.3 * rng.symmetric())
            .collect();
        let columns = (0..features)
            .map(|_| match rng.next_u64() % 5 {
                0 => rng.column(observations),
                1 => vec![rng.symmetric(); observations],
                kind => {
                    let driver = &drivers[(kind - 2) as usize];
                    let noise = rng.symmetric().abs();
                    driver.iter().map(|v| v + noise * rng.symmetric()).collect()
                }
            })
            .collect();
        dataset(target, columns)
    }

    fn every_subset(features: usize) -> impl Iterator<Item = Vec<usize>> {
        (0..1_usize << features).map(move |mask| (0..features).filter(|f| mask >> f & 1 == 1).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Best-first is a heuristic: it need not find the best subset, but it never does worse than the best
        /// single feature (up to the gain it ignores), reports its subset's own merit, and ranks every feature.
        #[test]
        fn the_search_is_no_worse_than_any_single_feature(
            seed in any::<u64>(),
            observations in 3_usize..40,
            features in 0_usize..=8,
            max_stale in 0_usize..8,
        ) {
            let ds = random_set(seed, observations, features);
            let sel = select(&ds, &SearchOptions { max_stale });
            prop_assert!(sel.subset.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(sel.subset.iter().all(|&f| f < features));
            prop_assert_eq!(sel.merit.to_bits(), merit(&ds, &sel.subset).to_bits());
            let best_single = (0..features).map(|f| merit(&ds, &[f])).fold(0.0, f64::max);
            prop_assert!(sel.merit >= best_single - MIN_GAIN, "{} < {}", sel.merit, best_single);
            let optimum = every_subset(features).map(|s| merit(&ds, &s)).fold(0.0, f64::max);
            prop_assert!(sel.merit <= optimum);
            prop_assert!(sel.evaluated < 1 << features);
            prop_assert_eq!(&sel, &select(&ds, &SearchOptions { max_stale }));

            let mut ranked: Vec<usize> = sel.ranking.iter().map(|r| r.feature).collect();
            ranked.sort_unstable();
            prop_assert_eq!(ranked, (0..features).collect::<Vec<_>>());
            for pair in sel.ranking.windows(2) {
                let (x, y) = (pair[0], pair[1]);
                prop_assert!(x.correlation > y.correlation || (x.correlation == y.correlation && x.feature < y.feature));
            }
            for r in &sel.ranking {
                prop_assert_eq!(r.correlation, correlation(&ds.columns[r.feature], &ds.target).abs());
            }
        }

        /// With patience for every subset, the search visits each once and finds the optimum (up to the gain
        /// it ignores).
        #[test]
        fn an_unbounded_search_is_exhaustive(
            seed in any::<u64>(),
            observations in 3_usize..30,
            features in 0_usize..=7,
        ) {
            let ds = random_set(seed, observations, features);
            let sel = select(&ds, &SearchOptions { max_stale: (1 << features) + 1 });
            prop_assert_eq!(sel.evaluated, (1 << features) - 1);
            let optimum = every_subset(features).map(|s| merit(&ds, &s)).fold(0.0, f64::max);
            prop_assert!(sel.merit >= optimum - MIN_GAIN && sel.merit <= optimum);
        }
    }
}
