//! What can go wrong: a training set that does not hold together, or a check that cannot be run on it.

/// Why a training set was refused, or why a subset's prediction error could not be measured. Column and value
/// positions count from 0, as feature indices do everywhere in this crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectError {
    /// There is not one name per column.
    #[error("{names} names for {columns} columns")]
    Names {
        /// How many names were given.
        names: usize,
        /// How many columns were given.
        columns: usize,
    },
    /// Too few observations for a correlation to mean anything (two points always lie on a line).
    #[error("{observations} observations: at least 3 are needed to correlate")]
    TooFewObservations {
        /// How many observations the target holds.
        observations: usize,
    },
    /// A column is not as long as the target.
    #[error("column {column} ({name:?}) has {len} values, the target {target}")]
    ColumnLength {
        /// The column's position.
        column: usize,
        /// The column's name.
        name: String,
        /// How many values the column holds.
        len: usize,
        /// How many values the target holds.
        target: usize,
    },
    /// The target holds an infinity or a NaN.
    #[error("target value {index} is not finite")]
    TargetNotFinite {
        /// The observation's position.
        index: usize,
    },
    /// A column holds an infinity or a NaN.
    #[error("column {column} ({name:?}) value {index} is not finite")]
    NotFinite {
        /// The column's position.
        column: usize,
        /// The column's name.
        name: String,
        /// The observation's position.
        index: usize,
    },
    /// A subset names a feature the training set does not have.
    #[error("feature {feature} is out of range: the set has {features}")]
    UnknownFeature {
        /// The feature asked for.
        feature: usize,
        /// How many features the training set has.
        features: usize,
    },
    /// The share of observations to train on is not strictly between 0 and 1.
    #[error("train fraction {fraction} is not between 0 and 1")]
    TrainFraction {
        /// The fraction given.
        fraction: f64,
    },
    /// The split leaves fewer than 2 observations on one side.
    #[error(
        "{observations} observations split at {fraction} leave {train} for training and {validate} for \
         validation: at least 2 of each are needed"
    )]
    TooFewRows {
        /// How many observations the training set holds.
        observations: usize,
        /// The share asked for training.
        fraction: f64,
        /// The observations the split gives to training.
        train: usize,
        /// The observations the split leaves for validation.
        validate: usize,
    },
}
