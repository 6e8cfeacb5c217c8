//! The Python package (sdk/python) end to end: `pip install ./sdk/python` into a fresh virtual environment, then
//! Python programs against a real tree (a front-end and an agent on a Unix socket): every timer's calls and every
//! counter per rank as the programs made them, an exception inside a timer, an mpi4py program under mpirun, and
//! a charm4py program on 2 PEs.
//!
//! The install needs PyPI (pip fetches maturin to build the package, and mpi4py and charm4py).
//! `.ci/run` says so with CANOPY_PYTHON_SDK_TEST=1, and then a failed install fails the test; elsewhere the test
//! says why it cannot run and passes.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that run real processes"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use canopy_integration_tests::{read_rounds, start_socket_tree, stored_calls};

/// A virtual environment with the package installed (once for the test binary), or why there is none.
fn venv() -> Option<&'static Path> {
    static VENV: OnceLock<Result<(tempfile::TempDir, PathBuf), String>> = OnceLock::new();
    let made = VENV.get_or_init(|| {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let env = dir.path().join("venv");
        let python = std::env::var("CANOPY_PYTHON_BASE").unwrap_or_else(|_| "python3".into());
        run_ok(Command::new(&python).args(["-m", "venv"]).arg(&env))?;
        let pip = env.join("bin/pip");
        let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/python");
        // The package's own build, as a user's `pip install ./sdk/python` (maturin from PyPI, in pip's isolated
        // build environment), in the dev profile to keep the suite fast.
        run_ok(
            Command::new(&pip)
                .args(["install", "-q"])
                .arg(&package)
                .env("MATURIN_PEP517_ARGS", "--profile dev"),
        )?;
        Ok((dir, env))
    });
    match made {
        Ok((_, env)) => Some(env.as_path()),
        Err(why) => {
            assert!(
                std::env::var_os("CANOPY_PYTHON_SDK_TEST").is_none(),
                "CANOPY_PYTHON_SDK_TEST is set but the package could not be installed: {why}"
            );
            eprintln!("skipped: `pip install ./sdk/python` in a fresh virtual environment failed: {why}");
            None
        }
    }
}

/// Installs `package` from PyPI into the test's environment, one install at a time (the tests run in parallel
/// and share it); false, said, if it cannot (with CANOPY_PYTHON_SDK_TEST set, that fails instead).
fn pip_install(env: &Path, package: &str) -> bool {
    static PIP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = PIP.lock().unwrap_or_else(|e| e.into_inner());
    let Err(why) = run_ok(Command::new(env.join("bin/pip")).args(["install", "-q", package])) else {
        return true;
    };
    assert!(
        std::env::var_os("CANOPY_PYTHON_SDK_TEST").is_none(),
        "CANOPY_PYTHON_SDK_TEST is set but {package} could not be installed: {why}"
    );
    eprintln!("skipped: {package} could not be installed: {why}");
    false
}

fn run_ok(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

/// Writes `source` to `dir/name`.
fn script(dir: &Path, name: &str, source: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, source).unwrap();
    path
}

const RANKS: u32 = 2;

/// Each rank times `step` ITERATIONS times with the context manager and `halo` with the decorator, adds its
/// rank plus one to `cells` each iteration, dumps each iteration, and leaves finalize to the interpreter's exit.
/// A timer that raises stops and lets the exception through.
const TIMERS: &str = r#"
import sys, canopy
iterations = int(sys.argv[1])
canopy.init("pytimers")
import os
rank = int(os.environ["CANOPY_RANK"])

@canopy.timer("halo")
def halo(i):
    return i * 2

for i in range(iterations):
    with canopy.timer("step"):
        halo(i)
    canopy.counter("cells", rank + 1)
    canopy.dump()

try:
    with canopy.timer("fails"):
        raise ValueError("inside a timer")
except ValueError as e:
    assert str(e) == "inside a timer"

@canopy.timer("fails_decorated")
def fails():
    raise KeyError("decorated")

try:
    fails()
except KeyError:
    pass

try:
    canopy.counter("", 1)
    sys.exit("an empty counter name was taken")
except canopy.CanopyError as e:
    assert "name" in str(e), e
with canopy.timer("step"):
    pass
canopy.dump()
assert canopy.stats()["mismatched_stops"] == 0
"#;

