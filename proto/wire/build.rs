//! Compiles the messages a rank sends (canopy/v1/profile.proto and rank.proto) with protox and prost-build, so a
//! plain build needs no protoc and the application SDK needs no gRPC stack.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("..");
    let files = ["canopy/v1/profile.proto", "canopy/v1/rank.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
