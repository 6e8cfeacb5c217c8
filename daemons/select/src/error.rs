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
}
