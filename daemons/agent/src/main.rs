//! `canopy-agent`: the leaf of a Canopy tree, serving its node's ranks.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use canopy_runtime::config::LogFormat;
use serde::Serialize;

#[derive(clap::Args, Serialize)]
struct Flags {
    /// This node's id (default agent@HOST).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    /// The parent's address, host:port.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    /// The Unix socket ranks attach to through the SDK ("none": simulated ranks only).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    socket: Option<String>,
    /// Dumps held per rank until the tree starts collection.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_dumps: Option<usize>,
    /// Simulated ranks to serve.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    simulate_ranks: Option<u32>,
    /// Events per simulated rank.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    simulate_events: Option<u32>,
    /// Milliseconds between rounds of the simulated ranks.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    simulate_period_ms: Option<u64>,
    /// Scenario of the simulated ranks: flash, uintah or namd.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    simulate_scenario: Option<String>,
    /// Global number of this agent's first rank.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    rank_offset: Option<u32>,
    /// Ranks in the whole application.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    total_ranks: Option<u32>,
    /// Seed of the simulated data.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    /// Application id of the simulated ranks.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    app: Option<String>,
    /// Rounds to simulate before finishing (0: until stopped).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds: Option<u64>,
    #[arg(long, global = true, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<LogFormat>,
    /// Directories searched for filter plugins, colon-separated (default: beside the executable, then
    /// /usr/lib/canopy/filters).
    #[arg(long, global = true, value_delimiter = ':')]
    #[serde(skip_serializing_if = "Option::is_none")]
    filter_path: Option<Vec<PathBuf>>,
}

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_agent::AgentConfig, Flags, _, _, _>(
        "agent",
        "canopy-agent",
        "The leaf of a Canopy tree: serves its node's ranks",
        canopy_agent::run,
    )
}
