//! libcanopy_omp end to end: unmodified OpenMP programs (sdk/examples/openmp), built with clang's -fopenmp
//! (LLVM's libomp, which implements OMPT), under `canopy run --openmp`. The store must hold every parallel
//! region, loop, barrier, single, task and taskwait the program made, per rank, named by the line of its pragma;
//! and an MPI + OpenMP program's MPI calls and OpenMP constructs must be one rank's.
//!
//! It needs clang and libomp (`apt-get install clang libomp-dev`), which `.ci/run` installs and says so with
//! CANOPY_OPENMP_TEST=1: then a missing tool fails the test. Elsewhere the test prints why it cannot run and
//! passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use canopy_integration_tests::{bin_dir, canopy_command, printed_store, read_rounds, stored_calls};

const THREADS: u64 = 3;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/examples/openmp")
}

/// Why the OpenMP tests cannot run here, if they cannot (clang with libomp when `tools` names clang); with
/// CANOPY_OPENMP_TEST set, that fails instead.
fn missing(tools: &[&str]) -> Option<String> {
    let mut why = None;
    for tool in tools {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            why = Some(format!("{tool} is not installed"));
            break;
        }
    }
    if why.is_none() && tools.contains(&"clang") {
        // clang without libomp compiles -fopenmp and fails to link.
        let probe = tempfile::tempdir().unwrap();
        let src = probe.path().join("p.c");
        std::fs::write(
            &src,
            "#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n",
        )
        .unwrap();
        let linked = Command::new("clang")
            .args(["-fopenmp", "-o"])
            .arg(probe.path().join("p"))
            .arg(&src)
            .output()
            .is_ok_and(|o| o.status.success());
        if !linked {
            why = Some("clang -fopenmp cannot link LLVM's libomp (apt-get install libomp-dev)".into());
        }
    }
    let why = why?;
    assert!(
        std::env::var_os("CANOPY_OPENMP_TEST").is_none(),
        "CANOPY_OPENMP_TEST is set but the OpenMP tests cannot run: {why} (apt-get install clang libomp-dev)"
    );
    eprintln!("skipped: {why} (apt-get install clang libomp-dev)");
    Some(why)
}

/// The OMPT tool built beside the daemons.
fn tool() -> PathBuf {
    let lib = bin_dir().join("libcanopy_omp.so");
    assert!(
        lib.is_file(),
        "libcanopy_omp.so is not built in {}: run `cargo build --workspace` first",
        bin_dir().display()
    );
    lib
}

/// Compiles `source` (sdk/examples/openmp) with `compiler -g -O2 -fopenmp` into `dir/exe`.
fn compile(dir: &Path, compiler: &str, source: &str, exe: &str) -> PathBuf {
    let out = dir.join(exe);
    let status = Command::new(compiler)
        .args(["-g", "-O2", "-fopenmp", "-o"])
        .arg(&out)
        .arg(examples().join(source))
        // Open MPI's and MPICH's mpicc, with clang underneath.
        .env("OMPI_CC", "clang")
        .env("MPICH_CC", "clang")
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success(), "{compiler} -fopenmp {source} failed");
    out
}

