//! How well a subset of metrics predicts the latency: a linear model trained on the earlier observations,
//! validated on the later ones.

use crate::{Dataset, SelectError};

/// How well a linear model over a subset of metrics predicted the latency of the validation observations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// The validation rows' sum of |prediction - actual| over the sum of |training mean - actual| (Weka's
    /// "relative absolute error"), as a fraction (0.094 for 9.4%). When every validation latency equals the
    /// training mean, it is 0 for exact predictions and infinite otherwise.
    pub relative_absolute_error: f64,
    /// The observations the model was trained on (the first ones).
    pub train: usize,
    /// The observations it was validated on (the rest).
    pub validate: usize,
}

/// A linear least-squares model of the target over the given features (with an intercept; a small ridge term,
/// 1e-9 times the trace, keeps a rank-deficient system solvable; features are standardized on the training rows
/// first), trained on the first `train_fraction` of the observations in order (0.8 in the paper) and validated
/// on the rest. Errors if fewer than 2 validation or training rows. An empty subset predicts the training mean
/// (RAE 1.0 up to rounding).
///
/// The training rows are the first `round(len * train_fraction)`. The order of `subset` and repeats in it do
/// not matter; a feature constant over the training rows contributes nothing.
///
/// # Errors
/// [`SelectError::TrainFraction`] unless `0 < train_fraction < 1`, [`SelectError::TooFewRows`] when the split
/// leaves fewer than 2 rows on a side, [`SelectError::UnknownFeature`] for a feature out of range.
pub fn prediction_error(ds: &Dataset, subset: &[usize], train_fraction: f64) -> Result<Fit, SelectError> {
    if !(train_fraction > 0.0 && train_fraction < 1.0) {
        return Err(SelectError::TrainFraction {
            fraction: train_fraction,
        });
    }
    let observations = ds.len();
    let train = ((observations as f64 * train_fraction).round() as usize).min(observations);
    let validate = observations - train;
    if train < 2 || validate < 2 {
        return Err(SelectError::TooFewRows {
            observations,
            fraction: train_fraction,
            train,
            validate,
        });
    }
    let mut features = subset.to_vec();
    features.sort_unstable();
    features.dedup();
    if let Some(&feature) = features.iter().find(|&&f| f >= ds.features()) {
        return Err(SelectError::UnknownFeature {
            feature,
            features: ds.features(),
        });
    }

    let model = Model::train(ds, &features, train);
    let (mut error, mut baseline) = (0.0, 0.0);
    for row in train..observations {
        let actual = ds.target[row];
        error += (model.predict(ds, row) - actual).abs();
        baseline += (model.mean - actual).abs();
    }
    let relative_absolute_error = if baseline > 0.0 {
        error / baseline
    } else if error == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Ok(Fit {
        relative_absolute_error,
        train,
        validate,
    })
}

/// A linear model over standardized features: the target's training mean plus a weighted sum of
/// `(x - center) / scale` per feature.
struct Model {
    mean: f64,
    /// (feature, center, scale, weight)
    terms: Vec<(usize, f64, f64, f64)>,
}

impl Model {
    fn train(ds: &Dataset, features: &[usize], rows: usize) -> Model {
        let n = rows as f64;
        let mean = ds.target[..rows].iter().sum::<f64>() / n;
        // Each feature's training rows, centered and scaled to unit variance (left at 0 when constant).
        let mut standards = Vec::with_capacity(features.len());
        let columns: Vec<Vec<f64>> = features
            .iter()
            .map(|&f| {
                let values = &ds.columns[f][..rows];
                let center = values.iter().sum::<f64>() / n;
                let spread = (values.iter().map(|v| (v - center).powi(2)).sum::<f64>() / n).sqrt();
                let scale = if spread > 0.0 { spread } else { 1.0 };
                standards.push((center, scale));
                values.iter().map(|v| (v - center) / scale).collect()
            })
            .collect();

        // The normal equations Z'Z w = Z'(y - mean), with a ridge of 1e-9 times the trace on the diagonal.
        let k = features.len();
        let mut normal = vec![vec![0.0; k + 1]; k];
        for i in 0..k {
            for j in i..k {
                let dot: f64 = columns[i].iter().zip(&columns[j]).map(|(a, b)| a * b).sum();
                normal[i][j] = dot;
                normal[j][i] = dot;
            }
            normal[i][k] = columns[i]
                .iter()
                .zip(&ds.target[..rows])
                .map(|(z, y)| z * (y - mean))
                .sum();
        }
        let ridge = 1e-9 * (0..k).map(|i| normal[i][i]).sum::<f64>();
        for (i, row) in normal.iter_mut().enumerate() {
            row[i] += ridge;
        }
        let weights = solve(normal);
        let terms = features
            .iter()
            .zip(standards)
            .zip(weights)
            .map(|((&f, (center, scale)), weight)| (f, center, scale, weight))
            .collect();
        Model { mean, terms }
    }

    fn predict(&self, ds: &Dataset, row: usize) -> f64 {
        self.terms
            .iter()
            .fold(self.mean, |sum, &(f, center, scale, weight)| {
                sum + weight * (ds.columns[f][row] - center) / scale
            })
    }
}

