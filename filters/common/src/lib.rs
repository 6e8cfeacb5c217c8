//! What Canopy's standard filters share: parameters, metric extraction, mergeable summaries, histograms,
//! rank ranges, per-round state and a tree simulator for tests.
//!
//! Every repeated output these helpers build is sorted (by `(id, metric)`, by rank, ...), so a filter's
//! result does not depend on the order in which packets arrive.

#![deny(unsafe_code)]

pub mod decode;
pub mod histogram;
pub mod metrics;
pub mod params;
pub mod ranks;
pub mod rounds;
pub mod stream;
pub mod summary;
pub mod testing;

pub use metrics::{Key, Values};
pub use params::Params;
