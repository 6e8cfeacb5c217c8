//! `canopy`: the user's command. `canopy up` launches a whole local tree of real processes with simulated
//! ranks and shows the rounds live; `canopy topology` prints the parent of every node of a tree shape.

#![forbid(unsafe_code)]

mod topology_cmd;
mod up;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "canopy",
    version,
    about = "Canopy: an online performance monitor for parallel applications"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local tree (front-end, relays, agents with simulated ranks) on loopback and watch its rounds.
    Up(up::UpArgs),
    /// Print the parent of every node of a tree: from a fanout over a hosts file, a spec, or an MRNet file.
    Topology(topology_cmd::TopologyArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Up(a) => up::run(a),
        Command::Topology(a) => topology_cmd::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canopy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
