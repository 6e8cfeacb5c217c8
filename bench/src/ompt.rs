//! `canopy-bench ompt`: what libcanopy_omp costs an unmodified OpenMP program. Empty parallel regions
//! (sdk/examples/openmp/empty_regions.c: a loop and a barrier each, no work) built with clang's -fopenmp, timed
//! with and without the tool loaded (OMP_TOOL_LIBRARIES), with no agent to ship to: the added time per region,
//! and per event of the tool (the primary thread of a region begins and ends 8 activities: its implicit task, its
//! loop, the loop's closing barrier, the explicit barrier and the region's closing barrier, and a wait in each
//! of the three; a worker 7, without the last wait; the waits' idle events besides).

use std::path::{Path, PathBuf};
use std::process::Command;

use canopy_integration_tests::bin_dir;

use crate::stats;

/// The tool's events in one region of empty_regions.c on `threads` threads, as the store shows them for a run:
/// the begin and end of 8 activities on the primary thread (omp parallel, omp for, three barriers, three waits)
/// and of 7 on each worker (its closing barrier's wait is not its region's).
fn events_per_region(threads: u32) -> f64 {
    2.0 * (7.0 * f64::from(threads) + 1.0)
}

fn compile(dir: &Path) -> anyhow::Result<PathBuf> {
    let out = dir.join("empty_regions");
    let status = Command::new("clang")
        .args(["-O2", "-fopenmp", "-o"])
        .arg(&out)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/examples/openmp/empty_regions.c"))
        .status()
        .map_err(|e| {
            anyhow::anyhow!("clang with libomp is needed (apt-get install clang libomp-dev): {e}")
        })?;
    anyhow::ensure!(status.success(), "clang -fopenmp empty_regions.c failed");
    Ok(out)
}

/// ns per region of one run, with the tool (`tool`) or without.
fn region_ns(
    exe: &Path,
    regions: u64,
    threads: u32,
    tool: Option<&Path>,
    socket: &Path,
) -> anyhow::Result<f64> {
    let mut cmd = Command::new(exe);
    cmd.arg(regions.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env("CANOPY_AGENT_SOCKET", socket)
        .env_remove("OMP_TOOL_LIBRARIES");
    if let Some(tool) = tool {
        cmd.env("OMP_TOOL_LIBRARIES", tool);
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed: {}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .split(", ")
        .find_map(|p| p.strip_suffix(" ns per region\n").and_then(|n| n.parse().ok()))
        .ok_or_else(|| anyhow::anyhow!("no time per region in {stdout}"))
}

pub fn run(regions: u64, threads: u32, repeats: usize) -> anyhow::Result<()> {
    let tool = bin_dir().join("libcanopy_omp.so");
    anyhow::ensure!(tool.is_file(), "{} is not built", tool.display());
    let dir = tempfile::tempdir()?;
    let exe = compile(dir.path())?;
    let absent = dir.path().join("absent.sock");
    let (mut plain, mut with, mut added, mut per_event) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        let p = region_ns(&exe, regions, threads, None, &absent)?;
        let w = region_ns(&exe, regions, threads, Some(&tool), &absent)?;
        plain.push(p);
        with.push(w);
        added.push(w - p);
        per_event.push((w - p) / events_per_region(threads));
    }
    println!(
        "\n## ompt: libcanopy_omp loaded into an unmodified OpenMP program (clang, libomp); {regions} empty regions \
         of {threads} threads; tool {}",
        tool.display()
    );
    println!("\n| measurement | median | min | max |\n|---|---:|---:|---:|");
    for (what, values) in [
        ("ns per region, plain", plain),
        ("ns per region, tool loaded", with),
        ("added by the tool, ns per region", added),
        (
            "added by the tool, ns per event (2 x (7 x threads + 1) a region)",
            per_event,
        ),
    ] {
        let (m, lo, hi) = stats(values);
        println!("| {what} | {m:.1} | {lo:.1} | {hi:.1} |");
    }
    Ok(())
}
