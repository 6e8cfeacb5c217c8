//! libcanopy_mpi end to end: unmodified MPI programs (sdk/examples/mpi) under `mpirun -np 4` against a real
//! front-end and socket agent, monitored by preloading the wrapper library, by linking it, and from Fortran.
//! The store must hold every rank's MPI calls with the counts the program itself printed, the bytes it sent,
//! every round at full coverage, and the program's output must be what it prints without Canopy.
//!
//! It needs Open MPI (mpicc, mpif90, mpirun), which `.ci/run` installs and says so with CANOPY_MPI_TEST=1: then
//! a missing tool fails the test. Elsewhere the test prints why it cannot run and passes.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::{
    Select, bin_dir, read_rounds, reader, start_socket_tree, stored_calls, stored_counter, stored_utilization,
};

const RANKS: u32 = 4;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/examples/mpi")
}

/// Why the MPI tests cannot run here, if they cannot; with CANOPY_MPI_TEST set, a missing tool fails instead.
fn missing() -> Option<String> {
    for tool in ["mpicc", "mpif90", "mpirun"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            let why =
                format!("{tool} is not installed (apt-get install openmpi-bin libopenmpi-dev gfortran)");
            assert!(
                std::env::var_os("CANOPY_MPI_TEST").is_none(),
                "CANOPY_MPI_TEST is set but the MPI tests cannot run: {why}"
            );
            eprintln!("skipped: {why}");
            return Some(why);
        }
    }
    None
}

/// The wrapper library built beside the daemons.
fn wrapper() -> PathBuf {
    let lib = bin_dir().join("libcanopy_mpi.so");
    assert!(
        lib.is_file(),
        "libcanopy_mpi.so is not built in {}: run `cargo build --workspace` first",
        bin_dir().display()
    );
    lib
}

/// Compiles `source` (in sdk/examples/mpi) with `compiler` into `dir/exe`, with `extra` flags after the source.
fn compile(dir: &Path, compiler: &str, source: &str, exe: &str, extra: &[String]) -> PathBuf {
    let out = dir.join(exe);
    let status = Command::new(compiler)
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(examples().join(source))
        .args(extra)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success(), "{compiler} {source} failed");
    out
}

/// Runs `mpirun -np RANKS` with `env` passed to every rank (`-x NAME=VALUE`), and waits up to a minute.
fn mpirun(exe: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &RANKS.to_string()])
        // Root in a container or CI: Open MPI refuses it unless told.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Ranks that wait give up the core: the ranks share the machine's few cores with the tree.
        .args(["--mca", "mpi_yield_when_idle", "1"]);
    for (name, value) in env {
        cmd.arg("-x").arg(format!("{name}={value}"));
    }
    cmd.arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("mpirun starts");
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("mpirun ran"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(id as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("mpirun {} did not end in 60 s", exe.display());
        }
    }
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The program's own counts: per rank, each `NAME VALUE` pair of its `rank R: ...` line.
fn printed_counts(stdout: &str) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("rank ") else {
            continue;
        };
        let (rank, pairs) = rest.split_once(':').expect("rank R: ...");
        let words: Vec<&str> = pairs.split_whitespace().collect();
        let counts = words
            .chunks(2)
            .map(|p| (p[0].to_string(), p[1].parse().expect("a count")))
            .collect();
        out.insert(rank.trim().parse().expect("a rank"), counts);
    }
    assert_eq!(out.len() as u32, RANKS, "a line per rank in:\n{stdout}");
    out
}

/// Every rank's stored calls of each of `calls` are the ones the program printed it made.
fn assert_calls_as_printed(store: &Path, printed: &BTreeMap<u32, BTreeMap<String, u64>>, calls: &[&str]) {
    for call in calls {
        let stored = stored_calls(store, call);
        for (rank, counts) in printed {
            assert_eq!(
                stored.get(rank).copied(),
                Some(counts[*call]),
                "{call}, rank {rank}: {stored:?}"
            );
        }
    }
}

/// Every round of both streams covers every rank; returns how many rounds there were.
fn assert_full_coverage(store: &Path) -> usize {
    let rounds = read_rounds(store);
    let mut n = 0;
    for stream in ["stats", "passthrough"] {
        let of: Vec<_> = rounds.iter().filter(|r| r.stream == stream).collect();
        assert!(!of.is_empty(), "no {stream} round stored");
        for (k, r) in of.iter().enumerate() {
            assert_eq!(r.round, k as u64, "{stream}: {of:?}");
            assert_eq!(
                (r.covered, r.expected),
                (RANKS, RANKS),
                "{stream} round {}: {r:?}",
                r.round
            );
        }
        n = of.len();
    }
    n
}

/// The stencil's calls and bytes, as it printed them, are the store's; it dumped after every MPI_Allreduce and
/// once more at MPI_Finalize.
fn assert_stencil_monitored(store: &Path, stdout: &str, iterations: usize) {
    let rounds = assert_full_coverage(store);
    assert_eq!(
        rounds,
        iterations + 1,
        "a round per MPI_Allreduce and the last one at MPI_Finalize"
    );
    let printed = printed_counts(stdout);
    assert_calls_as_printed(store, &printed, &["MPI_Sendrecv", "MPI_Allreduce"]);
    let sent = stored_counter(store, "bytes_sent");
    for (rank, counts) in &printed {
        assert_eq!(
            sent.get(rank).copied(),
            Some(counts["bytes_sent"] as f64),
            "bytes_sent, rank {rank}"
        );
    }
    // Only the counters the program added to are shipped: not one per wrapped call that moves bytes.
    let counters = reader(store).counters(Select::all()).unwrap();
    let shipped: HashSet<u64> = counters.iter().map(|c| c.counter_id).collect();
    let never: Vec<_> = counters
        .iter()
        .filter(|c| c.total.unwrap_or(0.0) <= 0.0)
        .collect();
    assert!(
        never.is_empty(),
        "counters shipped though never added to: {never:?}"
    );
    // bytes_sent, messages_sent, and the bytes of MPI_Sendrecv, MPI_Allreduce, MPI_Reduce and MPI_Gather.
    assert!(shipped.len() <= 6, "{} counters shipped", shipped.len());
    // Each MPI_Allreduce of one double: 8 bytes.
    let reduced = stored_counter(store, "MPI_Allreduce bytes");
    for (rank, counts) in &printed {
        assert_eq!(
            reduced.get(rank).copied(),
            Some((counts["MPI_Allreduce"] * 8) as f64),
            "MPI_Allreduce bytes, rank {rank}"
        );
    }
}

