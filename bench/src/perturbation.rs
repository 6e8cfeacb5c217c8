//! `canopy-bench perturbation`: what online monitoring costs an application (the ToM paper's Table I). The SDK's
//! C example (a stencil) runs a fixed amount of work as one process, three ways: built without the SDK, with
//! the SDK and no agent, and with a dump per iteration through a real tree (a front-end and an agent, release
//! binaries, stats stream). The iteration is sized to about one dump per `period_ms`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use canopy_integration_tests::{Proc, bin_dir, build_c_example, start_frontend, start_socket_agent};

use crate::stats;

/// The run time the example reports ("... in X s").
fn seconds(out: &[u8]) -> anyhow::Result<f64> {
    let text = String::from_utf8_lossy(out);
    let line = text
        .lines()
        .find(|l| l.contains(" iterations of "))
        .ok_or_else(|| anyhow::anyhow!("no summary line in {text}"))?;
    let secs = line
        .split(" in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("");
    Ok(secs.parse()?)
}

fn run(exe: &Path, socket: &Path, iterations: u64, n: u32) -> anyhow::Result<f64> {
    let out = Command::new(exe)
        .args([iterations.to_string(), n.to_string(), "0".into()])
        .env("CANOPY_AGENT_SOCKET", socket)
        .env("CANOPY_RANK", "0")
        .env("CANOPY_NRANKS", "1")
        .output()?;
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    seconds(&out.stdout)
}

pub fn run_all(period_ms: u64, iterations: u64, repeats: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let plain = build_c_example(dir.path(), true);
    let instrumented = build_c_example(dir.path(), false);
    // Size the grid so one iteration (one dump) takes about `period_ms`.
    let mut n = 256u32;
    loop {
        let t = run(&plain, Path::new("/nonexistent"), 20, n)? / 20.0;
        if t * 1000.0 >= period_ms as f64 * 0.9 || n > 16384 {
            break;
        }
        n = ((n as f64) * ((period_ms as f64 / 1000.0 / t).sqrt().clamp(1.05, 4.0))) as u32;
    }
    let absent = dir.path().join("absent.sock");
    let socket = dir.path().join("agent.sock");
    let mut tree: Option<(Proc, Proc)> = None;
    let (mut t_plain, mut t_absent, mut t_tree) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        t_plain.push(run(&plain, &absent, iterations, n)?);
        t_absent.push(run(&instrumented, &absent, iterations, n)?);
        // A fresh tree for each run: the front-end finishes its run when the rank does.
        drop(tree.take());
        let (fe, addr, _) = start_frontend(dir.path(), &["--streams", "stats", "--exit-on-fin", "true"]);
        let _ = std::fs::remove_file(&socket);
        let agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !socket.exists() && std::time::Instant::now() < deadline {
            #[allow(
                clippy::disallowed_methods,
                reason = "synchronous harness code: no event tells when another process creates its socket"
            )]
            std::thread::sleep(Duration::from_millis(10));
        }
        t_tree.push(run(&instrumented, &socket, iterations, n)?);
        tree = Some((fe, agent));
    }
    drop(tree);
    println!(
        "\n## perturbation: the C stencil, {iterations} iterations of {n}x{n} (about one dump per {period_ms} ms), one process; binaries in {}",
        bin_dir().display()
    );
    println!("\n| run | time s (median) | min | max | overhead vs no SDK |");
    println!("|---|---:|---:|---:|---:|");
    let (base, lo, hi) = stats(t_plain);
    println!("| no SDK (built with -DCANOPY_DISABLE) | {base:.4} | {lo:.4} | {hi:.4} | |");
    for (name, times) in [
        ("SDK, no agent (every dump dropped and counted)", t_absent),
        ("SDK, a dump per iteration through a real tree", t_tree),
    ] {
        let (m, lo, hi) = stats(times);
        println!(
            "| {name} | {m:.4} | {lo:.4} | {hi:.4} | {:+.2}% |",
            (m / base - 1.0) * 100.0
        );
    }
    Ok(())
}
