//! `canopy-relay`: an interior node of a Canopy tree.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use canopy_core::config::LogFormat;
use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "canopy-relay",
    version,
    about = "An interior node of a Canopy tree: merges its children's rounds"
)]
struct Args {
    /// A TOML file whose [relay] table configures this relay.
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
    /// Write the bound address to this file once serving.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let loaded = canopy_core::config::load::<canopy_relay::RelayConfig, _>(
        "relay",
        args.config.as_deref(),
        &args.flags,
    );
    let log = loaded.as_ref().map(|c| c.log_format).unwrap_or_default();
    let validate = matches!(args.command, Some(Command::Validate));
    canopy_core::daemon::main("relay", loaded, validate, log, canopy_relay::run)
}