const STENCIL_ARGS: [&str; 3] = ["30", "128", "16"];

#[test]
fn an_unmodified_mpi_program_with_the_wrapper_preloaded_reports_every_call_and_byte() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let plain = mpirun(&exe, &STENCIL_ARGS, &[]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));

    let tree = start_socket_tree(dir.path());
    let env = [
        ("LD_PRELOAD", lib.display().to_string()),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "MPI_Allreduce".to_string()),
    ];
    let run = mpirun(&exe, &STENCIL_ARGS, &env);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        !stderr.contains("canopy-mpi:"),
        "the wrapper complained:\n{stderr}"
    );
    // The same output, checksum included, as without Canopy.
    assert_eq!(text(&run.stdout), text(&plain.stdout));
    let store = tree.finished();
    assert_stencil_monitored(&store, &text(&run.stdout), 30);
}

#[test]
fn canopy_run_monitors_an_mpirun_job_in_one_command_and_writes_its_report() {
    if missing().is_some() {
        return;
    }
    wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--out"])
        .arg(&out_dir)
        .args([
            "--filters",
            "stats,passthrough",
            "--",
            "mpirun",
            "--oversubscribe",
            "-np",
        ])
        .arg(RANKS.to_string())
        .args(["--mca", "mpi_yield_when_idle", "1"])
        .arg(&exe)
        .args(STENCIL_ARGS)
        // Passed on to every rank by `canopy run`, as any CANOPY_ variable is.
        .env("CANOPY_MPI_DUMP_ON", "MPI_Allreduce")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("watch it: canopy watch --frontend"), "{stdout}");
    assert!(
        !stderr.contains("canopy-mpi:") && !stderr.contains("canopy: rank"),
        "{stderr}"
    );
    let store = canopy_integration_tests::printed_store(&stdout);
    let report = PathBuf::from(&store).with_extension("html");
    assert!(report.is_file(), "no report beside {store}:\n{stdout}");
    // Up to 1,024 ranks each rank's profile is kept: the report has the per-rank view, and time per round.
    let html = std::fs::read_to_string(&report).unwrap();
    for part in [
        "Per rank: passthrough",
        "most in MPI_",
        "time per round",
        "time in MPI",
    ] {
        assert!(html.contains(part), "{part} is not in the report");
    }
    assert_stencil_monitored(Path::new(&store), &stdout, 30);
}

/// LLNL's LULESH (MPI), where CANOPY_LULESH_DIR names its source (github.com/LLNL/LULESH): built with mpicxx,
/// run on 8 ranks under `canopy run` with Open MPI's pml monitoring on in the same run; every round whole, its
/// real imbalance (ranks on the cube's faces send more than those inside) in the per-rank view and in the
/// outliers found with their defaults, and each rank's messages and bytes sent equal to the monitoring's. CI cannot fetch it: the test says it skipped.
#[test]
fn canopy_run_monitors_lulesh_on_8_ranks_and_its_report_shows_the_imbalance_of_its_sends() {
    let Some(src) = third_party("CANOPY_LULESH_DIR", "LULESH's source (github.com/LLNL/LULESH)") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("lulesh");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(&build)
        .status()
        .unwrap();
    assert!(copied.success());
    let made = Command::new("make")
        .arg("CXX=mpicxx -DUSE_MPI=1")
        .current_dir(&build)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--out"])
        .arg(&out_dir)
        .args([
            "--",
            "mpirun",
            "-np",
            "8",
            "--oversubscribe",
            "--mca",
            "mpi_yield_when_idle",
            "1",
        ])
        // Open MPI's own monitoring in the same run, to compare each rank's sends with.
        .args(pml_monitoring(&dir.path().join("lulesh-monitoring")))
        .args(["-x", "OMP_NUM_THREADS=1", "./lulesh2.0", "-s", "8", "-i", "100"])
        .current_dir(&build)
        .env("CANOPY_MPI_DUMP_ON", "MPI_Allreduce")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Run completed"), "{stdout}");
    let store = build.join(canopy_integration_tests::printed_store(&stdout));
    let rounds: Vec<_> = read_rounds(&store)
        .into_iter()
        .filter(|r| r.stream == "stats")
        .collect();
    assert_eq!(
        rounds.len(),
        100,
        "one round per iteration (each ends in an MPI_Allreduce)"
    );
    assert!(
        rounds.iter().all(|r| (r.covered, r.expected) == (8, 8)),
        "{rounds:?}"
    );
    // Every rank's MPI_Isend calls over the run, from the per-rank sums: not all equal.
    let passthrough = reader(&store)
        .stream_named("passthrough")
        .unwrap()
        .expect("a passthrough stream");
    let sends: Vec<u64> = reader(&store)
        .rank_totals(passthrough.stream_id)
        .unwrap()
        .into_iter()
        .filter(|t| t.event_id == canopy_proto::event_id("MPI_Isend"))
        .map(|t| t.calls)
        .collect();
    assert_eq!(sends.len(), 8, "{sends:?}");
    assert!(sends.iter().min() < sends.iter().max(), "{sends:?}");
    let html = std::fs::read_to_string(store.with_extension("html")).unwrap();
    assert!(html.contains("Per rank: passthrough") && html.contains("MPI_Isend"));
    eprintln!("LULESH under canopy run: MPI_Isend calls per rank {sends:?}");
    // The outliers stream, with its defaults (every metric, each event weighted by its share), names the ranks
    // that send fewest and most as its top two: the imbalance is in calls, not in time.
    let (fewest, most) = (
        position_of(&sends, sends.iter().min()),
        position_of(&sends, sends.iter().max()),
    );
    let outliers = reader(&store).outliers(Select::all()).unwrap();
    let found = (0..100u64)
        .filter(|round| {
            let mut top: Vec<u32> = outliers
                .iter()
                .filter(|o| o.round == *round && o.position < 2)
                .map(|o| o.rank)
                .collect();
            top.sort();
            top == [fewest, most]
        })
        .count();
    eprintln!("LULESH: the outliers' top two are ranks {fewest} and {most} in {found} of 100 rounds");
    assert!(
        found >= 80,
        "ranks {fewest} and {most} the top two in {found} of 100 rounds"
    );
    // Each rank's messages and bytes sent are what Open MPI's pml monitoring saw it send.
    let sent = assert_sent_as_monitored(&store, &dir.path().join("lulesh-monitoring"), 8);
    eprintln!("LULESH, pml monitoring and Canopy, messages and bytes sent per rank: {sent:?}");
    // Every message LULESH sends is received by an MPI_Irecv, counted as a wait completes it: over the ranks,
    // the bytes received are the bytes sent.
    let received: f64 = stored_counter(&store, "MPI_Irecv bytes").values().sum();
    let sent: f64 = stored_counter(&store, "bytes_sent").values().sum();
    assert!(sent > 0.0 && received == sent, "received {received}, sent {sent}");
}