/// `canopy run --openmp` (and `extra` before `--`) over `command`, with THREADS threads a team.
fn canopy_run(dir: &Path, extra: &[&str], command: &[&str]) -> (Output, String) {
    let out = canopy_command()
        .args(["run", "--openmp", "--filters", "stats,passthrough", "--out"])
        .arg(dir.join("out"))
        .args(extra)
        .arg("--")
        .args(command)
        .env("OMP_NUM_THREADS", THREADS.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let store = printed_store(&stdout);
    (out, store)
}

/// `canopy run --openmp` over `mpirun -np 2` of `exe ITERATIONS`, the team's size passed to both ranks.
fn canopy_run_mpirun(dir: &Path, exe: &Path, iterations: u64) -> (Output, String) {
    canopy_run(
        dir,
        &[],
        &[
            "mpirun",
            "--oversubscribe",
            "-np",
            "2",
            "-x",
            "OMP_NUM_THREADS",
            exe.to_str().unwrap(),
            &iterations.to_string(),
        ],
    )
}

/// The line of the first line of `source` that holds `pragma`, counted from 1.
fn line_of(source: &str, pragma: &str) -> usize {
    let text = std::fs::read_to_string(examples().join(source)).unwrap();
    text.lines()
        .position(|l| l.trim_start().starts_with(pragma))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{source} has no line {pragma}"))
}

/// Every rank's calls of every OpenMP activity, by name.
fn omp_calls(store: &Path) -> BTreeMap<String, BTreeMap<u32, u64>> {
    canopy_integration_tests::reader(store)
        .names()
        .unwrap()
        .into_iter()
        .filter(|(_, n)| n.starts_with("omp "))
        .map(|(_, n)| {
            let calls = stored_calls(store, &n);
            (n, calls)
        })
        .collect()
}

#[test]
fn an_unmodified_openmp_program_reports_every_construct_per_thread_named_by_its_line() {
    if missing(&["clang"]).is_some() {
        return;
    }
    tool();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "clang", "regions.c", "regions");
    let iterations = 12;
    let (out, store) = canopy_run(dir.path(), &[], &[exe.to_str().unwrap(), &iterations.to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "regions: iterations {iterations} threads {THREADS} tasks 8 untied 4"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("canopy run: OpenMP through "), "{stdout}");
    let calls = omp_calls(Path::new(&store));
    let at = |label: &str, pragma: &str| format!("{label} @regions.c:{}", line_of("regions.c", pragma));
    let team = iterations * THREADS;
    // Each thread of each team: the region, its loop, the explicit barrier, the region's closing barrier. One
    // thread a team: the single, the tasks it made (8 each), its taskwait.
    let expected = [
        (at("omp parallel", "#pragma omp parallel"), team),
        (at("omp for", "#pragma omp for"), team),
        (at("omp barrier", "#pragma omp barrier"), team),
        (at("omp barrier wait", "#pragma omp barrier"), team),
        (at("omp barrier (implicit)", "#pragma omp parallel"), team),
        (at("omp single", "#pragma omp single"), iterations),
        (at("omp task", "#pragma omp task"), iterations * 8),
        (at("omp taskwait", "#pragma omp taskwait"), iterations),
    ];
    for (name, n) in expected {
        assert_eq!(
            calls
                .get(&name)
                .map(|per_rank| per_rank.values().copied().collect::<Vec<_>>()),
            Some(vec![n]),
            "{name}: the store has {calls:#?}"
        );
    }
    // An untied task is a call per part: libomp 14 reports even one that never yields in two (its first part
    // ends as a switch), another runtime in one.
    let untied = calls
        .get(&at("omp task", "#pragma omp task untied"))
        .and_then(|per_rank| per_rank.get(&0).copied())
        .unwrap_or(0);
    assert!(
        (iterations * 4..=iterations * 8).contains(&untied),
        "untied tasks: {untied} calls for {} tasks",
        iterations * 4
    );
    // Every round of the run covers the one rank.
    let rounds = read_rounds(Path::new(&store));
    assert!(!rounds.is_empty());
    assert!(
        rounds.iter().all(|r| (r.covered, r.expected) == (1, 1)),
        "{rounds:?}"
    );
}

#[test]
fn an_mpi_and_openmp_program_is_one_rank_with_its_mpi_calls_and_its_openmp_constructs() {
    if missing(&["clang", "mpicc", "mpirun"]).is_some() {
        return;
    }
    tool();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "hybrid.c", "hybrid");
    let iterations = 10;
    let (out, store) = canopy_run_mpirun(dir.path(), &exe, iterations);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("MPI wrapper"), "{stdout}");
    let store = Path::new(&store);
    // Both ranks, each with its MPI calls and its team's loops, in the same rank's profile.
    let allreduce = stored_calls(store, "MPI_Allreduce");
    let loops = stored_calls(
        store,
        &format!(
            "omp for @hybrid.c:{}",
            line_of("hybrid.c", "#pragma omp parallel for")
        ),
    );
    assert_eq!(allreduce, BTreeMap::from([(0, iterations), (1, iterations)]));
    assert_eq!(
        loops,
        BTreeMap::from([(0, iterations * THREADS), (1, iterations * THREADS)])
    );
    // Every thread's region, the last one's too: a worker's region ends at its closing barrier, before the
    // primary thread goes on to MPI_Finalize.
    let line = line_of("hybrid.c", "#pragma omp parallel for");
    let regions = stored_calls(store, &format!("omp parallel @hybrid.c:{line}"));
    assert_eq!(
        regions,
        BTreeMap::from([(0, iterations * THREADS), (1, iterations * THREADS)])
    );
    let rounds = read_rounds(store);
    assert!(
        rounds.iter().all(|r| (r.covered, r.expected) == (2, 2)),
        "{rounds:?}"
    );
}

/// An OpenMP program with no MPI, started by mpirun: no MPI wrapper (it would never start), and each process
/// is a rank of its own through the tool, numbered by the launcher.
#[test]
fn an_openmp_program_started_by_mpirun_without_mpi_is_a_rank_per_process() {
    if missing(&["clang", "mpirun"]).is_some() {
        return;
    }
    tool();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "clang", "regions.c", "regions");
    let iterations = 4;
    let (out, store) = canopy_run_mpirun(dir.path(), &exe, iterations);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("is not linked with MPI: no MPI wrapper"),
        "{stdout}"
    );
    let line = line_of("regions.c", "#pragma omp for");
    let loops = stored_calls(Path::new(&store), &format!("omp for @regions.c:{line}"));
    assert_eq!(
        loops,
        BTreeMap::from([(0, iterations * THREADS), (1, iterations * THREADS)])
    );
}

#[test]
fn a_program_built_with_gccs_openmp_is_said_to_be_unseen() {
    if missing(&["gcc"]).is_some() {
        return;
    }
    tool();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "gcc", "regions.c", "regions_gomp");
    let (out, store) = canopy_run(dir.path(), &[], &[exe.to_str().unwrap(), "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("uses GCC's OpenMP runtime (libgomp), which has no OMPT"),
        "{stderr}"
    );
    assert!(omp_calls(Path::new(&store)).is_empty());
}
