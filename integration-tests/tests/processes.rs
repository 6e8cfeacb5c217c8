//! End-to-end tests that run the real binaries: signals, exit codes, config errors, and `canopy up`.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, Select, Table, bin_dir, read_rounds, reader, start_frontend, wait_for};
use canopy_proto::v1::{MissingReason, NodeKind, NodeState};
use nix::sys::signal::Signal;

fn start_relay(dir: &Path, id: &str, parent: &str) -> (Proc, String) {
    canopy_integration_tests::start_relay(dir, id, parent, "127.0.0.1:0")
}

fn start_agent(dir: &Path, id: &str, parent: &str, ranks: u32, offset: u32, rounds: u64) -> Proc {
    let (ranks, offset, rounds) = (ranks.to_string(), offset.to_string(), rounds.to_string());
    let args = [
        "--node-id",
        id,
        "--parent",
        parent,
        "--socket",
        "none",
        "--simulate-ranks",
        &ranks,
        "--rank-offset",
        &offset,
        "--rounds",
        &rounds,
        "--simulate-period-ms",
        "20",
    ];
    Proc::start(dir, "canopy-agent", id, &args)
}

fn rounds_in(store: &Path) -> u64 {
    if store.exists() {
        reader(store).count(Table::Rounds).unwrap()
    } else {
        0
    }
}

fn node_state(store: &Path, id: &str) -> Option<NodeState> {
    reader(store).node(id).unwrap().map(|n| n.state)
}

fn node_parent(store: &Path, id: &str) -> Option<String> {
    reader(store).node(id).unwrap().and_then(|n| n.parent)
}

fn nodes_of(store: &Path, kind: NodeKind) -> usize {
    reader(store)
        .nodes()
        .unwrap()
        .iter()
        .filter(|n| n.kind == kind)
        .count()
}

#[test]
fn an_agent_killed_with_sigkill_is_marked_lost_and_the_tree_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) =
        start_frontend(dir.path(), &["--expect-ranks", "64", "--exit-on-fin", "true"]);
    let (_r0, r0) = start_relay(dir.path(), "relay:0", &fe_addr);
    let (_r1, r1) = start_relay(dir.path(), "relay:1", &fe_addr);
    let _a0 = start_agent(dir.path(), "agent:0", &r0, 16, 0, 80);
    let a1 = start_agent(dir.path(), "agent:1", &r0, 16, 16, 80);
    let _a2 = start_agent(dir.path(), "agent:2", &r1, 16, 32, 80);
    let _a3 = start_agent(dir.path(), "agent:3", &r1, 16, 48, 80);
    wait_for("10 rounds", Duration::from_secs(30), || rounds_in(&store) >= 10);
    a1.signal(Signal::SIGKILL);
    let status = fe
        .wait_timeout(Duration::from_secs(30))
        .expect("front-end finishes after the others");
    assert!(status.success(), "{}", fe.log_text());
    let rounds = read_rounds(&store);
    assert_eq!(rounds.len(), 80);
    let after: Vec<_> = rounds.iter().skip_while(|r| r.covered == 64).collect();
    assert!(after.len() >= 30, "rounds after the kill: {}", after.len());
    for r in after {
        assert_eq!(
            (r.covered, r.expected, r.missing.get(MissingReason::Unreachable)),
            (48, 64, 16),
            "round {}: {r:?}",
            r.round
        );
        assert_eq!(r.missing_reason.as_deref(), Some("unreachable: 16 (agent:1=16)"));
    }
    assert_eq!(node_state(&store, "agent:1"), Some(NodeState::Lost));
    assert_eq!(node_parent(&store, "agent:1").as_deref(), Some("relay:0"));
}

