//! The Fortran module (sdk/c/fortran/canopy.f90) end to end: the MPI stencil example built with mpif90 against
//! the libcanopy of this build, run under mpirun against a real tree, and the module's error reporting. The
//! tests are skipped, with the reason printed, only where Open MPI's mpif90 or mpirun is not installed.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::{
    Select, bin_dir, ids_named, read_rounds, reader, start_frontend, start_socket_agent, wait_socket,
};
use canopy_proto::filters::v1::Metric;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether `tool --version` runs.
fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// True when mpif90 and mpirun are installed; otherwise prints why the test is skipped.
fn have_mpi(test: &str) -> bool {
    let missing: Vec<&str> = ["mpif90", "mpirun"]
        .into_iter()
        .filter(|t| !installed(t))
        .collect();
    if missing.is_empty() {
        return true;
    }
    println!(
        "{test}: skipped: {} not installed (.ci/run installs openmpi-bin, libopenmpi-dev and gfortran)",
        missing.join(" and ")
    );
    false
}

/// Runs a compiler command in `dir`, asserting it succeeds.
fn compile(dir: &Path, cmd: &mut Command) {
    let out = cmd.current_dir(dir).output().expect("mpif90 runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles the canopy module into `dir` (canopy.o, canopy.mod) and `source` against it and the libcanopy built
/// beside the daemons, as sdk/README.md says; returns the program.
fn build_fortran(dir: &Path, source: &Path, name: &str) -> PathBuf {
    let lib = bin_dir();
    assert!(
        lib.join("libcanopy.so").is_file(),
        "libcanopy.so is not built in {}: run `cargo build --workspace` first",
        lib.display()
    );
    compile(
        dir,
        Command::new("mpif90")
            .args(["-std=f2008", "-Wall", "-Werror", "-c"])
            .arg(repo().join("sdk/c/fortran/canopy.f90")),
    );
    let exe = dir.join(name);
    compile(
        dir,
        Command::new("mpif90")
            .args(["-O2", "-Wall", "-I."])
            .arg("-o")
            .arg(&exe)
            .arg(source)
            .arg("canopy.o")
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lcanopy"),
    );
    exe
}

/// Runs `mpirun -np N exe args` with `CANOPY_AGENT_SOCKET` exported to the ranks; kills it after `timeout`.
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of another process; no runtime worker is blocked"
)]
fn mpirun(dir: &Path, np: u32, socket: &Path, exe: &Path, args: &[&str], timeout: Duration) -> Output {
    let log = |name: &str| std::fs::File::create(dir.join(name)).expect("log file");
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()])
        .arg("-x")
        .arg(format!("CANOPY_AGENT_SOCKET={}", socket.display()))
        .arg(exe)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log("mpirun.out"))
        .stderr(log("mpirun.err"))
        .spawn()
        .expect("mpirun starts");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mpirun still running after {timeout:?}:\n{}",
                std::fs::read_to_string(dir.join("mpirun.err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: std::fs::read(dir.join("mpirun.out")).unwrap_or_default(),
        stderr: std::fs::read(dir.join("mpirun.err")).unwrap_or_default(),
    }
}

