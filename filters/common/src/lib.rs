//! What Canopy's standard filters share: parameters, metric extraction, mergeable summaries, histograms,
//! rank ranges, per-round state and the skeleton of the three-phase scheme. Their test support (a tree
//! simulator among it) is the crate canopy-filter-test.
//!
//! Every repeated output these helpers build is sorted (by `(id, metric)`, by rank, ...), so a filter's
//! result does not depend on the order in which packets arrive.

#![forbid(unsafe_code)]

pub mod columns;
pub mod decode;
pub mod fold;
pub mod histogram;
pub mod metrics;
pub mod params;
pub mod ranks;
pub mod rounds;
pub mod select;
pub mod stream;
pub mod summary;
pub mod three_phase;

pub use metrics::{Key, Values};
pub use params::Params;