/// The rank holding `value` in `per_rank`.
fn position_of(per_rank: &[u64], value: Option<&u64>) -> u32 {
    per_rank.iter().position(|v| Some(v) == value).unwrap() as u32
}

/// The OSU latency benchmark, where CANOPY_OSU_DIR names the OSU micro-benchmarks' source
/// (github.com/forresti/osu-micro-benchmarks): built as its notes say and run on 2 ranks under `canopy run`, each
/// rank's MPI_Send and MPI_Recv calls are the number its own constants give (every message size from 0 to
/// MAX_MSG_SIZE, LAT_LOOP + LAT_SKIP round trips each, small or large), and its MPI_Barrier one per size.
#[test]
fn osu_latency_makes_the_calls_its_constants_say() {
    let Some(src) = third_party("CANOPY_OSU_DIR", "the OSU micro-benchmarks' source") else {
        return;
    };
    let pt2pt = Path::new(&src).join("mpi/pt2pt");
    let header = std::fs::read_to_string(pt2pt.join("osu_pt2pt.h")).unwrap();
    let constant = |name: &str| -> u64 {
        let line = header
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("osu_pt2pt.h has no {name}"));
        let value = line.split_whitespace().nth(2).unwrap();
        match value.strip_prefix("(1<<").and_then(|v| v.strip_suffix(')')) {
            Some(shift) => 1 << shift.parse::<u32>().unwrap(),
            None => value.parse().unwrap_or_else(|_| panic!("{line}")),
        }
    };
    let (large, max) = (constant("LARGE_MESSAGE_SIZE"), constant("MAX_MSG_SIZE"));
    let sizes: Vec<u64> = std::iter::once(0)
        .chain((0..).map(|i| 1u64 << i).take_while(|s| *s <= max))
        .collect();
    let round_trips: u64 = sizes
        .iter()
        .map(|s| match *s > large {
            true => constant("LAT_LOOP_LARGE") + constant("LAT_SKIP_LARGE"),
            false => constant("LAT_LOOP_SMALL") + constant("LAT_SKIP_SMALL"),
        })
        .sum();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("osu_latency");
    let built = Command::new("mpicc")
        .args(["-O2", "-I."])
        .args(["osu_latency.c", "osu_pt2pt.c", "-o"])
        .arg(&exe)
        .current_dir(&pt2pt)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built.stderr));
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--filters", "stats,passthrough", "--no-report", "--out"])
        .arg(dir.path().join("out"))
        .args(["--", "mpirun", "-np", "2", "--mca", "mpi_yield_when_idle", "1"])
        .arg(&exe)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let store = canopy_integration_tests::printed_store(&stdout);
    let store = Path::new(&store);
    let each = |n: u64| BTreeMap::from([(0, n), (1, n)]);
    assert_eq!(stored_calls(store, "MPI_Send"), each(round_trips));
    assert_eq!(stored_calls(store, "MPI_Recv"), each(round_trips));
    assert_eq!(stored_calls(store, "MPI_Barrier"), each(sizes.len() as u64));
    eprintln!(
        "osu_latency: {round_trips} MPI_Send and MPI_Recv per rank over {} sizes, as its constants say",
        sizes.len()
    );
}

/// Persistent requests, neighbourhood collectives, Alltoallw, a distributed graph, derived datatypes, an
/// allocated window and MPI-IO (sdk/examples/mpi/families.c), unmodified under the preloaded wrapper: every rank's
/// calls of each as the program counted them, and the bytes written and read through MPI-IO.
#[test]
fn every_family_of_mpi_procedure_is_counted_per_rank_as_the_program_made_its_calls() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "families.c", "families", &[]);
    let tree = start_socket_tree(dir.path());
    let file = dir.path().join("families.dat");
    let env = [
        ("LD_PRELOAD", lib.display().to_string()),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
    ];
    let run = mpirun(&exe, &["5", file.to_str().unwrap()], &env);
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", text(&run.stderr));
    let store = tree.finished();
    assert_families_monitored(&store, &stdout, Standard::of("mpicc"));
}

/// The MPI standard a family's mpi.h declares: families.c makes MPI 4's calls where it is 4 or later.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Standard {
    Mpi3,
    Mpi4,
}

impl Standard {
    /// The standard `mpicc`'s mpi.h declares (its `MPI_VERSION`).
    fn of(mpicc: &str) -> Standard {
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("version.c");
        std::fs::write(&probe, "#include <mpi.h>\ncanopy_version MPI_VERSION\n").unwrap();
        let out = Command::new(mpicc)
            .arg("-E")
            .arg(&probe)
            .output()
            .expect("mpicc -E runs");
        let stdout = text(&out.stdout);
        let version = stdout
            .lines()
            .find_map(|l| l.strip_prefix("canopy_version "))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{mpicc} -E did not say MPI_VERSION: {}", text(&out.stderr)));
        if version >= 4 {
            Standard::Mpi4
        } else {
            Standard::Mpi3
        }
    }
}