#[test]
fn two_python_processes_report_every_timer_and_counter_and_a_timer_that_raises_stops() {
    let Some(env) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tree = start_socket_tree(dir.path());
    let program = script(dir.path(), "timers.py", TIMERS);
    let iterations = 25u64;
    let ranks: Vec<_> = (0..RANKS)
        .map(|rank| {
            Command::new(env.join("bin/python"))
                .arg(&program)
                .arg(iterations.to_string())
                .env("CANOPY_AGENT_SOCKET", &tree.socket)
                .env("CANOPY_RANK", rank.to_string())
                .env("CANOPY_NRANKS", RANKS.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut rank in ranks {
        let status = rank.wait().unwrap();
        assert!(status.success(), "a Python rank failed: {status}");
    }
    let store = tree.finished();
    let every = |n: u64| -> BTreeMap<u32, u64> { (0..RANKS).map(|r| (r, n)).collect() };
    assert_eq!(stored_calls(&store, "step"), every(iterations + 1), "step");
    assert_eq!(stored_calls(&store, "halo"), every(iterations), "halo");
    assert_eq!(stored_calls(&store, "fails"), every(1), "a timer that raised");
    assert_eq!(
        stored_calls(&store, "fails_decorated"),
        every(1),
        "a decorated function that raised"
    );
    let cells = canopy_integration_tests::stored_counter(&store, "cells");
    let expected: BTreeMap<u32, f64> = (0..RANKS)
        .map(|r| (r, (iterations * u64::from(r + 1)) as f64))
        .collect();
    assert_eq!(cells, expected, "cells per rank");
    let rounds = read_rounds(&store);
    assert!(
        rounds
            .iter()
            .all(|r| r.covered == r.expected && r.expected == RANKS),
        "{rounds:?}"
    );
}

/// An mpi4py program: the rank is COMM_WORLD's, with no Canopy variable naming it.
const MPI4PY: &str = r#"
from mpi4py import MPI
import canopy
canopy.init("pympi")
comm = MPI.COMM_WORLD
assert canopy._mpi_rank() == (comm.Get_rank(), comm.Get_size())
for i in range(10):
    with canopy.timer("allreduce"):
        total = comm.allreduce(comm.Get_rank() + 1)
    canopy.counter("total", total)
    canopy.dump()
canopy.finalize()
"#;

#[test]
fn an_mpi4py_program_under_mpirun_reports_as_its_comm_world_ranks() {
    let Some(env) = venv() else { return };
    if !pip_install(env, "mpi4py") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = start_socket_tree(dir.path());
    let program = script(dir.path(), "mpi.py", MPI4PY);
    let ran = run_ok(
        Command::new("mpirun")
            .args([
                "--oversubscribe",
                "-np",
                &RANKS.to_string(),
                "-x",
                "CANOPY_AGENT_SOCKET",
            ])
            .arg(env.join("bin/python"))
            .arg(&program)
            .env("CANOPY_AGENT_SOCKET", &tree.socket)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    );
    ran.unwrap_or_else(|e| panic!("{e}"));
    let store = tree.finished();
    let calls = stored_calls(&store, "allreduce");
    assert_eq!(calls, (0..RANKS).map(|r| (r, 10)).collect(), "allreduce per rank");
    // 1 + 2 on each rank, ten times.
    let totals = canopy_integration_tests::stored_counter(&store, "total");
    assert_eq!(totals, (0..RANKS).map(|r| (r, 30.0)).collect(), "total per rank");
}

/// A charm4py program: a group's entry method run by every PE, and its future's result on PE 0.
const CHARM4PY: &str = r#"
from charm4py import charm, Chare, Group
IMPORT

class Worker(Chare):
    def work(self, n):
        return n * 2

def main(args):
    g = Group(Worker)
    for i in range(ITERATIONS):
        g.work(i, awaitable=True).get()
    charm.exit()

charm.start(main)
"#;

#[test]
fn a_charm4py_program_reports_each_entry_method_per_pe_with_the_one_line_and_with_python_m() {
    let Some(env) = venv() else { return };
    if !pip_install(env, "charm4py") {
        return;
    }
    let iterations = 20u64;
    // The program with `import canopy.charm4py`, and the same program left as it is under `-m canopy.charm4py`.
    for (import, module) in [("import canopy.charm4py", None), ("", Some("canopy.charm4py"))] {
        let dir = tempfile::tempdir().unwrap();
        let tree = start_socket_tree(dir.path());
        let source = CHARM4PY
            .replace("IMPORT", import)
            .replace("ITERATIONS", &iterations.to_string());
        let program = script(dir.path(), "app.py", &source);
        let mut cmd = Command::new(env.join("bin/python"));
        cmd.args(["-m", "charmrun.start", &format!("+p{RANKS}")]);
        if let Some(m) = module {
            cmd.args(["-m", m]);
        }
        run_ok(
            cmd.arg(&program)
                .env("CANOPY_AGENT_SOCKET", &tree.socket)
                .current_dir(dir.path()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let store = tree.finished();
        let per_pe = |n: u64| -> BTreeMap<u32, u64> { (0..RANKS).map(|r| (r, n)).collect() };
        assert_eq!(
            stored_calls(&store, "Worker::work"),
            per_pe(iterations),
            "Worker::work ({import:?})"
        );
        assert_eq!(
            stored_calls(&store, "Worker::__init__"),
            per_pe(1),
            "Worker::__init__"
        );
        let idle = stored_calls(&store, "Idle");
        assert_eq!(idle.len(), RANKS as usize, "Idle on every PE: {idle:?}");
        let rounds = read_rounds(&store);
        assert!(
            !rounds.is_empty() && rounds.iter().all(|r| r.covered == RANKS && r.expected == RANKS),
            "{rounds:?}"
        );
    }
}
