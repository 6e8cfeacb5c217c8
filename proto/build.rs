//! Compiles canopy/v1/*.proto with protox (a protobuf compiler in Rust), so a plain build needs no protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "canopy/v1/profile.proto",
        "canopy/v1/tree.proto",
        "canopy/filters/v1/filters.proto",
        "canopy/v1/frontend.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The encoded descriptor set feeds gRPC server reflection.
    std::fs::write(
        out.join("canopy_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
