//! `canopy-agent`: the leaf of a Canopy tree, serving its node's ranks.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_agent::AgentConfig, _, _, _>(
        "agent",
        "canopy-agent",
        "The leaf of a Canopy tree: serves its node's ranks",
        canopy_agent::run,
    )
}
