//! Trees as separate processes: `canopy up` (beside this executable) runs the front-end, relays and agents as
//! their own daemons and reports their CPU from /proc, by kind of process; its store gives the rounds.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::Shape;

/// CPU by kind of process over one run, in ms per round.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuByKind {
    pub frontend: f64,
    pub relays: f64,
    pub agents: f64,
}

impl CpuByKind {
    pub fn total(&self) -> f64 {
        self.frontend + self.relays + self.agents
    }
}

/// Runs `shape` with `canopy up` in `dir`; returns the run's store and the CPU it cost by kind of process.
pub fn run(shape: &Shape, dir: &Path) -> anyhow::Result<(PathBuf, CpuByKind)> {
    let mut cmd = up_command(shape, None, dir)?;
    finish(&mut cmd)?;
    read_cpu(&dir.join("latest-cpu.json"))
}

/// `canopy up` for `shape` (or for a topology file's tree, with the shape's ranks and rates), quiet, its
/// store and logs in `dir`.
pub fn up_command(shape: &Shape, topology: Option<&Path>, dir: &Path) -> anyhow::Result<Command> {
    let exe = std::env::current_exe()?;
    let canopy = exe.with_file_name("canopy");
    if !canopy.is_file() {
        bail!(
            "{} not found: build the whole workspace (cargo build --release --workspace)",
            canopy.display()
        );
    }
    let mut cmd = Command::new(&canopy);
    cmd.args(["up", "--quiet", "--timeout-ms", &shape.timeout_ms.to_string()])
        .args(["--ranks", &shape.ranks.to_string()]);
    if !shape.tls {
        cmd.arg("--insecure");
    }
    match topology {
        Some(file) => {
            cmd.arg("--topology").arg(file);
        }
        None => {
            cmd.args(["--agents", &shape.agents.to_string()])
                .args(["--fanout", &shape.fanout.to_string()]);
        }
    }
    cmd.args(["--events", &shape.events.to_string()])
        .args(["--rounds", &shape.rounds.to_string()])
        .args(["--period-ms", &shape.period_ms.to_string()])
        .args(["--filters", &shape.filter])
        .arg("--out")
        .arg(dir);
    Ok(cmd)
}

/// Runs a `canopy up` to its end; its error output on a failure.
pub fn finish(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().context("cannot run canopy up")?;
    if !out.status.success() {
        bail!(
            "canopy up failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Reads `canopy up`'s latest-cpu.json: the store, the rounds per stream, and seconds of CPU by kind.
pub fn read_cpu(path: &Path) -> anyhow::Result<(PathBuf, CpuByKind)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let num = |p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_f64)
            .with_context(|| format!("{}: no number at {p}", path.display()))
    };
    let store = v
        .pointer("/store")
        .and_then(serde_json::Value::as_str)
        .with_context(|| format!("{}: no store", path.display()))?;
    let rounds = num("/rounds")?.max(1.0);
    let per = |s: f64| s * 1e3 / rounds;
    Ok((
        PathBuf::from(store),
        CpuByKind {
            frontend: per(num("/cpu/frontend_s")?),
            relays: per(num("/cpu/relays_s")?),
            agents: per(num("/cpu/agents_s")?),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_canopy_up_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("latest-cpu.json");
        std::fs::write(
            &path,
            r#"{"store": "/x/run.sqlite", "rounds": 200,
                "cpu": {"frontend_s": 0.5, "relays": 4, "relays_s": 1.0, "agents": 16, "agents_s": 8.0}}"#,
        )
        .unwrap();
        let (store, cpu) = read_cpu(&path).unwrap();
        assert_eq!(store, PathBuf::from("/x/run.sqlite"));
        assert_eq!((cpu.frontend, cpu.relays, cpu.agents), (2.5, 5.0, 40.0));
        std::fs::write(&path, r#"{"store": "/x", "rounds": 2, "cpu": {}}"#).unwrap();
        let e = read_cpu(&path).unwrap_err().to_string();
        assert!(e.ends_with("no number at /cpu/frontend_s"), "{e}");
    }
}