/// families.c's calls and bytes, per rank, as it made them (its own printed counts, and what each call moves).
fn assert_families_monitored(store: &Path, stdout: &str, standard: Standard) {
    let store = store.to_path_buf();
    let printed = printed_counts(stdout);
    let calls: Vec<&str> = printed[&0].keys().map(String::as_str).collect();
    assert_calls_as_printed(&store, &printed, &calls);
    let mpi4 = standard == Standard::Mpi4;
    // Created once, started five times; one of each on the side of the ring (and MPI 4's persistent Allreduce).
    for (call, each) in [
        ("MPI_Send_init", 1),
        ("MPI_Recv_init", 1),
        ("MPI_Request_free", if mpi4 { 3 } else { 2 }),
        ("MPI_Cart_create", 1),
        ("MPI_Mrecv", 1),
    ] {
        let stored = stored_calls(&store, call);
        assert!(
            stored.len() == RANKS as usize && stored.values().all(|n| *n == each),
            "{call}: {stored:?}"
        );
    }
    // The persistent send, a message of 64 ints at each of its five starts; the Isend of the matched probe; MPI
    // 4's Isendrecv. Then the Send of half a block for the Irecv.
    let messages = if mpi4 { 7.0 } else { 6.0 };
    let sent = messages * 256.0 + 128.0;
    let mut expected = vec![
        // 64 ints: written as asked, read as the status says, put, and per neighbour's block five times.
        ("MPI_File_write_at bytes", 256.0),
        ("MPI_File_write_at_all bytes", 256.0),
        ("MPI_File_write_ordered bytes", 256.0),
        ("MPI_File_read_at bytes", 256.0),
        ("MPI_File_read_at_all bytes", 256.0),
        ("MPI_Put bytes", 256.0),
        ("MPI_Rput bytes", 256.0),
        ("MPI_Fetch_and_op bytes", 4.0),
        ("MPI_Mrecv bytes", 256.0),
        ("messages_sent", messages + 1.0),
        ("bytes_sent", sent),
        // Received as the waits completed them: the persistent receive at each of its five starts (a Waitall
        // that ignores the statuses), half a block for the Irecv (a Waitany that ignores its status).
        ("MPI_Recv_init bytes", 5.0 * 256.0),
        ("MPI_Irecv bytes", 128.0),
        ("MPI_Neighbor_allgather bytes", 5.0 * 256.0),
        ("MPI_Ineighbor_allgather bytes", 5.0 * 256.0),
        // Half the block to each of the two neighbours of the ring, five times.
        ("MPI_Neighbor_alltoallv bytes", 5.0 * 256.0),
        // One element to every rank in the pair's type: on 4 ranks, two doubles and two ints each.
        ("MPI_Alltoallw bytes", 2.0 * 8.0 + 2.0 * 4.0),
    ];
    if mpi4 {
        // Counted at each of its five starts; the large-count form as its base form.
        expected.extend([
            ("MPI_Allreduce_init bytes", 5.0 * 256.0),
            ("MPI_Bcast_c bytes", 256.0),
        ]);
    }
    for (counter, bytes) in expected {
        let stored = stored_counter(&store, counter);
        assert!(
            stored.len() == RANKS as usize && stored.values().all(|b| *b == bytes),
            "{counter}: {stored:?}"
        );
    }
}

/// The directory `var` names, holding `what` (a program CI cannot fetch), with MPI and the wrapper here; `None`,
/// said, where the variable is unset or MPI is missing.
fn third_party(var: &str, what: &str) -> Option<PathBuf> {
    let Some(src) = std::env::var_os(var) else {
        eprintln!("skipped: {var} does not name {what}");
        return None;
    };
    if missing().is_some() {
        return None;
    }
    wrapper();
    Some(PathBuf::from(src))
}

/// Why the MPICH test cannot run here, if it cannot (CANOPY_MPI_TEST makes it fail instead).
fn mpich_missing() -> Option<String> {
    for tool in ["mpicc.mpich", "mpiexec.mpich"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            let why = format!("{tool} is not installed (apt-get install mpich libmpich-dev)");
            assert!(
                std::env::var_os("CANOPY_MPI_TEST").is_none(),
                "CANOPY_MPI_TEST is set but the MPICH test cannot run: {why}"
            );
            eprintln!("skipped: {why}");
            return Some(why);
        }
    }
    None
}

/// An MPICH program (built with mpicc.mpich) under `canopy run -- mpiexec.mpich`: canopy run picks the wrapper
/// built for MPICH, passes it and the socket with Hydra's -genv, and every rank's calls and bytes are stored.
#[test]
fn canopy_run_monitors_an_mpich_program_through_hydra_with_the_wrapper_built_for_mpich() {
    if missing().is_some() || mpich_missing().is_some() {
        return;
    }
    let mpich_wrapper = bin_dir().join("libcanopy_mpi_mpich.so");
    assert!(
        mpich_wrapper.is_file(),
        "libcanopy_mpi_mpich.so is not built: cargo build --workspace"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc.mpich", "stencil_mpi.c", "stencil_mpich", &[]);
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--out"])
        .arg(dir.path().join("out"))
        .args(["--", "mpiexec.mpich", "-n"])
        .arg(RANKS.to_string())
        .arg(&exe)
        .args(STENCIL_ARGS)
        .env("CANOPY_MPI_DUMP_ON", "MPI_Allreduce")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the program uses MPICH: MPI wrapper") && stdout.contains("libcanopy_mpi_mpich.so"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("canopy-mpi:") && !stderr.contains("canopy: rank"),
        "{stderr}"
    );
    let store = canopy_integration_tests::printed_store(&stdout);
    assert_stencil_monitored(Path::new(&store), &stdout, 30);
}

/// The program of every family, built with MPICH's mpicc under `canopy run -- mpiexec.mpich`: the wrapper built
/// for MPICH counts every call and byte as Open MPI's does.
#[test]
fn every_family_of_mpi_procedure_is_counted_under_mpich_too() {
    if missing().is_some() || mpich_missing().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc.mpich", "families.c", "families_mpich", &[]);
    let file = dir.path().join("families.dat");
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--filters", "stats,passthrough", "--no-report", "--out"])
        .arg(dir.path().join("out"))
        .args(["--", "mpiexec.mpich", "-n"])
        .arg(RANKS.to_string())
        .arg(&exe)
        .args(["5", file.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("libcanopy_mpi_mpich.so"), "{stdout}");
    let store = canopy_integration_tests::printed_store(&stdout);
    assert_families_monitored(Path::new(&store), &stdout, Standard::of("mpicc.mpich"));
}

/// A PMPI tool of the test's own: it counts MPI_Allreduce and MPI_Sendrecv and says how many at MPI_Finalize, as
/// mpiP or Darshan would keep their own figures.
const COUNTING_TOOL: &str = r#"
#include <mpi.h>
#include <stdio.h>
static long allreduce, sendrecv;
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
    allreduce++;
    return PMPI_Allreduce(s, r, n, t, o, c);
}
int MPI_Sendrecv(const void *sb, int sn, MPI_Datatype st, int d, int stag, void *rb, int rn, MPI_Datatype rt,
                 int src, int rtag, MPI_Comm c, MPI_Status *status) {
    sendrecv++;
    return PMPI_Sendrecv(sb, sn, st, d, stag, rb, rn, rt, src, rtag, c, status);
}
int MPI_Finalize(void) {
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "counting tool: rank %d: MPI_Sendrecv %ld MPI_Allreduce %ld\n", rank, sendrecv, allreduce);
    return PMPI_Finalize();
}
"#;

