//! What Canopy's standard filters share: parameters, metric extraction, mergeable summaries, histograms,
//! quantile sketches, rank ranges, per-round state and the skeletons of the one-phase and three-phase schemes. Their test support (a tree
//! simulator among it) is the crate canopy-filter-test.
//!
//! Functional classes of ranks (classify's class ids) are here too, for every filter that groups by them.
//!
//! Every repeated output these helpers build is sorted (by `(id, metric)`, by rank, ...), so a filter's
//! result does not depend on the order in which packets arrive.

#![forbid(unsafe_code)]

pub mod classes;
pub mod columns;
pub mod columns_wire;
pub mod decode;
pub mod fold;
pub mod histogram;
pub mod metrics;
pub mod one_phase;
pub mod params;
pub mod ranks;
pub mod rounds;
pub mod select;
pub mod sketch;
pub mod sketch_columns;
pub mod stats_result_wire;
pub mod stream;
pub mod summary;
pub mod three_phase;

pub use metrics::{Key, Values};
pub use params::Params;
