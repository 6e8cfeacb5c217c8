//! Canopy's metric selection: which of a workflow's metrics explain its end-to-end latency, and how well they
//! predict it.
//!
//! The front-end gathers a training set ([`Dataset`]): the latency of each step (or each round's mean) and,
//! beside it, every candidate metric. [`select`] ranks the metrics by their correlation with the latency and
//! searches for the subset that is most correlated with the latency while least correlated within itself
//! (correlation-based feature subset selection with a best-first search); the rest need not be collected.
//! [`prediction_error`] checks the choice: a linear model over the chosen metrics, trained on the earlier
//! observations, predicts the later ones, and its relative absolute error can be set beside the full set's.
//! [`write_csv`] and [`write_arff`] hand the same training set to other tools (pandas, Weka).
//!
//! Everything here is plain computation over slices: no I/O but the writers, no threads, no clock.

#![forbid(unsafe_code)]

mod cfs;
mod dataset;
mod error;
mod export;
mod fit;
#[cfg(test)]
mod testing;

pub use cfs::{Ranked, SearchOptions, Selection, correlation, merit, select};
pub use dataset::Dataset;
pub use error::SelectError;
pub use export::{write_arff, write_csv};
pub use fit::{Fit, prediction_error};
