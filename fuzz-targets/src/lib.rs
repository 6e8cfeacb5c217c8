//! The bodies of Canopy's fuzz targets: one plain function per decoder that takes bytes from outside, so the
//! same code runs under libFuzzer (the `fuzz/` crate, nightly) and in this crate's stable test, which runs every
//! target over its seed corpus (`fuzz/seeds/<target>/`) and a bounded number of mutations of it.
//!
//! A target panics only on a bug: a panic in the code under test, or a broken invariant it checks (a packet a
//! filter wrote that its own parent cannot read, a topology that does not survive its own writer).

#![forbid(unsafe_code)]

pub mod config;
pub mod filters;
pub mod input;
pub mod mutate;
pub mod topology;
pub mod tree;
pub mod wire;

pub use config::config;
pub use filters::{filter_classify, filter_histogram, filter_outliers, filter_passthrough, filter_stats};
pub use topology::topology;
pub use tree::{tree_attach, tree_down};
pub use wire::{measure_options, rank_frames};

/// One fuzz target: its name (as in `cargo fuzz run NAME`) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("rank_frames", wire::rank_frames),
    ("measure_options", wire::measure_options),
    ("tree_attach", tree::tree_attach),
    ("tree_down", tree::tree_down),
    ("filter_stats", filters::filter_stats),
    ("filter_histogram", filters::filter_histogram),
    ("filter_classify", filters::filter_classify),
    ("filter_outliers", filters::filter_outliers),
    ("filter_passthrough", filters::filter_passthrough),
    ("topology", topology::topology),
    ("config", config::config),
];

/// The target of this name.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
