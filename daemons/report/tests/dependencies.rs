//! The library reads stores and writes files offline: built alone, it must link no async runtime and no gRPC
//! stack, whatever the crates it uses gain. `cargo tree` resolves its dependencies as a build of this package
//! alone would.

#[test]
fn the_report_library_links_neither_tokio_nor_tonic() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "canopy-report",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("canopy-store ")), "{tree}");
    let linked: Vec<&str> = tree
        .lines()
        .filter(|l| {
            ["tokio ", "tonic ", "hyper ", "h2 "]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .collect();
    assert!(linked.is_empty(), "canopy-report links {linked:?}");
}