#[test]
fn sigterm_to_the_front_end_drains_and_exits_zero_within_five_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) =
        start_frontend(dir.path(), &["--expect-ranks", "16", "--log-format", "json"]);
    let (_relay, relay_addr) = start_relay(dir.path(), "relay:0", &fe_addr);
    let mut a0 = start_agent(dir.path(), "agent:0", &relay_addr, 8, 0, 0);
    let mut a1 = start_agent(dir.path(), "agent:1", &relay_addr, 8, 8, 0);
    wait_for("10 rounds", Duration::from_secs(30), || rounds_in(&store) >= 10);
    fe.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let status = fe
        .wait_timeout(Duration::from_secs(5))
        .expect("front-end exits within 5 s");
    assert!(status.success(), "exit {status}: {}", fe.log_text());
    assert!(sent.elapsed() < Duration::from_secs(5));
    let rounds = read_rounds(&store);
    assert!(rounds.len() >= 10);
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(r.round, i as u64, "rounds are contiguous");
        if i + 1 < rounds.len() {
            assert_eq!((r.covered, r.expected), (16, 16), "round {}: {r:?}", r.round);
        } else {
            // One agent may have dumped a last round after the other had stopped: that agent's ranks are
            // stored, the other's are counted as stopped.
            assert!(
                r.covered == 16 || r.missing_reason.as_deref() == Some("stopped: 8"),
                "{r:?}"
            );
        }
    }
    // The agents finished on the drain and left after the root's fin-ack.
    assert!(
        a0.wait_timeout(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
    assert!(
        a1.wait_timeout(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
    // --log-format json: every log line is one JSON object.
    let log = fe.log_text();
    assert!(log.lines().count() > 3);
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v.get("level").is_some() && v.get("timestamp").is_some(), "{line}");
    }
}

/// A log filter that does not parse is said once, in the log, and the daemon logs at its default level; JSON
/// lines name the node and its role.
#[test]
fn a_bad_log_filter_is_said_once_and_json_lines_name_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, _store) = start_frontend(dir.path(), &["--expect-ranks", "4"]);
    let ready = dir.path().join("relay.ready");
    let mut relay = Proc::start_with_env(
        dir.path(),
        "canopy-relay",
        "relay",
        &[
            "--node-id",
            "relay-7",
            "--parent",
            &fe_addr,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            ready.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[("CANOPY_LOG", "info,[nope")],
    );
    canopy_integration_tests::wait_ready_file(&ready, &mut relay);
    wait_for("the relay's log", Duration::from_secs(10), || {
        relay.log_text().contains("attached")
    });
    let log = relay.log_text();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("is not a log filter"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("CANOPY_LOG=\\\"info,[nope\\\""), "{log}");
    // Every line is a JSON object naming the node, once it has its id.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 2, "{log}");
    for l in &lines {
        assert_eq!(
            (l["role"].as_str(), l["node"].as_str()),
            (Some("relay"), Some("relay-7")),
            "{l}"
        );
        assert!(l["level"].is_string() && l["message"].is_string(), "{l}");
    }
}

#[test]
fn a_config_value_of_the_wrong_type_exits_64_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("canopy.toml");
    std::fs::write(
        &config,
        "[agent]\nparent = \"127.0.0.1:7400\"\nsimulate_ranks = \"lots\"\n",
    )
    .unwrap();
    let out = Command::new(bin_dir().join("canopy-agent"))
        .arg("validate")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`agent.simulate_ranks`"), "{err}");
    assert!(err.contains(&format!("TOML file {}", config.display())), "{err}");
    assert!(err.contains("expected u32"), "{err}");

    // The same key from the environment names the variable; a valid file passes.
    std::fs::write(&config, "[agent]\nparent = \"127.0.0.1:7400\"\ninsecure = true\n").unwrap();
    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["validate", "--config"])
        .arg(&config)
        .env("CANOPY_AGENT_SIMULATE_PERIOD_MS", "-5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CANOPY_AGENT_SIMULATE_PERIOD_MS"), "{err}");
    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["validate", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Sizes that would exhaust memory are refused at validate, with the key and the limit.
    for (env, value, says) in [
        (
            "CANOPY_AGENT_SIMULATE_RANKS",
            "4294967295",
            "more than any node may answer for (16777216)",
        ),
        (
            "CANOPY_AGENT_SIMULATE_EVENTS",
            "100000",
            "times simulate_ranks is 6400000000, more than 16777216",
        ),
    ] {
        let out = Command::new(bin_dir().join("canopy-agent"))
            .args(["validate", "--config"])
            .arg(&config)
            .env("CANOPY_AGENT_SIMULATE_RANKS", "64000")
            .env(env, value)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{env}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }

    // A semantic error from a flag names the flag; an unknown stream filter names the filter.
    let out = Command::new(bin_dir().join("canopy-frontend"))
        .args(["validate", "--streams", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--streams.0") && err.contains("unknown filter \"nope\""),
        "{err}"
    );
}

