//! `canopy-relay`: an interior node of a Canopy tree.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    canopy_runtime::daemon::run_main::<canopy_relay::RelayConfig, _, _, _>(
        "relay",
        "canopy-relay",
        "An interior node of a Canopy tree: merges its children's rounds",
        canopy_relay::run,
    )
}
