//! A front-end killed and started again on the same `out` continues its run: one store, stream ids kept or
//! never reused, and no packet of an old stream fed to a new filter.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::{Proc, read_rounds, reader, start_frontend, start_relay, wait_for};
use canopy_store::StreamState;

fn rounds_of(store: &Path, stream: u32) -> Vec<canopy_integration_tests::RoundRow> {
    read_rounds(store)
        .into_iter()
        .filter(|r| r.stream_id == stream)
        .collect()
}

fn frontend(dir: &Path, listen: &str, streams: &str) -> (Proc, std::path::PathBuf) {
    let _ = std::fs::remove_file(dir.join("frontend.ready"));
    let args = [
        "--listen",
        listen,
        "--expect-ranks",
        "8",
        "--streams",
        streams,
        "--stream-timeout-ms",
        "1000",
    ];
    let (fe, _, store) = start_frontend(dir, &args);
    (fe, store)
}

#[test]
fn a_killed_frontend_restarted_on_its_out_continues_the_run_and_its_stream_table() {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    let (mut fe, store) = frontend(dir.path(), &listen, "stats,histogram");
    let (_relay, relay_addr) = start_relay(dir.path(), "relay-0", &listen, "127.0.0.1:0");
    let agent_args = [
        "--node-id",
        "agent-0",
        "--parent",
        &relay_addr,
        "--socket",
        "none",
        "--simulate-ranks",
        "8",
        "--simulate-period-ms",
        "20",
    ];
    let _agent = Proc::start(dir.path(), "canopy-agent", "agent-0", &agent_args);
    wait_for("rounds of the first front-end", Duration::from_secs(30), || {
        rounds_of(&store, 2).len() >= 10
    });
    let before = rounds_of(&store, 1).last().unwrap().round;

    // Killed: it ends nothing. Started again with histogram dropped and classify added.
    fe.child.kill().unwrap();
    let _ = fe.child.wait();
    let (mut fe, again) = frontend(dir.path(), &listen, "stats,classify");
    assert_eq!(
        std::fs::canonicalize(&again).unwrap(),
        std::fs::canonicalize(&store).unwrap(),
        "the restarted front-end opened another store"
    );
    wait_for(
        "classify rounds after the restart",
        Duration::from_secs(30),
        || rounds_of(&store, 3).len() >= 10,
    );
    let runs = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
            name.starts_with("run-") && name.ends_with(".sqlite")
        })
        .count();
    assert_eq!(runs, 1, "one run, one store");

    let stored = reader(&store);
    let states: Vec<(u32, String, Option<StreamState>)> = stored
        .streams()
        .unwrap()
        .into_iter()
        .map(|s| (s.stream_id, s.name, s.state))
        .collect();
    assert_eq!(
        states,
        [
            (1, "stats".into(), Some(StreamState::Open)),
            (2, "histogram".into(), Some(StreamState::Closed)),
            (3, "classify".into(), Some(StreamState::Open)),
        ]
    );
    assert_eq!(
        stored.meta("restart_1").unwrap().as_deref(),
        Some("kept stats (1); opened classify (3); closed histogram (2)")
    );
    // Stats went on under its id, every round stored once and whole: nothing of histogram's reached stats or
    // classify (a malformed packet would leave a round short).
    let stats = rounds_of(&store, 1);
    assert!(stats.last().unwrap().round > before + 10, "{:?}", stats.last());
    let mut seen = std::collections::HashSet::new();
    for r in stats.iter().chain(rounds_of(&store, 3).iter()) {
        assert!(seen.insert((r.stream_id, r.round)), "round stored twice: {r:?}");
        if r.round > before + 5 {
            assert_eq!((r.covered, r.expected), (8, 8), "{r:?}");
        }
    }
    // Every node's status (sent once a second) counts no malformed packet.
    let mut nodes = Vec::new();
    wait_for("every node's status", Duration::from_secs(10), || {
        let out = canopy_integration_tests::canopy_cli(&["topology", "--frontend", &listen, "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        nodes.len() == 3 && nodes.iter().all(|n| n.get("roundsClosed").is_some())
    });
    for node in &nodes {
        // proto3 JSON leaves a zero count out.
        assert_eq!(node.get("malformed"), None, "{node}");
    }

    // Ended by a signal, the run is over: the next front-end on this `out` begins a new one.
    fe.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        fe.wait_timeout(Duration::from_secs(20))
            .is_some_and(|s| s.success())
    );
    assert!(reader(&store).meta("ended_unix_ns").unwrap().is_some());
    let (_fe, third) = frontend(dir.path(), &listen, "stats");
    assert_ne!(
        std::fs::canonicalize(&third).unwrap(),
        std::fs::canonicalize(&store).unwrap(),
        "a run that ended was continued"
    );
}
