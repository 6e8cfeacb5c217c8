//! A finished run's store, offline: the report (one self-contained HTML page, or one of its figures as a PNG),
//! the export of its tables as files (CSV or Parquet) and of a workflow's training data (CSV or ARFF), and the
//! run a path names. It reads the store and writes files; it links no async runtime and no gRPC stack, so the
//! `canopy` command's offline commands and any other tool can use it alone.

#![forbid(unsafe_code)]

pub mod export;
pub mod report;
pub mod run_store;
