//! Plugins link no gRPC: every cdylib under filters/ has a small normal dependency tree without tonic, hyper,
//! h2, tokio, tower or canopy-proto, as `cargo tree` reports it from the lockfile (offline, well under a second).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The most lines `cargo tree -e normal --prefix none | sort -u` may print for a plugin.
const MAX_LINES: usize = 30;
/// Crates a plugin must never link: the gRPC stack and the crate that carries it.
const NEVER: [&str; 6] = ["tonic", "hyper", "h2", "tokio", "tower", "canopy-proto"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// The package names of the filter plugins: the crates under filters/ that build a cdylib.
fn plugins() -> Vec<String> {
    let filters = workspace().join("filters");
    let mut manifests = Vec::new();
    for dir in [filters.clone(), filters.join("testing")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            if manifest.is_file() {
                manifests.push(std::fs::read_to_string(manifest).unwrap());
            }
        }
    }
    let mut names: Vec<String> = manifests
        .iter()
        .filter(|m| m.contains("\"cdylib\""))
        .map(|m| {
            let line = m.lines().find(|l| l.starts_with("name = ")).unwrap();
            line.trim_start_matches("name = ").trim_matches('"').to_string()
        })
        .collect();
    names.sort();
    names
}

fn tree(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["-p", package])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines.dedup();
    lines
}

#[test]
fn plugins_link_no_grpc_and_few_crates() {
    let plugins = plugins();
    // The discovery must see the standard plugins, or the test would pass on nothing.
    for name in ["stats", "histogram", "classify", "kmeans", "utilization", "nodes"] {
        let expected = format!("canopy-filter-{name}");
        assert!(plugins.contains(&expected), "{expected} not in {plugins:?}");
    }
    for plugin in &plugins {
        let lines = tree(plugin);
        let banned: Vec<&String> = lines
            .iter()
            .filter(|l| NEVER.contains(&l.split(' ').next().unwrap_or("")))
            .collect();
        assert!(banned.is_empty(), "{plugin} links {banned:?}");
        assert!(
            lines.len() <= MAX_LINES,
            "{plugin} has {} lines of dependencies (at most {MAX_LINES}):\n{}",
            lines.len(),
            lines.join("\n")
        );
    }
}
