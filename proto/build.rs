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
    // The encoded descriptor set feeds gRPC server reflection; it carries the imported well-known types
    // (google/protobuf/any.proto) too, so a client can resolve every type from the server alone.
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_imports(true);
    compiler.open_files(files)?;
    std::fs::write(
        out.join("canopy_descriptor.bin"),
        prost::Message::encode_to_vec(&compiler.file_descriptor_set()),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