/// Builds the tool `source` as `dir/libNAME.so` with mpicc, with `link`'s flags after it.
fn build_tool(dir: &Path, name: &str, source: &str, link: &str) -> PathBuf {
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).unwrap();
    let tool = dir.join(format!("lib{name}.so"));
    let built = Command::new("mpicc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&tool)
        .arg(&file)
        .args(link.split_whitespace())
        .status()
        .unwrap();
    assert!(built.success(), "mpicc {name}.c");
    tool
}

/// The same tool for Fortran programs: it counts MPI_ALLREDUCE through the Fortran binding (`mpi_allreduce_`)
/// and calls the profiling one, as a Fortran-aware tool does.
const FORTRAN_COUNTING_TOOL: &str = r#"
#include <mpi.h>
#include <stdio.h>
void pmpi_allreduce_(void *, void *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *);
void pmpi_finalize_(MPI_Fint *);
static long allreduce;
void mpi_allreduce_(void *s, void *r, MPI_Fint *n, MPI_Fint *t, MPI_Fint *op, MPI_Fint *c, MPI_Fint *ierr) {
    allreduce++;
    pmpi_allreduce_(s, r, n, t, op, c, ierr);
}
void mpi_finalize_(MPI_Fint *ierr) {
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "fortran counting tool: rank %d: MPI_Allreduce %ld\n", rank, allreduce);
    pmpi_finalize_(ierr);
}
"#;

#[test]
fn a_fortran_pmpi_tool_loaded_after_the_wrapper_sees_every_fortran_call_too() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpif90", "ring_mpi.f90", "ring_mpi", &[]);
    // The Fortran bindings' profiling entry points, for the tool to call on.
    let libs = Command::new("mpif90").arg("--showme:link").output().unwrap();
    let link = text(&libs.stdout);
    let tool = build_tool(dir.path(), "fortran_tool", FORTRAN_COUNTING_TOOL, &link);
    let tree = start_socket_tree(dir.path());
    let env = [
        ("LD_PRELOAD", format!("{}:{}", lib.display(), tool.display())),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "MPI_Allreduce:5".to_string()),
    ];
    let run = mpirun(&exe, &["25"], &env);
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{stderr}");
    let printed = printed_counts(&stdout);
    for (rank, counts) in &printed {
        let said = format!(
            "fortran counting tool: rank {rank}: MPI_Allreduce {}",
            counts["MPI_Allreduce"]
        );
        assert!(stderr.contains(&said), "{said} not in:\n{stderr}");
    }
    // And Canopy stored them, as without the other tool.
    let store = tree.finished();
    assert_calls_as_printed(&store, &printed, &["MPI_Allreduce"]);
}

#[test]
fn another_pmpi_tool_loaded_after_the_wrapper_still_sees_every_call_and_both_count_them_all() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let tool = build_tool(dir.path(), "counting_tool", COUNTING_TOOL, "");
    let tree = start_socket_tree(dir.path());
    let env = [
        // Canopy first, the other tool after it: Canopy's MPI_X calls the tool's, which calls PMPI_X.
        ("LD_PRELOAD", format!("{}:{}", lib.display(), tool.display())),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "MPI_Allreduce".to_string()),
    ];
    let run = mpirun(&exe, &STENCIL_ARGS, &env);
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{stderr}");
    // The tool counted what the program says it called, rank by rank.
    for rank in 0..RANKS {
        let said = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {rank}: ")))
            .unwrap_or_else(|| panic!("rank {rank} said nothing: {stdout}"));
        let calls: Vec<&str> = said.split_whitespace().skip(2).take(4).collect();
        let tool_said = format!("counting tool: rank {rank}: {}", calls.join(" "));
        assert!(stderr.contains(&tool_said), "{tool_said} not in:\n{stderr}");
    }
    // And Canopy stored every call and byte, as without the other tool.
    let store = tree.finished();
    assert_stencil_monitored(&store, &stdout, 30);
}

/// LLNL's mpiP, where CANOPY_MPIP_DIR names its source (github.com/LLNL/mpiP) or a directory holding a built
/// libmpiP.so: preloaded after Canopy on the stencil and on the program of every family, both count every call.
/// mpiP's per-rank call counts of each MPI function it wraps (its callsite statistics, summed over sites) are
/// Canopy's stored calls, and the stencil's bytes sent by each collective are Canopy's byte counters. (mpiP
/// counts a send to MPI_PROC_NULL at its size and Canopy counts none, so MPI_Sendrecv's bytes are compared by
/// calls only.)
#[test]
fn mpip_preloaded_after_canopy_counts_every_call_as_canopy_does() {
    let Some(src) = third_party("CANOPY_MPIP_DIR", "mpiP's source (github.com/LLNL/mpiP)") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let libmpip = match Path::new(&src).join("libmpiP.so") {
        built if built.is_file() => built,
        _ => build_mpip(Path::new(&src), dir.path()),
    };
    let stencil = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let (store, report) = run_with_mpip(dir.path(), "stencil", &libmpip, &stencil, &STENCIL_ARGS);
    let calls = assert_mpip_calls_stored(&store, &report);
    assert!(calls >= 5, "mpiP's report of the stencil has {calls} functions");
    for (name, per_rank) in mpip_section(&report, "Callsite Message Sent statistics") {
        if name == "Sendrecv" {
            continue;
        }
        let canopy: BTreeMap<u32, u64> = stored_counter(&store, &format!("MPI_{name} bytes"))
            .into_iter()
            .map(|(rank, bytes)| (rank, bytes as u64))
            .collect();
        assert_eq!(canopy, per_rank, "MPI_{name} bytes: mpiP against Canopy");
    }
    let families = compile(dir.path(), "mpicc", "families.c", "families", &[]);
    let file = dir.path().join("families.dat");
    let (store, report) = run_with_mpip(
        dir.path(),
        "families",
        &libmpip,
        &families,
        &["5", file.to_str().unwrap()],
    );
    let calls = assert_mpip_calls_stored(&store, &report);
    assert!(calls >= 20, "mpiP's report of the families has {calls} functions");
}