#[test]
fn a_malformed_mrnet_topology_file_is_reported_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tree.top");
    std::fs::write(
        &file,
        "# a tree\nfe:0 => r:0 r:1 ;\nr:0 => a:0 a:1\nr:1 => a:2 ;\n",
    )
    .unwrap();
    let out = canopy_integration_tests::canopy_command()
        .args(["topology", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("topology line 4, column 1"), "{err}");
    // The fixed file prints every node's parent.
    std::fs::write(
        &file,
        "# a tree\nfe:0 => r:0 r:1 ;\nr:0 => a:0 a:1 ;\nr:1 => a:2 ;\n",
    )
    .unwrap();
    let out = canopy_integration_tests::canopy_command()
        .args(["topology", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "fe:0 <= -\nr:0 <= fe:0\nr:1 <= fe:0\na:0 <= r:0\na:1 <= r:0\na:2 <= r:1\n"
    );
}

#[test]
fn canopy_run_passes_the_programs_exit_status_on_and_leaves_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--insecure", "--no-report", "--out"])
        .arg(&out_dir)
        .args(["--", "sh", "-c", "echo ranks at $CANOPY_AGENT_SOCKET; exit 3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("ranks at /"),
        "the program is given the agent's socket: {stdout}"
    );
    assert!(stdout.contains("sh exited with 3; store"), "{stdout}");
    // The daemons finished with the program: their logs say they stopped.
    let fe_log = std::fs::read_to_string(out_dir.join("logs/frontend.log")).unwrap();
    assert!(fe_log.contains("front-end stopped"), "{fe_log}");
    // A launcher that does not exist is named.
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--insecure", "--out"])
        .arg(&out_dir)
        .args(["--", "no-such-launcher-here"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot start no-such-launcher-here"), "{stderr}");
    // srun over several nodes of an allocation is handed to canopy-run, with srun's own arguments apart (here it
    // finds no node list, and says so).
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--out"])
        .arg(&out_dir)
        .args(["--", "srun", "-n", "4", "--mpi=pmix", "sh", "-c", "true"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NUM_NODES", "2")
        .env_remove("SLURM_JOB_NODELIST")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("canopy run: srun over 2 nodes: "), "{stdout}");
    assert!(
        stderr.contains("canopy-run: not inside a Slurm allocation"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}

#[test]
fn canopy_run_terminated_passes_it_to_the_program_and_finishes_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut run = canopy_integration_tests::canopy_command()
        .args(["run", "--insecure", "--no-report", "--out"])
        .arg(&out_dir)
        .args(["--", "sleep", "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The watch line is printed as the program starts.
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(run.stdout.take().unwrap()));
    assert!(
        lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains("watch it: canopy watch")),
        "canopy run ended before its program started"
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let status = run.wait().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    // The program got the termination: its status is canopy run's own.
    assert_eq!(status.code(), Some(128 + 15));
    let fe_log = std::fs::read_to_string(out_dir.join("logs/frontend.log")).unwrap();
    assert!(fe_log.contains("front-end stopped"), "{fe_log}");
}

#[test]
fn canopy_run_refuses_a_program_of_another_mpi_family_than_its_wrapper_naming_both() {
    let wrapper = bin_dir().join("libcanopy_mpi.so");
    let built_for = Command::new("ldd").arg(&wrapper).output().unwrap();
    if !String::from_utf8_lossy(&built_for.stdout).contains("libmpi.so.40") {
        eprintln!("skipped: the MPI wrapper here is not built for Open MPI (libmpi.so.40)");
        return;
    }
    // A program linked with a library that has MPICH's soname.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("mpi.c"), "int MPI_Init(int *c, char ***v) { return 0; }\n").unwrap();
    std::fs::write(
        d.join("app.c"),
        "int MPI_Init(int *, char ***);\nint main(void) { return MPI_Init(0, 0); }\n",
    )
    .unwrap();
    let cc = |args: &[&str]| {
        let ok = Command::new("cc").args(args).current_dir(d).status().unwrap();
        assert!(ok.success(), "cc {args:?}");
    };
    cc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libmpi.so.12",
        "-o",
        "libmpi.so.12",
        "mpi.c",
    ]);
    cc(&["-o", "app", "app.c", "./libmpi.so.12", "-Wl,-rpath,$ORIGIN"]);
    // Given Open MPI's wrapper (canopy run would pick the MPICH one where it is built).
    let out = canopy_integration_tests::canopy_command()
        .args(["run", "--insecure", "--mpi-lib"])
        .arg(&wrapper)
        .arg("--out")
        .arg(d.join("out"))
        .arg("--")
        .arg(d.join("app"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("is linked with MPICH (libmpi.so.12")
            && stderr.contains("was built for Open MPI (libmpi.so.40"),
        "{stderr}"
    );
}

#[test]
fn canopy_up_runs_a_whole_tree_to_full_coverage() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args([
            "up",
            "--ranks",
            "64",
            "--agents",
            "4",
            "--fanout",
            "2",
            "--rounds",
            "50",
            "--period-ms",
            "20",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("50 rounds stored (1 streams), 50 at full coverage, 100.0% of rank-rounds covered"),
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.contains("coverage    64/64")).count(),
        50,
        "{stdout}"
    );
    // A clean run leaves its store whole in one file: no write-ahead log or shared memory file beside it.
    let mut left: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".sqlite"))
        .collect();
    left.sort();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left[0] == "latest.sqlite" && left[1].starts_with("run-") && left[1].ends_with(".sqlite"),
        "{left:?}"
    );
    let store = out_dir.join("latest.sqlite");
    // The run was ended: its per-rank series are indexed.
    let conn =
        rusqlite::Connection::open_with_flags(&store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let (ended, indexed): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM meta WHERE key = 'ended_unix_ns'),
                    (SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'samples_by_rank')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((ended, indexed), (1, 1));
    drop(conn);
    let rounds = read_rounds(&store);
    assert_eq!(rounds.len(), 50);
    assert!(rounds.iter().all(|r| r.covered == 64 && r.expected == 64));
    assert_eq!(nodes_of(&store, NodeKind::Relay), 2);
    // Every daemon's log: plain text, each line naming the node that wrote it.
    let mut files = 0;
    for entry in std::fs::read_dir(out_dir.join("logs")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().replace(".log", "");
        let text = std::fs::read_to_string(entry.path()).unwrap();
        assert!(!text.contains('\x1b'), "{name}: escape codes in its log");
        let (role, id) = match name.as_str() {
            "frontend" => ("frontend", "frontend:0".to_string()),
            n => (n.split('-').next().unwrap(), n.replacen('-', ":", 1)),
        };
        for line in text.lines().filter(|l| !l.is_empty()) {
            assert!(line.starts_with(&format!("[{role} {id}] ")), "{name}: {line}");
        }
        files += 1;
    }
    assert_eq!(files, 7, "a log per daemon");
}

#[test]
fn ctrl_c_stops_canopy_up_cleanly() {
    stops_canopy_up_cleanly(Signal::SIGINT, "interrupted");
}

/// SIGTERM (kill, timeout, a batch system) stops it as Ctrl-C does, and leaves no daemon running.
#[test]
fn sigterm_stops_canopy_up_cleanly_and_leaves_no_daemon() {
    stops_canopy_up_cleanly(Signal::SIGTERM, "terminated");
}

fn stops_canopy_up_cleanly(sig: Signal, word: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut up = Proc::start(
        dir.path(),
        "canopy",
        "up",
        &[
            "up",
            "--ranks",
            "8",
            "--agents",
            "2",
            "--rounds",
            "0",
            "--period-ms",
            "20",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let store = out_dir.join("latest.sqlite");
    wait_for("rounds", Duration::from_secs(30), || rounds_in(&store) >= 5);
    up.signal(sig);
    let status = up.wait_timeout(Duration::from_secs(15)).expect("canopy up stops");
    let log = up.log_text();
    assert!(status.success(), "{log}");
    assert!(
        log.contains(&format!("canopy up: {word}, draining the tree")),
        "{log}"
    );
    assert!(log.contains("(interrupted)"), "{log}");
    let rounds = read_rounds(&store);
    for (i, r) in rounds.iter().enumerate() {
        if i + 1 < rounds.len() {
            assert_eq!((r.covered, r.expected), (8, 8), "{rounds:#?}");
        } else {
            // As on SIGTERM: one agent may dump a last round after the other stopped; that round stores the
            // first agent's ranks and counts the other's as stopped.
            assert!(
                r.covered == 8 || r.missing_reason.as_deref() == Some("stopped: 4"),
                "{r:?}"
            );
        }
    }
    // No daemon is left behind: no process still writes its output into the run's log directory.
    let logs = out_dir.join("logs");
    let leftover: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let proc_dir = e.ok()?.path();
            let out = std::fs::read_link(proc_dir.join("fd/2")).ok()?;
            out.starts_with(&logs)
                .then(|| format!("{}: {}", proc_dir.display(), out.display()))
        })
        .collect();
    assert!(leftover.is_empty(), "processes left: {leftover:?}");
}

/// `--quiet` hides the rounds, not where the tree is; `--keep` holds the tree up after the last round, its
/// front-end serving, until Ctrl-C.
#[test]
fn canopy_up_quiet_still_says_where_the_tree_is_and_keep_holds_it_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut up = Proc::start(
        dir.path(),
        "canopy",
        "up",
        &[
            "up",
            "--ranks",
            "8",
            "--agents",
            "2",
            "--rounds",
            "10",
            "--period-ms",
            "20",
            "--quiet",
            "--keep",
            "--insecure",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let store = out_dir.join("latest.sqlite");
    wait_for("every round", Duration::from_secs(30), || rounds_in(&store) >= 10);
    let log = up.log_text();
    let addr = log
        .lines()
        .find_map(|l| l.strip_prefix("canopy up: front-end "))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no front-end address in\n{log}"))
        .to_string();
    assert!(log.contains(&format!("grpcurl -plaintext {addr} list")), "{log}");
    assert!(!log.contains(" round "), "--quiet shows no round: {log}");
    // Well after the last round, the tree is still up and its front-end serves: the absence of an exit has no
    // event to wait on, so this waits a while.
    #[allow(
        clippy::disallowed_methods,
        reason = "a synchronous test checking that nothing happens for a while"
    )]
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        up.child.try_wait().unwrap().is_none(),
        "canopy up left before Ctrl-C:\n{}",
        up.log_text()
    );
    assert!(
        std::net::TcpStream::connect(&addr).is_ok(),
        "the front-end at {addr} no longer serves"
    );
    // A client that attaches after the last round sees the run's latest results.
    let watch = |how: &str| {
        let out = std::process::Command::new(bin_dir().join("canopy"))
            .args(["watch", "--insecure", "--frontend", &addr, how, "--updates", "1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let watched = watch("--json");
    let last: serde_json::Value =
        serde_json::from_str(watched.trim()).unwrap_or_else(|e| panic!("{e}: {watched}"));
    assert_eq!(last["round"], "9", "{last}");
    assert_eq!(last["replayed"], true, "{last}");
    let plain = watch("--plain");
    assert!(plain.contains("round 9"), "{plain}");
    up.signal(Signal::SIGINT);
    let status = up.wait_timeout(Duration::from_secs(15)).expect("canopy up stops");
    let log = up.log_text();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("canopy up: 10 rounds stored (1 streams), 10 at full coverage"),
        "{log}"
    );
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "the front-end still serves after Ctrl-C"
    );
}

