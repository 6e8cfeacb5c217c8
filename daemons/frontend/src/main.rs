//! `canopy-frontend`: the root of a Canopy tree.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use canopy_runtime::config::LogFormat;
use serde::Serialize;

#[derive(clap::Args, Serialize)]
struct Flags {
    /// This node's id.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    /// The port for the tree, health and reflection, ip:port.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Directory of the run stores.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    out: Option<PathBuf>,
    /// Filters to open as streams at start, comma-separated.
    #[arg(long, global = true, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    streams: Option<Vec<String>>,
    /// A filter's parameters, NAME=JSON (repeat for several filters).
    #[arg(long = "stream-params", global = true, value_name = "NAME=JSON")]
    #[serde(serialize_with = "key_values", skip_serializing_if = "Vec::is_empty")]
    stream_params: Vec<String>,
    /// Milliseconds a round waits for missing children.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_timeout_ms: Option<u32>,
    /// wait_for_all or dont_wait.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    sync_mode: Option<String>,
    /// Start collection once this many ranks are attached.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_ranks: Option<u32>,
    /// Exit once every child has finished.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_on_fin: Option<bool>,
    /// Milliseconds a shutdown waits for the tree to deliver what it holds.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    drain_timeout_ms: Option<u64>,
    /// Rounds open at once.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rounds_in_flight: Option<u64>,
    #[arg(long, global = true, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<LogFormat>,
    /// Directories searched for filter plugins, colon-separated (default: beside the executable, then
    /// /usr/lib/canopy/filters).
    #[arg(long, global = true, value_delimiter = ':')]
    #[serde(skip_serializing_if = "Option::is_none")]
    filter_path: Option<Vec<PathBuf>>,
    /// Write `addr=` and `store=` lines to this file once serving.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

/// `NAME=JSON` flags as the map the configuration holds.
fn key_values<S: serde::Serializer>(pairs: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for p in pairs {
        let (k, v) = p.split_once('=').unwrap_or((p.as_str(), ""));
        map.serialize_entry(k, v)?;
    }
    map.end()
}

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_frontend::FrontendConfig, Flags, _, _, _>(
        "frontend",
        "canopy-frontend",
        "The root of a Canopy tree: stores and serves the results",
        canopy_frontend::run,
    )
}
