//! `canopy-frontend`: the root of a Canopy tree.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_frontend::FrontendConfig, _, _, _>(
        "frontend",
        "canopy-frontend",
        "The root of a Canopy tree: stores and serves the results",
        canopy_frontend::run,
    )
}