/// Planted ranks are what a stats stream finds: the slow rank holds every compute event's maximum in every
/// round, a fast group its minimum; a plant that cannot be read stops `canopy up` before any daemon starts.
#[test]
fn canopy_up_plants_slow_and_fast_ranks_that_the_stats_find() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let run = |plants: &[&str]| {
        let mut args = vec![
            "up",
            "--ranks",
            "16",
            "--agents",
            "2",
            "--rounds",
            "8",
            "--period-ms",
            "20",
            "--quiet",
            "--insecure",
        ];
        for p in plants {
            args.extend(["--plant", p]);
        }
        args.extend(["--out", out_dir.to_str().unwrap()]);
        Command::new(bin_dir().join("canopy"))
            .args(&args)
            .output()
            .unwrap()
    };
    let out = run(&["5:4", "10-11:0.3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let store = reader(&out_dir.join("latest.sqlite"));
    let names: std::collections::HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let compute = ["hydro_sweep", "riemann", "eos", "update_solution"];
    let rows: Vec<_> = store
        .stats(Select::all())
        .unwrap()
        .into_iter()
        .filter(|s| s.metric == canopy_proto::filters::v1::Metric::Exclusive && s.class_id.is_none())
        .filter(|s| names.get(&s.id).is_some_and(|n| compute.contains(&n.as_str())))
        .collect();
    assert_eq!(rows.len(), 8 * compute.len(), "{rows:#?}");
    for r in &rows {
        let event = &names[&r.id];
        assert_eq!(r.max_rank, Some(5), "{event} round {}: {r:?}", r.round);
        assert!(
            matches!(r.min_rank, Some(10 | 11)),
            "{event} round {}: {r:?}",
            r.round
        );
    }

    let out = run(&["5:4", "7:-1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--plant: bad plant \"7:-1\": the factor must be above 0 and at most 100"),
        "{err}"
    );
}

/// A filter that is not there, or its bad parameters, stop `canopy up` before any daemon starts, with the flag
/// the user gave and the filters there are.
#[test]
fn canopy_up_refuses_an_unknown_filter_naming_the_flag_and_what_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let up = |extra: &[&str]| {
        let out = Command::new(bin_dir().join("canopy"))
            .args([
                "up",
                "--ranks",
                "4",
                "--agents",
                "1",
                "--rounds",
                "2",
                "--insecure",
                "--out",
            ])
            .arg(&out_dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = up(&["--filters", "stats,histogramm"]);
    assert!(
        err.contains("--filters: unknown filter \"histogramm\" (did you mean \"histogram\"? available: ")
            && err.contains("kmeans")
            && !err.contains("--streams"),
        "{err}"
    );
    // The build's test plugin is not among them.
    assert!(!err.contains("faulty"), "{err}");
    let err = up(&[
        "--filters",
        "stats",
        "--filter-params",
        r#"stats={"quantiles": 7}"#,
    ]);
    assert!(
        err.contains("--filter-params: filter stats: bad parameters: quantiles must be a list"),
        "{err}"
    );
    // Nothing ran: no store.
    assert!(!out_dir.join("latest.sqlite").exists());
}

#[test]
fn the_example_site_config_validates_for_every_daemon() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/canopy.toml");
    for daemon in ["canopy-frontend", "canopy-relay", "canopy-agent"] {
        let out = Command::new(bin_dir().join(daemon))
            .arg("validate")
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{daemon}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sigterm_to_an_agent_finishes_its_ranks_and_it_exits_while_the_tree_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--expect-ranks", "16"]);
    let mut a0 = start_agent(dir.path(), "agent:0", &fe_addr, 8, 0, 0);
    let _a1 = start_agent(dir.path(), "agent:1", &fe_addr, 8, 8, 0);
    wait_for("5 rounds", Duration::from_secs(30), || rounds_in(&store) >= 5);
    a0.signal(Signal::SIGTERM);
    let status = a0
        .wait_timeout(Duration::from_secs(5))
        .expect("the agent exits on its own");
    assert!(status.success(), "{}", a0.log_text());
    let finished_at = rounds_in(&store);
    wait_for("more rounds", Duration::from_secs(30), || {
        rounds_in(&store) >= finished_at + 5
    });
    assert_eq!(node_state(&store, "agent:0"), Some(NodeState::Finished));
    let rounds = read_rounds(&store);
    let last = rounds.last().unwrap();
    assert_eq!((last.covered, last.expected), (8, 16), "{last:?}");
    assert_eq!(last.missing_reason.as_deref(), Some("stopped: 8"));
    fe.signal(Signal::SIGTERM);
    assert!(
        fe.wait_timeout(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
}

#[test]
fn canopy_up_lays_a_tree_from_an_mrnet_topology_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tree.top");
    std::fs::write(
        &file,
        "# front-end, two relays, three agents\nfe:0 => r:0 r:1 ;\nr:0 => a:0 a:1 ;\nr:1 => a:2 ;\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args([
            "up",
            "--ranks",
            "12",
            "--rounds",
            "10",
            "--period-ms",
            "20",
            "--quiet",
            "--topology",
        ])
        .arg(&file)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("10 rounds stored (1 streams), 10 at full coverage"),
        "{stdout}"
    );
    let store = out_dir.join("latest.sqlite");
    assert_eq!(node_parent(&store, "a:2").as_deref(), Some("r:1"));
    assert_eq!(node_parent(&store, "r:0").as_deref(), Some("fe:0"));
    assert_eq!(nodes_of(&store, NodeKind::Agent), 3);
}

#[test]
fn canopy_up_runs_stats_histogram_and_classify_at_once_over_the_same_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = canopy_integration_tests::canopy_command()
        .args([
            "up",
            "--ranks",
            "32",
            "--agents",
            "4",
            "--fanout",
            "2",
            "--rounds",
            "20",
            "--period-ms",
            "20",
        ])
        .args(["--filters", "stats,histogram,classify", "--quiet", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("60 rounds stored (3 streams), 60 at full coverage"),
        "{stdout}"
    );
    let store = out_dir.join("latest.sqlite");
    let stored = reader(&store);
    for (table, stream) in [("stats", 1), ("histograms", 2), ("classes", 3)] {
        let of = Select::all().stream(stream);
        let rounds: std::collections::BTreeSet<u64> = match table {
            "stats" => stored.stats(of).unwrap().iter().map(|r| r.round).collect(),
            "histograms" => stored.histograms(of).unwrap().iter().map(|r| r.round).collect(),
            _ => stored.classes(of).unwrap().iter().map(|r| r.round).collect(),
        };
        assert_eq!(rounds.len(), 20, "{table}");
    }
}

use canopy_integration_tests::canopy_cli as canopy;

#[test]
fn the_canopy_client_commands_drive_a_running_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--expect-ranks", "8"]);
    let (_relay, relay_addr) = start_relay(dir.path(), "relay:0", &fe_addr);
    let _a0 = start_agent(dir.path(), "agent:0", &relay_addr, 4, 0, 0);
    let _a1 = start_agent(dir.path(), "agent:1", &relay_addr, 4, 4, 0);
    wait_for("rounds", Duration::from_secs(30), || rounds_in(&store) >= 3);
    let target = ["--frontend", fe_addr.as_str()];

    let opened = canopy(
        &[
            &[
                "streams",
                "open",
                "histogram",
                "--params",
                r#"{"bins": 4}"#,
                "--json",
            ][..],
            &target,
        ]
        .concat(),
    );
    let opened: serde_json::Value = serde_json::from_str(opened.trim()).unwrap();
    assert_eq!(opened["filter"], "histogram");
    assert_eq!(opened["state"], "open");
    let id = opened["streamId"].as_u64().unwrap().to_string();

    let listed = canopy(&[&["streams", "list", "--json"][..], &target].concat());
    let listed: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(listed["streams"].as_array().unwrap().len(), 2, "{listed}");
    let text = canopy(&[&["streams", "list"][..], &target].concat());
    assert!(text.contains("histogram") && text.contains("stats"), "{text}");

    let tree = canopy(&[&["topology"][..], &target].concat());
    assert!(tree.contains("front-end frontend [attached]"), "{tree}");
    assert!(tree.contains("  relay relay:0 [attached] 8 ranks"), "{tree}");
    assert!(tree.contains("    agent agent:1 [attached] 4 ranks"), "{tree}");
    let json = canopy(&[&["topology", "--json"][..], &target].concat());
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["nodes"].as_array().unwrap().len(), 4, "{json}");

    // Three updates of the histogram stream, as JSON lines.
    let watched = canopy(
        &[
            &["watch", "--stream", "histogram", "--updates", "3", "--json"][..],
            &target,
        ]
        .concat(),
    );
    let lines: Vec<serde_json::Value> = watched
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines
            .iter()
            .all(|l| l["result"]["@type"] == "type.googleapis.com/canopy.filters.v1.HistogramResult")
    );
    assert!(lines.iter().all(|l| l["result"]["bins"] == 4));

    assert_eq!(
        canopy(&[&["ctl", "stop"][..], &target].concat()).trim(),
        "stop: applied"
    );
    assert_eq!(
        canopy(&[&["ctl", "start"][..], &target].concat()).trim(),
        "start: applied"
    );
    let closed = canopy(&[&["streams", "close", id.as_str()][..], &target].concat());
    assert!(closed.contains("closed"), "{closed}");

    // A front-end that is not there gets a clear error.
    let out = canopy_integration_tests::canopy_command()
        .args(["streams", "list", "--frontend", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the front-end at 127.0.0.1:1"));
    fe.signal(Signal::SIGTERM);
    assert!(
        fe.wait_timeout(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
}

#[test]
fn canopy_watch_draws_a_live_table_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(
        dir.path(),
        &["--expect-ranks", "8", "--streams", "stats,classify"],
    );
    let _a0 = start_agent(dir.path(), "agent:0", &fe_addr, 4, 0, 0);
    let _a1 = start_agent(dir.path(), "agent:1", &fe_addr, 4, 4, 0);
    // Both streams have stored rounds, so the watch starts from them: classify's three phases may lag stats' one
    // by more than the watch's six updates on a loaded machine.
    wait_for("rounds of both streams", Duration::from_secs(30), || {
        store.exists()
            && reader(&store)
                .streams()
                .unwrap()
                .iter()
                .filter(|s| s.last_round.is_some_and(|r| r >= 2))
                .count()
                == 2
    });
    // `script` gives the command a pseudo-terminal (of 120x40, set with stty) and keeps what it wrote.
    let screen = dir.path().join("screen");
    let cmd = format!(
        "stty cols 120 rows 40; {} watch --frontend {fe_addr} --updates 6",
        bin_dir().join("canopy").display()
    );
    let status = Command::new("script")
        .env("CANOPY_TLS_DIR", &canopy_integration_tests::credentials().dir)
        .args(["-q", "-e", "-c", &cmd])
        .arg(&screen)
        .stdin(std::process::Stdio::null())
        .status()
        .expect("script runs");
    assert!(status.success());
    let bytes = std::fs::read(&screen).unwrap();
    let at = |seq: &[u8]| bytes.windows(seq.len()).position(|w| w == seq);
    let last = |seq: &[u8]| bytes.windows(seq.len()).rposition(|w| w == seq);
    // The full-screen view: the alternate screen taken, then given back when the watch ends.
    let (Some(entered), Some(left)) = (at(b"\x1b[?1049h"), last(b"\x1b[?1049l")) else {
        panic!("no alternate screen:\n{:?}", String::from_utf8_lossy(&bytes));
    };
    assert!(entered < left, "{:?}", String::from_utf8_lossy(&bytes));
    // What the alternate screen showed just before the watch gave it back, through a terminal emulator: the
    // drawing moves the cursor between the cells that change, so the raw bytes do not hold whole lines.
    let mut terminal = vt100::Parser::new(40, 120, 0);
    terminal.process(&bytes[..left]);
    let drawn = terminal.screen().contents();
    // The stream line names both streams, and the stats table names its events.
    assert!(
        drawn.contains("stats [stats]") && drawn.contains("classify [classify]"),
        "{drawn}"
    );
    assert!(
        drawn.contains("event (exclusive us)") && drawn.contains("MPI_Allreduce"),
        "{drawn}"
    );
    fe.signal(Signal::SIGTERM);
    assert!(
        fe.wait_timeout(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
}

#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "the test watches another process for two seconds; no runtime worker is blocked"
)]
fn out_of_descriptors_the_frontend_backs_off_logs_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, _store) = canopy_integration_tests::start_frontend_with(dir.path(), &[], Some(64));
    // More connections than the front-end has descriptors: the kernel queues the rest, and every accept fails.
    let flood: Vec<std::net::TcpStream> = (0..120)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    assert!(flood.len() > 64, "only {} connections", flood.len());
    std::thread::sleep(Duration::from_millis(500));
    let before = fe.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let spent = fe.cpu_time() - before;
    // Retrying at once would keep a core busy all along.
    assert!(
        spent < Duration::from_millis(500),
        "the front-end used {spent:?} of CPU in 2 s"
    );
    let log = std::fs::read_to_string(&fe.log).unwrap();
    let lines = log.matches("accepting a connection failed").count();
    assert!(
        (1..=4).contains(&lines),
        "{lines} log lines about failed accepts:\n{log}"
    );
    assert!(log.contains("Too many open files"), "{log}");
    // Once the flood ends, the API answers again.
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = canopy_integration_tests::canopy_command()
            .args(["streams", "list", "--frontend", &addr])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(20)).is_some());
}

