//! `canopy-relay`: an interior node of a Canopy tree.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use canopy_runtime::config::LogFormat;
use serde::Serialize;

#[derive(clap::Args, Serialize)]
struct Flags {
    /// This node's id (default relay@HOST:PORT).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    /// The parent's address, host:port.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    /// Where children attach, ip:port (port 0 picks a free port).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Rounds open at once before children are made to wait.
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
    /// Write the bound address to this file once serving.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_relay::RelayConfig, Flags, _, _, _>(
        "relay",
        "canopy-relay",
        "An interior node of a Canopy tree: merges its children's rounds",
        canopy_relay::run,
    )
}