/// Solves the system whose augmented rows are `[a | b]` by Gaussian elimination with partial pivoting. A
/// variable whose pivot is zero (no information about it) is given 0.
fn solve(mut rows: Vec<Vec<f64>>) -> Vec<f64> {
    let k = rows.len();
    for col in 0..k {
        let pivot = (col..k)
            .max_by(|&a, &b| rows[a][col].abs().total_cmp(&rows[b][col].abs()))
            .unwrap();
        if rows[pivot][col] == 0.0 {
            continue;
        }
        rows.swap(col, pivot);
        let (upper, lower) = rows.split_at_mut(col + 1);
        let pivot = &upper[col];
        for row in lower {
            let factor = row[col] / pivot[col];
            if factor != 0.0 {
                for (value, above) in row[col..].iter_mut().zip(&pivot[col..]) {
                    *value -= factor * above;
                }
            }
        }
    }
    let mut x = vec![0.0; k];
    for col in (0..k).rev() {
        if rows[col][col] != 0.0 {
            let rest: f64 = (col + 1..k).map(|c| rows[col][c] * x[c]).sum();
            x[col] = (rows[col][k] - rest) / rows[col][col];
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{SplitMix64, drivers_and_noise};

    fn rae(ds: &Dataset, subset: &[usize]) -> f64 {
        prediction_error(ds, subset, 0.8).unwrap().relative_absolute_error
    }

    fn dataset(target: Vec<f64>, columns: Vec<Vec<f64>>) -> Dataset {
        let names = (0..columns.len()).map(|i| format!("m{i}")).collect();
        Dataset::new(names, target, columns).unwrap()
    }

    #[test]
    fn an_exact_linear_target_is_predicted_exactly() {
        let mut rng = SplitMix64::new(11);
        let (a, b, noise) = (rng.column(50), rng.column(50), rng.column(50));
        let target = a.iter().zip(&b).map(|(x, y)| 1.0 + 2.0 * x - 3.0 * y).collect();
        let ds = dataset(target, vec![noise, a, b]);
        let fit = prediction_error(&ds, &[2, 1], 0.8).unwrap();
        assert!(fit.relative_absolute_error < 1e-6, "{fit:?}");
        assert_eq!((fit.train, fit.validate), (40, 10));
        assert!(rae(&ds, &[1]) > 0.2);
    }

    #[test]
    fn noise_predicts_no_better_than_the_mean() {
        let mut rng = SplitMix64::new(12);
        let target = rng.column(200);
        let ds = dataset(target, (0..8).map(|_| rng.column(200)).collect());
        let all: Vec<usize> = (0..8).collect();
        assert!(rae(&ds, &all) > 0.9, "{}", rae(&ds, &all));
    }

    #[test]
    fn an_empty_subset_predicts_the_training_mean() {
        let (ds, _) = drivers_and_noise(1, 60, 2);
        assert!((rae(&ds, &[]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_constant_or_repeated_feature_keeps_the_system_solvable() {
        let (ds, [a, b, _]) = drivers_and_noise(2, 80, 0);
        let mut columns = ds.columns.clone();
        columns.push(vec![4.0; 80]);
        columns.push(ds.columns[a].clone());
        columns.push(ds.columns[a].iter().map(|v| 3.0 * v + 7.0).collect());
        // A near copy: its difference from `a` (1e-9) is far below what a ridge of 1e-9 times the trace lets
        // the model fit, so it cannot be used to chase the noise.
        let mut rng = SplitMix64::new(5);
        columns.push(ds.columns[a].iter().map(|v| v + 1e-9 * rng.symmetric()).collect());
        let ds = dataset(ds.target.clone(), columns);
        assert!((rae(&ds, &[3]) - 1.0).abs() < 1e-12);
        let drivers = rae(&ds, &[a, b]);
        for copies in [&[a, b, 3, 4][..], &[a, b, 5], &[a, b, 6], &[a, b, 3, 4, 5, 6]] {
            let with_copies = rae(&ds, copies);
            assert!(
                (with_copies - drivers).abs() < 1e-6,
                "{copies:?}: {with_copies}, drivers {drivers}"
            );
        }
    }

    /// The point of selecting: with few training rows, a model over the drivers alone predicts far better
    /// than one over every metric, which fits the noise.
    #[test]
    fn the_drivers_beat_the_full_set_when_rows_are_few() {
        for seed in 1..=10 {
            let (ds, [a, b, _]) = drivers_and_noise(seed, 40, 25);
            let all: Vec<usize> = (0..ds.features()).collect();
            let (drivers, full) = (rae(&ds, &[a, b]), rae(&ds, &all));
            assert!(
                drivers < 0.1 && full > 1.5 * drivers,
                "seed {seed}: drivers {drivers}, full {full}"
            );
        }
    }

    #[test]
    fn a_split_without_two_rows_a_side_or_a_feature_out_of_range_is_refused() {
        let (ds, _) = drivers_and_noise(3, 5, 0);
        let message =
            |subset: &[usize], fraction| prediction_error(&ds, subset, fraction).unwrap_err().to_string();
        assert_eq!(
            message(&[0], 0.8),
            "5 observations split at 0.8 leave 4 for training and 1 for validation: at least 2 of each are needed"
        );
        assert_eq!(
            message(&[0], 0.2),
            "5 observations split at 0.2 leave 1 for training and 4 for validation: at least 2 of each are needed"
        );
        assert_eq!(message(&[0], 1.0), "train fraction 1 is not between 0 and 1");
        assert_eq!(
            message(&[0], f64::NAN),
            "train fraction NaN is not between 0 and 1"
        );
        assert_eq!(message(&[0, 3], 0.6), "feature 3 is out of range: the set has 3");
        assert_eq!(prediction_error(&ds, &[0], 0.6).unwrap().validate, 2);
    }
}