/// `canopy run` of `exe` on RANKS ranks with mpiP preloaded after Canopy; returns the store and mpiP's report.
fn run_with_mpip(dir: &Path, name: &str, libmpip: &Path, exe: &Path, args: &[&str]) -> (PathBuf, String) {
    let reports = dir.join(format!("mpip-{name}"));
    std::fs::create_dir(&reports).unwrap();
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--filters", "stats,passthrough", "--no-report", "--out"])
        .arg(dir.join(format!("out-{name}")))
        .args(["--", "mpirun", "--oversubscribe", "-np"])
        .arg(RANKS.to_string())
        .args(["--mca", "mpi_yield_when_idle", "1", "-x", "MPIP"])
        .arg(exe)
        .args(args)
        // canopy run puts its wrapper first and keeps the preload it finds after it.
        .env("LD_PRELOAD", libmpip)
        .env("MPIP", format!("-f {} -k 0", reports.display()))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let store = canopy_integration_tests::printed_store(&stdout);
    let report = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "mpiP"))
        .unwrap_or_else(|| panic!("mpiP wrote no report:\n{stderr}"));
    (PathBuf::from(store), std::fs::read_to_string(report).unwrap())
}

/// Every function in mpiP's callsite statistics has, rank by rank, the calls Canopy stored; returns how many
/// functions mpiP reported.
fn assert_mpip_calls_stored(store: &Path, report: &str) -> usize {
    let calls = mpip_section(report, "Callsite Time statistics");
    for (name, per_rank) in &calls {
        assert_eq!(
            &stored_calls(store, &format!("MPI_{name}")),
            per_rank,
            "MPI_{name}: mpiP against Canopy"
        );
    }
    eprintln!("mpiP and Canopy, calls per rank: {calls:?}");
    calls.len()
}

/// Builds mpiP from `src` in `dir` (its README's configure, without libunwind and BFD); returns libmpiP.so.
fn build_mpip(src: &Path, dir: &Path) -> PathBuf {
    let build = dir.join("mpiP");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(src)
        .arg(&build)
        .status()
        .unwrap();
    assert!(copied.success(), "cannot copy {}", src.display());
    let sh = |script: &str| {
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(&build)
            // mpiP's wrapper generator names its creator from LOGNAME.
            .env("LOGNAME", "canopy-test")
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {}", text(&out.stderr));
    };
    sh("./configure --disable-libunwind --disable-bfd --with-cc=mpicc --with-cxx=mpicxx");
    sh("make -j2 shared");
    build.join("libmpiP.so")
}

/// One of mpiP's per-callsite sections: per MPI function (mpiP names it without `MPI_`), per rank, the sum over
/// its sites of the column `Count` (time statistics) or `Sum` (message sizes).
fn mpip_section(report: &str, title: &str) -> BTreeMap<String, BTreeMap<u32, u64>> {
    let mut lines = report.lines().skip_while(|l| !l.contains(title)).skip(1);
    let header: Vec<&str> = lines
        .find(|l| l.starts_with("Name"))
        .unwrap_or_else(|| panic!("mpiP's report has no section {title}"))
        .split_whitespace()
        .collect();
    let wanted = if title.contains("Time") { "Count" } else { "Sum" };
    let column = header
        .iter()
        .position(|h| *h == wanted)
        .unwrap_or_else(|| panic!("{title}: {header:?}"));
    let mut out: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    for line in lines.take_while(|l| !l.starts_with("---")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(Ok(rank)), Some(value)) =
            (f.first(), f.get(2).map(|r| r.parse::<u32>()), f.get(column))
        else {
            continue; // a blank line, or a function's row of all ranks ('*')
        };
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{title}: {line}"));
        *out.entry(name.to_string()).or_default().entry(rank).or_default() += value as u64;
    }
    out
}

/// Open MPI's own pml monitoring (built into the library, not a PMPI tool) in the same run as Canopy: each rank's
/// point-to-point messages and bytes sent, summed over its peers from the monitoring's `E` lines, are Canopy's
/// `messages_sent` and `bytes_sent`.
#[test]
fn messages_and_bytes_sent_equal_open_mpis_pml_monitoring_in_the_same_run() {
    if missing().is_some() {
        return;
    }
    wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let monitoring = dir.path().join("monitoring");
    std::fs::create_dir(&monitoring).unwrap();
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--filters", "stats,passthrough", "--no-report", "--out"])
        .arg(dir.path().join("out"))
        .args(["--", "mpirun", "--oversubscribe", "-np"])
        .arg(RANKS.to_string())
        .args(["--mca", "mpi_yield_when_idle", "1"])
        .args(pml_monitoring(&monitoring.join("stencil")))
        .arg(&exe)
        .args(STENCIL_ARGS)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let store = canopy_integration_tests::printed_store(&stdout);
    let sent = assert_sent_as_monitored(Path::new(&store), &monitoring.join("stencil"), RANKS);
    eprintln!("pml monitoring and Canopy, messages and bytes sent per rank: {sent:?}");
}

/// mpirun's options that turn Open MPI's pml monitoring on, its files at `prefix.<rank>.prof`.
fn pml_monitoring(prefix: &Path) -> Vec<String> {
    [
        "--mca",
        "pml_monitoring_enable",
        "2",
        "--mca",
        "pml_monitoring_enable_output",
        "3",
        "--mca",
        "pml_monitoring_filename",
    ]
    .into_iter()
    .map(String::from)
    .chain([prefix.display().to_string()])
    .collect()
}

