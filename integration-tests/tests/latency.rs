//! The latency filter end to end: two real SDK applications in one tree, a simulation that starts each step
//! of "exchange" and an analysis that stops it after a known delay. Every step run is stored once in
//! `latency`, with a latency no shorter than the delay and well below a loose bound, started by the
//! simulation and stopped by the analysis, and `latency_apps` holds the analysis's compute time.

#![allow(
    clippy::disallowed_types,
    reason = "a synchronous test that waits on real processes by the wall clock; no tokio clock to pause"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::{
    Select, bin_dir, ids_named, reader, start_frontend, start_socket_agent, wait_socket,
};

const STEPS: u64 = 12;
const DELAY_MS: u64 = 30;

/// Compiles the SDK's workflow example (sdk/examples/c/workflow.c) against the libcanopy built beside the daemons.
fn build_workflow(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = bin_dir();
    assert!(
        lib.join("libcanopy.so").is_file(),
        "libcanopy.so is not built in {}",
        lib.display()
    );
    let out = dir.join("workflow");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(root.join("sdk/examples/c/workflow.c"))
        .arg("-I")
        .arg(root.join("sdk/c/include"))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lcanopy")
        .status()
        .expect("a C compiler (cc) is installed");
    assert!(status.success(), "compiling workflow.c failed");
    out
}

fn start(exe: &Path, dir: &Path, role: &str, socket: &Path) -> Child {
    let log = std::fs::File::create(dir.join(format!("{role}.log"))).unwrap();
    Command::new(exe)
        .args([
            role,
            dir.to_str().unwrap(),
            &STEPS.to_string(),
            &DELAY_MS.to_string(),
        ])
        .env("CANOPY_AGENT_SOCKET", socket)
        .env("CANOPY_RANK", "0")
        .env("CANOPY_NRANKS", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("the workflow starts")
}

#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of other processes; no runtime worker is blocked"
)]
fn wait_exit(dir: &Path, role: &str, child: &mut Child, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.join(format!("{role}.log"))).unwrap_or_default();
            assert!(status.success(), "{role} exited with {status}:\n{log}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{role} still running after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_step_started_by_the_simulation_and_stopped_by_the_analysis_has_its_latency_stored() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_workflow(dir.path());
    let (mut fe, addr, store) =
        start_frontend(dir.path(), &["--streams", "latency", "--exit-on-fin", "true"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let mut consumer = start(&exe, dir.path(), "consumer", &socket);
    let mut producer = start(&exe, dir.path(), "producer", &socket);
    wait_exit(dir.path(), "producer", &mut producer, Duration::from_secs(60));
    wait_exit(dir.path(), "consumer", &mut consumer, Duration::from_secs(60));
    let status = fe.wait_timeout(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end did not finish:\n{}",
        fe.log_text()
    );

    let stored = reader(&store);
    let rows = stored.latency(Select::all()).unwrap();
    let mut steps: Vec<u64> = rows.iter().map(|r| r.step).collect();
    steps.sort();
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "{rows:?}");
    let key = ids_named(&store, "exchange");
    assert_eq!(key.len(), 1, "the key's name reached the store");
    for r in &rows {
        assert!(key.contains(&r.key_id), "{r:?}");
        assert!(
            r.latency_ns >= DELAY_MS * 1_000_000,
            "step {}: {} ns is below the delay",
            r.step,
            r.latency_ns
        );
        assert!(
            r.latency_ns < 2_000_000_000,
            "step {}: {} ns",
            r.step,
            r.latency_ns
        );
        assert_eq!(
            (r.start_app.as_str(), r.stop_app.as_str()),
            ("simulation", "analysis"),
            "{r:?}"
        );
        assert_eq!(r.latency_ns, r.stop_unix_ns - r.start_unix_ns);
    }
    let latencies: Vec<f64> = rows.iter().map(|r| r.latency_ns as f64 / 1e6).collect();
    eprintln!("latency per step (ms): {latencies:.1?}");
    // The analysis worked DELAY_MS per step in "analyse", a compute event; each step has both applications.
    let apps = stored.latency_apps(Select::all()).unwrap();
    assert_eq!(apps.len() as u64, 2 * STEPS, "{apps:?}");
    for a in apps.iter().filter(|a| a.app == "analysis") {
        assert_eq!(a.ranks, 1);
        assert!(a.compute_us >= (DELAY_MS * 1000) as f64 * 0.9, "{a:?}");
        assert_eq!(a.transfer_us, 0.0);
    }

    // canopy export writes both tables, the key named beside its id.
    let csv_dir = dir.path().join("csv");
    let out = canopy_integration_tests::canopy_command()
        .args([
            "export",
            store.to_str().unwrap(),
            "--format",
            "csv",
            "--table",
            "latency,latency_apps",
            "--out",
        ])
        .arg(&csv_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (table, rows) in [("latency", STEPS), ("latency_apps", 2 * STEPS)] {
        let mut csv = csv::Reader::from_path(csv_dir.join(format!("{table}.csv"))).unwrap();
        let header = csv.headers().unwrap().clone();
        let key = header.iter().position(|h| h == "key").unwrap();
        let records: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
        assert_eq!(records.len() as u64, rows, "{table}");
        assert!(
            records.iter().all(|r| &r[key] == "exchange"),
            "{table}: {records:?}"
        );
    }
}
