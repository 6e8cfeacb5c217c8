//! `canopy-agent`: the leaf of a Canopy tree, serving its node's ranks.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before any thread starts: the ranks' dumps of one round reuse the memory of the last.
    canopy_agent::heap::keep_freed_memory();
    canopy_runtime::daemon::run_main::<canopy_agent::AgentConfig, _, _, _>(
        "agent",
        "canopy-agent",
        "The leaf of a Canopy tree: serves its node's ranks",
        canopy_agent::run,
    )
}
