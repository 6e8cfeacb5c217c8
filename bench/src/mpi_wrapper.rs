//! `canopy-bench mpi-wrapper`: what libcanopy_mpi costs an unmodified MPI program. The added time per call on a
//! tight loop of a cheap call (sdk/examples/mpi/ping.c: MPI_Comm_rank) under `mpirun -np 1`, with and without
//! the wrapper preloaded; and the perturbation of the MPI stencil (stencil_mpi.c) run unmodified under the
//! preloaded wrapper, a dump every `period_ms` through a real tree (a front-end and an agent), against the same
//! run without it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use canopy_integration_tests::{Proc, bin_dir, start_frontend, start_socket_agent};

use crate::stats;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/examples/mpi")
}

/// The MPI family a run measures: its compiler, its launcher and how that passes environment, and the wrapper
/// built for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// Open MPI: mpicc, mpirun -x, libcanopy_mpi.so.
    Openmpi,
    /// MPICH: mpicc.mpich, mpiexec.mpich -genv, libcanopy_mpi_mpich.so.
    Mpich,
}

impl Family {
    fn mpicc(self) -> &'static str {
        match self {
            Family::Openmpi => "mpicc",
            Family::Mpich => "mpicc.mpich",
        }
    }
    fn wrapper(self) -> &'static str {
        match self {
            Family::Openmpi => "libcanopy_mpi.so",
            Family::Mpich => "libcanopy_mpi_mpich.so",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Family::Openmpi => "Open MPI, mpirun",
            Family::Mpich => "MPICH, mpiexec.mpich",
        }
    }
}

fn compile(family: Family, dir: &Path, source: &str, exe: &str) -> anyhow::Result<PathBuf> {
    let out = dir.join(exe);
    let status = Command::new(family.mpicc())
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(examples().join(source))
        .status()
        .map_err(|e| anyhow::anyhow!("{} is needed: {e}", family.mpicc()))?;
    anyhow::ensure!(status.success(), "{} {source} failed", family.mpicc());
    Ok(out)
}