/// Per rank, the point-to-point messages and bytes the pml monitoring saw it send (`E src dst N bytes M msgs
/// sent` lines of `prefix.<rank>.prof`), asserted equal to the store's `messages_sent` and `bytes_sent`.
fn assert_sent_as_monitored(store: &Path, prefix: &Path, ranks: u32) -> BTreeMap<u32, (u64, u64)> {
    let messages = stored_counter(store, "messages_sent");
    let bytes = stored_counter(store, "bytes_sent");
    let mut sent = BTreeMap::new();
    for rank in 0..ranks {
        let file = PathBuf::from(format!("{}.{rank}.prof", prefix.display()));
        let prof = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (mut n, mut b) = (0u64, 0u64);
        for line in prof.lines().filter(|l| l.starts_with("E\t")) {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f[1], rank.to_string(), "{line}");
            b += f[3].trim_end_matches(" bytes").parse::<u64>().unwrap();
            n += f[4].trim_end_matches(" msgs sent").parse::<u64>().unwrap();
        }
        assert!(n > 0, "the monitoring saw rank {rank} send nothing:\n{prof}");
        assert_eq!(
            messages.get(&rank).copied(),
            Some(n as f64),
            "rank {rank}: messages sent"
        );
        assert_eq!(
            bytes.get(&rank).copied(),
            Some(b as f64),
            "rank {rank}: bytes sent"
        );
        sent.insert(rank, (n, b));
    }
    sent
}

/// Procedures the MPI library defines that no wrapper covers, and why: the program's own clock (a wrapper would
/// perturb what it times), a variable argument list, and the MPI-1 procedures MPI-3.0 removed, which Open MPI's
/// libmpi still defines for old binaries but its mpi.h no longer declares.
const UNWRAPPED: &[&str] = &[
    "MPI_Wtime",
    "MPI_Wtick",
    "MPI_Pcontrol",
    "MPI_Address",
    "MPI_Errhandler_create",
    "MPI_Errhandler_get",
    "MPI_Errhandler_set",
    "MPI_Type_extent",
    "MPI_Type_hindexed",
    "MPI_Type_hvector",
    "MPI_Type_lb",
    "MPI_Type_struct",
    "MPI_Type_ub",
];

/// The symbols a shared object defines and exports, as `nm -D --defined-only` lists them.
fn exported_symbols(object: &Path) -> HashSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(object)
        .output()
        .unwrap_or_else(|e| panic!("nm runs: {e}"));
    assert!(
        out.status.success(),
        "nm {}: {}",
        object.display(),
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// The library a wrapper is linked with, by the start of its file name, where the loader finds it.
fn linked_library(object: &Path, name: &str) -> Option<PathBuf> {
    let out = Command::new("ldd").arg(object).output().ok()?;
    text(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split(" => ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(PathBuf::from)
}

/// Every procedure of the whole MPI library is wrapped, for each MPI family built here: each PMPI_X the library
/// the wrapper links defines has its MPI_X in the wrapper (the list's 117 annotated, the rest as mpi.h declares
/// them), but for UNWRAPPED.
#[test]
fn every_procedure_the_mpi_library_defines_is_wrapped_but_the_clock() {
    if missing().is_some() {
        return;
    }
    let mut families = vec![(wrapper(), "libmpi.so")];
    let mpich = bin_dir().join("libcanopy_mpi_mpich.so");
    if mpich.is_file() {
        families.push((mpich, "libmpich.so"));
    }
    for (lib, libmpi) in families {
        let mpi = linked_library(&lib, libmpi)
            .unwrap_or_else(|| panic!("{} is not linked with {libmpi}", lib.display()));
        let wrapped = exported_symbols(&lib);
        let procedures: Vec<String> = exported_symbols(&mpi)
            .into_iter()
            .filter_map(|s| {
                s.strip_prefix('P')
                    .filter(|n| n.starts_with("MPI_"))
                    .map(str::to_string)
            })
            .collect();
        assert!(
            procedures.len() > 350,
            "{}: {} procedures",
            mpi.display(),
            procedures.len()
        );
        let mut unwrapped: Vec<&String> = procedures
            .iter()
            .filter(|p| !wrapped.contains(*p) && !UNWRAPPED.contains(&p.as_str()))
            .collect();
        unwrapped.sort();
        assert!(
            unwrapped.is_empty(),
            "{} defines procedures {} does not wrap: {unwrapped:?}",
            mpi.display(),
            lib.display()
        );
        eprintln!(
            "{}: {} procedures, all wrapped but {:?}",
            mpi.display(),
            procedures.len(),
            UNWRAPPED
        );
    }
}

#[test]
fn the_same_program_linked_with_the_wrapper_reports_the_same() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let libdir = lib.parent().unwrap().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let link = [
        format!("-L{libdir}"),
        format!("-Wl,-rpath,{libdir}"),
        "-lcanopy_mpi".to_string(),
    ];
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi-linked", &link);
    let plain = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let reference = mpirun(&plain, &STENCIL_ARGS, &[]);
    assert!(reference.status.success(), "{}", text(&reference.stderr));

    let tree = start_socket_tree(dir.path());
    let env = [
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "MPI_Allreduce".to_string()),
    ];
    let run = mpirun(&exe, &STENCIL_ARGS, &env);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), text(&reference.stdout));
    let store = tree.finished();
    assert_stencil_monitored(&store, &text(&run.stdout), 30);
}

#[test]
fn a_fortran_mpi_program_under_the_preloaded_wrapper_reports_its_calls() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpif90", "ring_mpi.f90", "ring_mpi", &[]);
    let plain = mpirun(&exe, &["25"], &[]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));

    let tree = start_socket_tree(dir.path());
    // A dump every 5th MPI_ALLREDUCE: the Fortran calls count toward it as the C ones would.
    let env = [
        ("LD_PRELOAD", lib.display().to_string()),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "MPI_Allreduce:5".to_string()),
    ];
    let run = mpirun(&exe, &["25"], &env);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), text(&plain.stdout));
    let store = tree.finished();
    // 25 calls: a dump after the 5th, 10th, ... 25th, and the last at MPI_FINALIZE.
    assert_eq!(assert_full_coverage(&store), 6);
    let printed = printed_counts(&text(&run.stdout));
    assert_calls_as_printed(&store, &printed, &["MPI_Sendrecv", "MPI_Allreduce"]);
    // One double to the next rank per MPI_SENDRECV, and one double per MPI_ALLREDUCE.
    let sent = stored_counter(&store, "bytes_sent");
    let reduced = stored_counter(&store, "MPI_Allreduce bytes");
    let received = stored_counter(&store, "MPI_Sendrecv bytes");
    for rank in 0..RANKS {
        assert_eq!(
            sent.get(&rank).copied(),
            Some(25.0 * 8.0),
            "bytes_sent, rank {rank}"
        );
        assert_eq!(
            reduced.get(&rank).copied(),
            Some(25.0 * 8.0),
            "MPI_Allreduce bytes, rank {rank}"
        );
        assert_eq!(
            received.get(&rank).copied(),
            Some(25.0 * 8.0),
            "MPI_Sendrecv bytes, rank {rank}"
        );
    }
}

