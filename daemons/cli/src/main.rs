//! `canopy`: the user's command. `canopy up` launches a whole local tree of real processes with simulated
//! ranks and shows the rounds live; `canopy topology` prints the parent of every node of a tree shape; `canopy
//! report` and `canopy export` turn a run's store into an HTML page of figures or into CSV and Parquet files.

#![forbid(unsafe_code)]

mod certs;
mod client;
mod cpu;
mod export;
mod report;
mod run_store;
mod topology_cmd;
mod up;
mod watch;

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
    /// The running tree with the state of every node; or, with --fanout/--spec/--file, the parent of every
    /// node of a tree shape.
    Topology(topology_cmd::TopologyArgs),
    /// List, open and close streams on a running tree.
    Streams {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        cmd: client::StreamsCmd,
    },
    /// Start or stop collection on a running tree.
    Ctl {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        cmd: client::CtlCmd,
    },
    /// Make the certificates of a tree: a site CA, node and client certificates, or one run's set.
    #[command(subcommand)]
    Certs(certs::CertsCmd),
    /// Every stream live: utilization as stacked bars (10 s of 100 ms bars, or 250 ms of 1 ms bars), other
    /// streams as tables (top events, histograms, classes); a line per period when piped or with --plain.
    Watch {
        #[command(flatten)]
        target: client::Target,
        #[command(flatten)]
        args: watch::WatchArgs,
    },
    /// A run's store as one self-contained HTML page of figures (summary, coverage, top events with their
    /// spread, histograms as heat maps, classes, utilization, nodes), or one figure as PNG.
    Report(report::ReportArgs),
    /// A run's tables as CSV or Parquet files, one per table, with event names and units in column names.
    Export(export::ExportArgs),
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Up(a) => up::run(a),
        Command::Topology(a) => topology_cmd::run(a),
        Command::Certs(cmd) => certs::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Streams { target, cmd } => block_on(client::streams(target, cmd)),
        Command::Ctl { target, cmd } => block_on(client::ctl(target, cmd)),
        Command::Watch { target, args } => block_on(watch::watch(target, args)),
        Command::Report(a) => report::run(a).map(|()| ExitCode::SUCCESS),
        Command::Export(a) => export::run(a).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canopy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
