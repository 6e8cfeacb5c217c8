//! Compiles canopy/filters/v1/filters.proto with protox and prost-build (no protoc, no gRPC), and writes the
//! descriptor set a filter plugin exports.

use std::path::PathBuf;

/// The filters' own messages; the only file Rust types are generated for here.
const FILTERS: &str = "canopy/filters/v1/filters.proto";
/// What a leaf receives and `passthrough` returns (`canopy.v1.ProfileBatch`). Its Rust types are canopy-wire's;
/// only its descriptors are wanted, so a plugin whose result is a ProfileBatch can describe it.
const PROFILE: &str = "canopy/v1/profile.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("..");
    for f in [FILTERS, PROFILE] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Built as canopy-proto builds its own set (no source info), so the two sets carry identical copies of
    // these files and the front-end can tell a plugin's copy from its own by name alone.
    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true);
    compiler.open_files([FILTERS, PROFILE])?;
    std::fs::write(
        out.join("canopy_filters_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    // Type names (`prost::Name`): a result is told apart by its full name, `canopy.filters.v1.StatsResult`.
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(protox::compile([FILTERS], [&root])?)?;
    Ok(())
}
