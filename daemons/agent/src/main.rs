//! `canopy-agent`: the leaf of a Canopy tree, serving its node's ranks.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use canopy_core::config::LogFormat;
use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "canopy-agent",
    version,
    about = "The leaf of a Canopy tree: serves its node's ranks"
)]
struct Args {
    /// A TOML file whose [agent] table configures this agent.
    #[arg(long, short = 'c', global = true, env = "CANOPY_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: Flags,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Check the configuration and exit (0: valid; 64: the bad key and its source are printed).
    Validate,
}

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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let loaded = canopy_core::config::load::<canopy_agent::AgentConfig, _>(
        "agent",
        args.config.as_deref(),
        &args.flags,
    );
    let log = loaded.as_ref().map(|c| c.log_format).unwrap_or_default();
    let validate = matches!(args.command, Some(Command::Validate));
    canopy_core::daemon::main("agent", loaded, validate, log, canopy_agent::run)
}