/// The family's launcher on RANKS ranks of EXE ARGS with `env` passed to the ranks (`mpirun -x`, `mpiexec -genv`);
/// returns stdout and stderr.
fn mpirun(
    family: Family,
    ranks: u32,
    exe: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> anyhow::Result<(String, String)> {
    let mut cmd = match family {
        Family::Openmpi => {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--oversubscribe", "-np", &ranks.to_string()])
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            for (name, value) in env {
                cmd.arg("-x").arg(format!("{name}={value}"));
            }
            cmd
        }
        Family::Mpich => {
            let mut cmd = Command::new("mpiexec.mpich");
            cmd.args(["-n", &ranks.to_string()]);
            for (name, value) in env {
                cmd.arg("-genv").arg(name).arg(value);
            }
            cmd
        }
    };
    let out = cmd.arg(exe).args(args).output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    anyhow::ensure!(
        out.status.success(),
        "{exe:?} under {} failed: {stderr}",
        family.name()
    );
    Ok((stdout, stderr))
}

/// The number after `key` and before `unit` on the line that has both.
fn number(text: &str, key: &str, unit: &str) -> anyhow::Result<f64> {
    text.lines()
        .find_map(|l| {
            let rest = l.split(key).nth(1)?;
            rest.split(unit).next()?.trim().parse::<f64>().ok()
        })
        .ok_or_else(|| anyhow::anyhow!("no `{key} ... {unit}` in {text}"))
}

pub fn run(
    family: Family,
    calls: u64,
    ranks: u32,
    iterations: u64,
    period_ms: u64,
    repeats: usize,
) -> anyhow::Result<()> {
    let lib = bin_dir().join(family.wrapper());
    anyhow::ensure!(lib.is_file(), "{} is not built", lib.display());
    let dir = tempfile::tempdir()?;
    let ping = compile(family, dir.path(), "ping.c", "ping")?;
    let stencil = compile(family, dir.path(), "stencil_mpi.c", "stencil_mpi")?;
    let absent = dir.path().join("absent.sock").display().to_string();

    // The cost per call: the application's own dumps only (none), so the loop is the wrapped call alone.
    let preload = [
        ("LD_PRELOAD", lib.display().to_string()),
        ("CANOPY_AGENT_SOCKET", absent.clone()),
        ("CANOPY_MPI_DUMP_ON", "app".to_string()),
    ];
    let args = [calls.to_string()];
    let (mut plain_ns, mut wrapped_ns, mut added_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        let plain = number(
            &mpirun(family, 1, &ping, &args, &[])?.0,
            "MPI_Comm_rank,",
            "ns per call",
        )?;
        let wrapped = number(
            &mpirun(family, 1, &ping, &args, &preload)?.0,
            "MPI_Comm_rank,",
            "ns per call",
        )?;
        plain_ns.push(plain);
        wrapped_ns.push(wrapped);
        added_ns.push(wrapped - plain);
    }

    // What the SDK's part costs here: an activity's begin and end, and the two clock reads they cannot do without.
    let activity = canopy_sdk::activity("MPI_Comm_rank")?;
    let (mut pair_ns, mut clock_ns) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let start = std::time::Instant::now();
        for _ in 0..calls {
            activity.begin();
            activity.end();
        }
        pair_ns.push(start.elapsed().as_nanos() as f64 / calls as f64);
        let start = std::time::Instant::now();
        let mut sink = 0u64;
        for _ in 0..calls {
            let a = std::time::Instant::now();
            let b = std::time::Instant::now();
            sink = sink.wrapping_add((b - a).as_nanos() as u64);
        }
        std::hint::black_box(sink);
        clock_ns.push(start.elapsed().as_nanos() as f64 / calls as f64);
    }

    // The stencil, without and with the wrapper and a fresh tree per run (the front-end ends with the ranks).
    let stencil_args = [iterations.to_string(), "2048".to_string(), "128".to_string()];
    let socket = dir.path().join("agent.sock");
    let (mut t_plain, mut t_wrapped, mut rounds) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu_plain, mut cpu_wrapped) = (Vec::new(), Vec::new());
    let mut tree: Option<(Proc, Proc, tempfile::TempDir)> = None;
    for _ in 0..repeats {
        let err = mpirun(family, ranks, &stencil, &stencil_args, &[])?.1;
        t_plain.push(number(&err, " in ", " s")?);
        cpu_plain.push(number(&err, "process CPU ", " s")?);
        drop(tree.take());
        let tree_dir = tempfile::tempdir_in(dir.path())?;
        let (fe, addr, store) =
            start_frontend(tree_dir.path(), &["--streams", "stats", "--exit-on-fin", "true"]);
        let _ = std::fs::remove_file(&socket);
        let agent = start_socket_agent(tree_dir.path(), "agent-0", &addr, &socket);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !socket.exists() && std::time::Instant::now() < deadline {
            #[allow(
                clippy::disallowed_methods,
                reason = "synchronous harness code: no event tells when another process creates its socket"
            )]
            std::thread::sleep(Duration::from_millis(10));
        }
        let env = [
            ("LD_PRELOAD", lib.display().to_string()),
            ("CANOPY_AGENT_SOCKET", socket.display().to_string()),
            ("CANOPY_DUMP_PERIOD_MS", period_ms.to_string()),
        ];
        let err = mpirun(family, ranks, &stencil, &stencil_args, &env)?.1;
        t_wrapped.push(number(&err, " in ", " s")?);
        cpu_wrapped.push(number(&err, "process CPU ", " s")?);
        let mut fe = fe;
        let _ = fe.wait_timeout(Duration::from_secs(30));
        rounds.push(
            canopy_integration_tests::read_rounds(&store)
                .iter()
                .filter(|r| r.covered == r.expected)
                .count() as f64,
        );
        tree = Some((fe, agent, tree_dir));
    }
    drop(tree);

    println!(
        "\n## mpi-wrapper: libcanopy_mpi preloaded into unmodified MPI programs ({}); library {}",
        family.name(),
        lib.display()
    );
    println!("\n| measurement | median | min | max |\n|---|---:|---:|---:|");
    let (m, lo, hi) = stats(plain_ns);
    println!("| MPI_Comm_rank, ns per call, plain ({calls} calls, -np 1) | {m:.2} | {lo:.2} | {hi:.2} |");
    let (m, lo, hi) = stats(wrapped_ns);
    println!("| MPI_Comm_rank, ns per call, wrapper preloaded | {m:.2} | {lo:.2} | {hi:.2} |");
    let (m, lo, hi) = stats(added_ns);
    println!("| added by the wrapper, ns per call | {m:.2} | {lo:.2} | {hi:.2} |");
    let (m, lo, hi) = stats(pair_ns);
    println!(
        "| of which the SDK: an activity's begin and end, in this process, ns | {m:.2} | {lo:.2} | {hi:.2} |"
    );
    let (m, lo, hi) = stats(clock_ns);
    println!("| of which two clock reads, ns | {m:.2} | {lo:.2} | {hi:.2} |");
    let (base, blo, bhi) = stats(t_plain);
    println!(
        "| stencil_mpi, {ranks} ranks, {iterations} iterations of 128x2048 per rank, s, plain | {base:.4} | {blo:.4} | {bhi:.4} |"
    );
    let (m, lo, hi) = stats(t_wrapped);
    println!(
        "| stencil_mpi, wrapper preloaded, a dump every {period_ms} ms through a real tree, s | {m:.4} | {lo:.4} | {hi:.4} |"
    );
    let (cbase, clo, chi) = stats(cpu_plain);
    println!(
        "| stencil_mpi, rank 0's process CPU (all its threads), s, plain | {cbase:.4} | {clo:.4} | {chi:.4} |"
    );
    let (cm, clo, chi) = stats(cpu_wrapped);
    println!(
        "| stencil_mpi, rank 0's process CPU, wrapper preloaded and dumping, s | {cm:.4} | {clo:.4} | {chi:.4} |"
    );
    let (r, rlo, rhi) = stats(rounds);
    println!("| rounds stored at full coverage per run | {r:.0} | {rlo:.0} | {rhi:.0} |");
    println!(
        "\nperturbation (median with the wrapper / median without): wall time {:.4} ({:+.2}%), rank 0's CPU {:.4} \
         ({:+.2}%)",
        m / base,
        (m / base - 1.0) * 100.0,
        cm / cbase,
        (cm / cbase - 1.0) * 100.0
    );
    Ok(())
}