#[test]
fn the_fortran_mpi_example_reports_every_timer_of_every_rank_with_exact_call_counts() {
    if !have_mpi("the_fortran_mpi_example_reports_every_timer_of_every_rank_with_exact_call_counts") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fortran(
        dir.path(),
        &repo().join("sdk/examples/fortran/stencil.f90"),
        "stencil",
    );
    let (mut fe, addr, store) = start_frontend(
        dir.path(),
        &["--streams", "stats,passthrough", "--exit-on-fin", "true"],
    );
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);

    let (ranks, iterations, n) = (2u32, 40i64, 64i64);
    let out = mpirun(
        dir.path(),
        ranks,
        &socket,
        &exe,
        &[&iterations.to_string(), &n.to_string()],
        Duration::from_secs(30),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "mpirun: {}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains(&format!(
            "stencil: {iterations} iterations of {n}x{n} on {ranks} ranks in "
        )),
        "{stdout}"
    );
    // Every dump was delivered and acknowledged: finalize had nothing to report.
    assert!(!stderr.contains("canopy_"), "{stderr}");
    let status = fe.wait_timeout(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end did not finish:\n{}",
        fe.log_text()
    );

    // Every round of both streams, each with both ranks.
    let rounds = read_rounds(&store);
    for stream in ["stats", "passthrough"] {
        let of: Vec<_> = rounds.iter().filter(|r| r.stream == stream).collect();
        assert_eq!(of.len() as i64, iterations, "{stream}: {of:?}");
        for (k, r) in of.iter().enumerate() {
            assert_eq!(r.round, k as u64, "{stream}: {of:?}");
            assert_eq!((r.covered, r.expected), (ranks, ranks), "{stream}: {r:?}");
        }
    }

    // Every timer of every rank: one call per iteration, one sample per round, the running total exact.
    let stored = reader(&store);
    let samples = stored.samples(Select::all()).unwrap();
    let stats = stored.stats(Select::all()).unwrap();
    for timer in ["iteration", "halo_exchange", "sweep", "residual"] {
        let ids = ids_named(&store, timer);
        assert!(!ids.is_empty(), "{timer} is not in the store's dictionary");
        // Per rank: the sum of its calls, the largest running total, and how many samples.
        let mut per_rank: BTreeMap<u32, (i64, i64, i64)> = BTreeMap::new();
        for s in samples.iter().filter(|s| ids.contains(&s.event_id)) {
            let row = per_rank.entry(s.rank).or_default();
            row.0 += s.calls.expect("calls") as i64;
            row.1 = row.1.max(s.calls_total.expect("calls_total") as i64);
            row.2 += 1;
        }
        let expect: BTreeMap<u32, (i64, i64, i64)> = (0..ranks)
            .map(|r| (r, (iterations, iterations, iterations)))
            .collect();
        assert_eq!(
            per_rank, expect,
            "{timer}: (calls, calls_total, samples) per rank"
        );
        let full_rounds = stats
            .iter()
            .filter(|s| ids.contains(&s.id) && s.metric == Metric::Calls && s.count == u64::from(ranks))
            .count() as i64;
        assert_eq!(full_rounds, iterations, "{timer}: stats rounds with every rank");
    }
    // Inclusive time holds exclusive: iteration encloses the three others.
    let above =
        |excl: Option<f64>, incl: Option<f64>| matches!((excl, incl), (Some(e), Some(i)) if e > i + 1e-9);
    assert!(
        !samples.iter().any(|s| above(s.excl_us, s.incl_us)),
        "exclusive time above inclusive"
    );

    // bytes_exchanged: n doubles to each neighbour per iteration; with two ranks, each has one neighbour.
    let exchanged = ids_named(&store, "bytes_exchanged");
    let last = (iterations - 1) as u64;
    let totals: BTreeMap<u32, Option<f64>> = stored
        .counters(Select::all())
        .unwrap()
        .iter()
        .filter(|c| exchanged.contains(&c.counter_id) && c.round == last)
        .map(|c| (c.rank, c.total))
        .collect();
    let want = Some((iterations * n * 8) as f64);
    let expect: BTreeMap<u32, Option<f64>> = (0..ranks).map(|r| (r, want)).collect();
    assert_eq!(totals, expect, "bytes_exchanged totals at the last round");
    // The message-send events: the profile module counts them as messages_sent and bytes_sent, one message to
    // the one neighbour per iteration.
    for (counter, per_iteration) in [("messages_sent", 1.0), ("bytes_sent", (n * 8) as f64)] {
        let ids = ids_named(&store, counter);
        let totals: BTreeMap<u32, Option<f64>> = stored
            .counters(Select::all())
            .unwrap()
            .iter()
            .filter(|c| ids.contains(&c.counter_id) && c.round == last)
            .map(|c| (c.rank, c.total))
            .collect();
        let want = Some(iterations as f64 * per_iteration);
        let expect: BTreeMap<u32, Option<f64>> = (0..ranks).map(|r| (r, want)).collect();
        assert_eq!(totals, expect, "{counter} totals at the last round");
    }
    drop(agent);
}

