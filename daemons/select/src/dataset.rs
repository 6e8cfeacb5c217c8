//! The training set: a workflow's end-to-end latency and its candidate metrics, observation by observation.

use crate::SelectError;

/// The fewest observations a correlation says anything about: two points always lie on a line.
const MIN_OBSERVATIONS: usize = 3;

/// One training set: a target (the end-to-end latency of each step, or each round's mean) and one column per
/// candidate metric, all of the same length (one entry per observation, in time order).
///
/// Build it with [`Dataset::new`], which checks the shapes; the functions of this crate assume them.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// The candidate metrics' names, one per column (feature `i` is `names[i]` and `columns[i]`).
    pub names: Vec<String>,
    /// The end-to-end latency of each observation.
    pub target: Vec<f64>,
    /// One column per candidate metric, each holding one value per observation.
    pub columns: Vec<Vec<f64>>,
}

impl Dataset {
    /// Checks shapes: every column as long as the target, at least 3 observations, values finite.
    ///
    /// # Errors
    /// [`SelectError::Names`] when there is not one name per column, [`SelectError::TooFewObservations`],
    /// [`SelectError::ColumnLength`], [`SelectError::TargetNotFinite`] or [`SelectError::NotFinite`]; the
    /// first problem found is reported, in that order.
    pub fn new(names: Vec<String>, target: Vec<f64>, columns: Vec<Vec<f64>>) -> Result<Dataset, SelectError> {
        if names.len() != columns.len() {
            return Err(SelectError::Names {
                names: names.len(),
                columns: columns.len(),
            });
        }
        if target.len() < MIN_OBSERVATIONS {
            return Err(SelectError::TooFewObservations {
                observations: target.len(),
            });
        }
        for (column, (name, values)) in names.iter().zip(&columns).enumerate() {
            if values.len() != target.len() {
                return Err(SelectError::ColumnLength {
                    column,
                    name: name.clone(),
                    len: values.len(),
                    target: target.len(),
                });
            }
        }
        if let Some(index) = target.iter().position(|v| !v.is_finite()) {
            return Err(SelectError::TargetNotFinite { index });
        }
        for (column, (name, values)) in names.iter().zip(&columns).enumerate() {
            if let Some(index) = values.iter().position(|v| !v.is_finite()) {
                return Err(SelectError::NotFinite {
                    column,
                    name: name.clone(),
                    index,
                });
            }
        }
        Ok(Dataset {
            names,
            target,
            columns,
        })
    }

    /// The number of observations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.target.len()
    }

    /// Whether there are no observations (never, for a set [`Dataset::new`] accepted).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.target.is_empty()
    }

    /// The number of candidate metrics.
    #[must_use]
    pub fn features(&self) -> usize {
        self.columns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(ToString::to_string).collect()
    }

    fn message(result: Result<Dataset, SelectError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn a_well_formed_set_is_accepted_with_its_shape() {
        let ds = Dataset::new(
            names(&["a", "b"]),
            vec![1.0, 2.0, 3.0],
            vec![vec![0.0; 3], vec![4.0, 5.0, 6.0]],
        )
        .unwrap();
        assert_eq!((ds.len(), ds.features(), ds.is_empty()), (3, 2, false));
        let none = Dataset::new(Vec::new(), vec![1.0, 2.0, 3.0, 4.0], Vec::new()).unwrap();
        assert_eq!((none.len(), none.features()), (4, 0));
    }

    #[test]
    fn a_short_column_is_named_with_both_lengths() {
        let mut columns = vec![vec![0.0; 10]; 4];
        columns[3].pop();
        let names = names(&["a", "b", "c", "csym: read_input exclusive"]);
        assert_eq!(
            message(Dataset::new(names, vec![1.0; 10], columns)),
            "column 3 (\"csym: read_input exclusive\") has 9 values, the target 10"
        );
    }

    #[test]
    fn two_observations_are_too_few() {
        assert_eq!(
            message(Dataset::new(names(&["x"]), vec![1.0, 2.0], vec![vec![1.0, 2.0]])),
            "2 observations: at least 3 are needed to correlate"
        );
    }

    #[test]
    fn a_value_that_is_not_finite_is_named_by_column_and_position() {
        let mut bad = vec![1.0; 6];
        bad[4] = f64::NAN;
        assert_eq!(
            message(Dataset::new(
                names(&["w", "x"]),
                vec![0.0; 6],
                vec![vec![2.0; 6], bad]
            )),
            "column 1 (\"x\") value 4 is not finite"
        );
        let mut target = vec![0.0; 5];
        target[2] = f64::INFINITY;
        assert_eq!(
            message(Dataset::new(names(&["x"]), target, vec![vec![1.0; 5]])),
            "target value 2 is not finite"
        );
    }

    #[test]
    fn names_must_match_the_columns() {
        assert_eq!(
            message(Dataset::new(names(&["x"]), vec![0.0; 3], vec![vec![0.0; 3]; 2])),
            "1 names for 2 columns"
        );
    }
}