/// The pid of a child of `parent` whose command line holds `program`.
fn child_pid(parent: u32, program: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (ppid == parent && String::from_utf8_lossy(&cmdline).contains(program)).then_some(pid)
    })
}

#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "the test polls another process's store; no runtime worker is blocked"
)]
fn canopy_up_restarts_a_relay_and_an_agent_that_die() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut up = Proc::start(
        dir.path(),
        "canopy",
        "up",
        &[
            "up",
            "--ranks",
            "64",
            "--agents",
            "4",
            "--fanout",
            "2",
            "--rounds",
            "150",
            "--period-ms",
            "30",
            "--timeout-ms",
            "300",
            "--quiet",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let store = out_dir.join("latest.sqlite");
    let parent = up.child.id();
    let rounds_stored = || {
        if store.exists() {
            read_rounds(&store).len()
        } else {
            0
        }
    };
    let wait_rounds = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while rounds_stored() < n {
            assert!(Instant::now() < deadline, "fewer than {n} rounds stored");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let kill = |program: &str| {
        let pid = child_pid(parent, program).unwrap_or_else(|| panic!("no {program} of this run"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    };
    wait_rounds(20);
    kill("canopy-relay");
    wait_rounds(70);
    kill("canopy-agent");
    let status = up
        .wait_timeout(Duration::from_secs(60))
        .expect("canopy up finishes");
    let log = std::fs::read_to_string(&up.log).unwrap();
    assert!(status.success(), "{log}");
    assert_eq!(
        log.matches("exited with signal: 9 (SIGKILL); restarting it in 100 ms")
            .count(),
        2,
        "{log}"
    );
    assert_eq!(log.matches(" restarted\n").count(), 2, "{log}");
    let rounds = read_rounds(&store);
    assert_eq!(rounds.len(), 150, "{log}");
    // The tree is whole again after each restart: the last rounds have every rank.
    assert!(
        rounds
            .iter()
            .rev()
            .take(20)
            .all(|r| r.covered == 64 && r.expected == 64),
        "{:?}",
        rounds
            .iter()
            .rev()
            .take(20)
            .map(|r| (r.round, r.covered))
            .collect::<Vec<_>>()
    );
}
