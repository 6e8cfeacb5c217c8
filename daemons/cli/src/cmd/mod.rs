//! The commands that read a finished run from its store, each with its arguments and its run: the work is the
//! canopy-report library's.

pub mod export;
mod export_kafka;
pub mod report;