#[test]
fn bad_dump_settings_are_named_on_stderr_and_the_program_runs_on() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let plain = mpirun(&exe, &["5", "32", "4"], &[]);
    // No agent: the wrapper says so at MPI_Finalize and the program ends as it would.
    let env = [
        ("LD_PRELOAD", lib.display().to_string()),
        (
            "CANOPY_AGENT_SOCKET",
            dir.path().join("none.sock").display().to_string(),
        ),
        ("CANOPY_MPI_DUMP_ON", "MPI_Nope:3".to_string()),
        ("CANOPY_FINALIZE_TIMEOUT_MS", "100".to_string()),
    ];
    let started = Instant::now();
    let run = mpirun(&exe, &["5", "32", "4"], &env);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(text(&run.stdout), text(&plain.stdout));
    let bad = "canopy-mpi: bad value \"MPI_Nope:3\" in CANOPY_MPI_DUMP_ON: \"MPI_Nope\" is not an MPI call the \
               wrapper intercepts";
    assert_eq!(
        stderr.matches(bad).count(),
        RANKS as usize,
        "one line per rank:\n{stderr}"
    );
    assert!(stderr.contains("dumping every 1000 ms instead"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_library_exports_the_sdk_and_a_program_that_dumps_itself_reaches_the_same_sdk() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    // The SDK's C functions and MPI's names, C and Fortran, are in the library's dynamic symbols.
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    let symbols = text(&nm.stdout);
    for name in [
        "canopy_init",
        "canopy_dump",
        "canopy_finalize",
        "canopy_timer_get",
        "canopy_activity",
        "canopy_send",
        "MPI_Init",
        "MPI_Allreduce",
        "MPI_Finalize",
        "mpi_allreduce_",
        "mpi_init_",
    ] {
        assert!(
            symbols.lines().any(|l| l.ends_with(&format!(" T {name}"))),
            "{name} is not exported by {}:\n{symbols}",
            lib.display()
        );
    }

    // A program that dumps by itself, linked with the wrapper alone (no -lcanopy): its own timer and the
    // wrapper's MPI_Barrier land in the same rounds, one per canopy_dump.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("dumps_itself.c");
    std::fs::write(
        &src,
        r#"#include <mpi.h>
#include <canopy.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    canopy_timer *step = canopy_timer_get("step");
    for (int i = 0; i < 12; i++) {
        canopy_start(step);
        MPI_Barrier(MPI_COMM_WORLD);
        canopy_stop(step);
        if (canopy_dump() != 0) printf("dump: %s\n", canopy_last_error());
    }
    MPI_Finalize();
    return 0;
}
"#,
    )
    .unwrap();
    let libdir = lib.parent().unwrap().display().to_string();
    let exe = dir.path().join("dumps_itself");
    let status = Command::new("mpicc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/c/include"))
        .arg(format!("-L{libdir}"))
        .arg(format!("-Wl,-rpath,{libdir}"))
        .arg("-lcanopy_mpi")
        .status()
        .unwrap();
    assert!(status.success(), "mpicc dumps_itself.c -lcanopy_mpi failed");
    let tree = start_socket_tree(dir.path());
    let env = [
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MPI_DUMP_ON", "app".to_string()),
    ];
    let run = mpirun(&exe, &[], &env);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "", "a dump failed");
    let store = tree.finished();
    assert_eq!(
        assert_full_coverage(&store),
        12,
        "one round per canopy_dump, none from the wrapper"
    );
    for name in ["step", "MPI_Barrier"] {
        let calls = stored_calls(&store, name);
        assert_eq!(calls.len() as u32, RANKS, "{name}: {calls:?}");
        assert!(calls.values().all(|c| *c == 12), "{name}: {calls:?}");
    }
}

/// The utilization module under the preloaded wrapper: an unmodified MPI program, dumping nothing itself, ships
/// a utilization profile every time round (100 ms here) in which its MPI calls hold a share of the bins and the
/// time in no activity (its compute) the rest, each bin's shares within the whole bin.
#[test]
fn an_unmodified_mpi_program_shows_its_mpi_share_against_its_compute_per_bin() {
    if missing().is_some() {
        return;
    }
    let lib = wrapper();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "mpicc", "stencil_mpi.c", "stencil_mpi", &[]);
    let tree = start_socket_tree(dir.path());
    let env = [
        ("LD_PRELOAD", lib.display().to_string()),
        ("CANOPY_AGENT_SOCKET", tree.socket.display().to_string()),
        ("CANOPY_MODULES", "profile,utilization".to_string()),
        ("CANOPY_DUMP_PERIOD_MS", "100".to_string()),
    ];
    let run = mpirun(&exe, &["8000", "512", "64"], &env);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let store = tree.finished();
    let (mut mpi, mut untracked, mut bins, mut profiles) = (0u64, 0u64, 0u64, 0);
    for profile in stored_utilization(&store) {
        let rank = profile.rank;
        profiles += 1;
        let mut per_bin = vec![0u64; profile.bins];
        for (bin, name, share) in profile.records {
            per_bin[bin] += u64::from(share);
            if name.starts_with("MPI_") {
                mpi += u64::from(share);
            }
        }
        for sum in per_bin {
            // Rounding each record to the nearest share can pass the whole bin by a little.
            assert!(sum <= 250 + 2, "rank {rank}: a bin sums to {sum}");
            untracked += 250u64.saturating_sub(sum);
            bins += 1;
        }
    }
    assert!(
        profiles >= 2 * RANKS as usize,
        "{profiles} utilization profiles: fewer than two time rounds per rank"
    );
    assert!(bins > 0);
    assert!(mpi > 0, "no bin holds time in an MPI call");
    assert!(untracked > 0, "no bin holds compute time");
    let mpi_share = mpi as f64 / (bins as f64 * 250.0);
    let compute_share = untracked as f64 / (bins as f64 * 250.0);
    eprintln!("{profiles} profiles, {bins} bins: MPI {mpi_share:.3}, compute {compute_share:.3}");
}