#[test]
fn canopy_last_error_gives_the_c_libraries_message_as_a_fortran_string() {
    if !have_mpi("canopy_last_error_gives_the_c_libraries_message_as_a_fortran_string") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("errors.f90");
    // Brackets show each string's exact extent: no NUL, no padding. The names carry trailing blanks, as fixed-length
    // Fortran strings do: the module trims them.
    std::fs::write(
        &src,
        r#"program errors
    use canopy
    use, intrinsic :: iso_fortran_env, only: int64
    implicit none
    integer :: ierr, a, b
    character(len=16) :: padded
    character(len=:), allocatable :: msg
    call canopy_dump(ierr)
    print '(a, i0, a)', 'dump before init: ', ierr, ' [' // canopy_last_error() // ']'
    call canopy_init('errors', 3, 2, ierr)
    print '(a, i0, a)', 'bad rank: ', ierr, ' [' // canopy_last_error() // ']'
    call canopy_init('errors', ierr=ierr)
    print '(a, i0)', 'init: ', ierr
    call canopy_init('errors', 0, 1, ierr)
    msg = canopy_last_error()
    print '(a, i0, a, i0)', 'init again: ', ierr, ' [' // msg // '] ', len(msg)
    call canopy_init('errors')
    print '(a)', 'init again without ierr: [' // canopy_last_error() // ']'
    padded = 'solve'
    a = canopy_activity(padded)
    b = canopy_activity('solve')
    print '(a, l1, a, l1)', 'activity: ', a >= 0, ' trimmed: ', a == b
    print '(a, l1)', 'blank activity refused: ', canopy_activity('   ') < 0
    call canopy_step_start(padded, 3_int64, ierr)
    print '(a, i0)', 'step start: ', ierr
    call canopy_step_stop(padded, 3_int64)
    call canopy_step_stop('   ', 3_int64, ierr)
    print '(a, i0, a)', 'blank step key: ', ierr, ' [' // canopy_last_error() // ']'
    call canopy_finalize(ierr)
    print '(a, i0)', 'finalize: ', ierr
    call canopy_finalize(ierr)
    print '(a, i0, a)', 'finalize again: ', ierr, ' [' // canopy_last_error() // ']'
end program errors
"#,
    )
    .unwrap();
    let exe = build_fortran(dir.path(), &src, "errors");
    let out = Command::new(&exe)
        .env("CANOPY_AGENT_SOCKET", dir.path().join("none.sock"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let msg = "canopy is already initialized";
    assert_eq!(
        lines,
        [
            "dump before init: -2 [canopy is not initialized (call canopy_init first)]",
            "bad rank: -1 [rank 3 is not below the size 2]",
            "init: 0",
            &format!("init again: -2 [{msg}] {}", msg.len()),
            &format!("init again without ierr: [{msg}]"),
            "activity: T trimmed: T",
            "blank activity refused: T",
            "step start: 0",
            "blank step key: -1 [a step mark needs a key]",
            "finalize: 0",
            "finalize again: -2 [canopy was finalized]",
        ],
        "{text}"
    );
}

#[test]
fn the_installed_sdk_gives_the_module_source_to_compile_with_pkg_config() {
    if !have_mpi("the_installed_sdk_gives_the_module_source_to_compile_with_pkg_config") {
        return;
    }
    if !installed("pkg-config") {
        println!(
            "the_installed_sdk_gives_the_module_source_to_compile_with_pkg_config: skipped: pkg-config not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let profile = bin_dir().file_name().unwrap().to_string_lossy().into_owned();
    let status = Command::new(repo().join("deploy/install.sh"))
        .arg("--prefix")
        .arg(root.join("usr"))
        .arg("--unitdir")
        .arg(root.join("units"))
        .arg("--confdir")
        .arg(root.join("etc"))
        .args(["--profile", &profile])
        .env("CARGO_TARGET_DIR", bin_dir().parent().unwrap())
        .stdout(Stdio::null())
        .status()
        .expect("deploy/install.sh runs");
    assert!(status.success(), "install.sh failed");
    // The commands sdk/README.md gives, with the pkg-config file of this installation.
    let pkg_config = |arg: &str| {
        let out = Command::new("pkg-config")
            .args([arg, "canopy"])
            .env("PKG_CONFIG_PATH", root.join("usr/lib/pkgconfig"))
            .output()
            .unwrap();
        assert!(out.status.success(), "pkg-config {arg} canopy failed");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let includedir = PathBuf::from(pkg_config("--variable=includedir"));
    assert_eq!(includedir, root.join("usr/include"));
    let module = includedir.join("canopy.f90");
    assert_eq!(
        std::fs::read(&module).unwrap(),
        std::fs::read(repo().join("sdk/c/fortran/canopy.f90")).unwrap()
    );
    compile(dir.path(), Command::new("mpif90").arg("-c").arg(&module));
    std::fs::write(
        dir.path().join("app.f90"),
        "program app\n    use canopy\n    implicit none\n    integer :: ierr\n    call canopy_init('app', ierr=ierr)\n    \
         print '(a, i0)', 'init: ', ierr\n    call canopy_finalize(ierr)\n    print '(a, i0)', 'finalize: ', ierr\nend program app\n",
    )
    .unwrap();
    let libdir = root.join("usr/lib");
    compile(
        dir.path(),
        Command::new("mpif90")
            .args(["-o", "app", "app.f90", "canopy.o"])
            .args(pkg_config("--libs").split_whitespace())
            .arg(format!("-Wl,-rpath,{}", libdir.display())),
    );
    let out = Command::new(dir.path().join("app"))
        .env("CANOPY_AGENT_SOCKET", dir.path().join("none.sock"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text, "init: 0\nfinalize: 0\n");
}
