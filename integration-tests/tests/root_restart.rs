//! A front-end killed mid-run and restarted on its store and address: it takes back the ranks its run expected,
//! so no round closes as whole while a relay has yet to come back, and what the children had sent that the dead
//! front-end never stored is sent again. Every rank-round is covered, or late with its data, or counted with its
//! reason.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::accounting::{assert_accounted, assert_every_round_has_its_row};
use canopy_integration_tests::{
    FaultProxy, Proc, RoundRow, SimAgent, read_rounds, start_frontend, start_relay, wait_for,
};
use canopy_proto::v1::MissingReason;
use nix::sys::signal::Signal;

const RANKS_PER_AGENT: u32 = 8;
const RANKS: u32 = 4 * RANKS_PER_AGENT;

fn frontend(dir: &Path, listen: &str, streams: &str) -> (Proc, std::path::PathBuf) {
    let _ = std::fs::remove_file(dir.join("frontend.ready"));
    let args = [
        "--listen",
        listen,
        "--streams",
        streams,
        "--stream-timeout-ms",
        "1000",
        "--expect-ranks",
        &RANKS.to_string(),
    ];
    let (fe, _, store) = start_frontend(dir, &args);
    (fe, store)
}

fn agent(dir: &Path, n: u32, parent: &str) -> Proc {
    let id = format!("agent-{n}");
    SimAgent {
        id: &id,
        parents: parent,
        ranks: RANKS_PER_AGENT,
        offset: n * RANKS_PER_AGENT,
        total: RANKS,
        period_ms: 50,
        rounds: 0,
    }
    .start(dir)
}

/// The agent of a new tree (4 simulated ranks, never attached: no run id), in a directory of its own.
fn new_tree_agent(dir: &Path, parent: &str) -> Proc {
    let new_dir = dir.join("new");
    std::fs::create_dir(&new_dir).unwrap();
    let fresh = [
        "--node-id",
        "agent-new",
        "--parent",
        parent,
        "--socket",
        "none",
        "--simulate-ranks",
        "4",
        "--simulate-period-ms",
        "50",
    ];
    Proc::start(&new_dir, "canopy-agent", "agent-new", &fresh)
}

fn restarted_with(streams_after: &str) -> Vec<RoundRow> {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    let (fe, store) = frontend(dir.path(), &listen, "stats");
    // relay-1 reaches the front-end through a proxy that holds it back while the front-end restarts.
    let proxy = FaultProxy::start(&listen);
    let (_relay0, addr0) = start_relay(dir.path(), "relay-0", &listen, "127.0.0.1:0");
    let (_relay1, addr1) = start_relay(dir.path(), "relay-1", proxy.addr(), "127.0.0.1:0");
    let _agents: Vec<Proc> = (0..4)
        .map(|n| agent(dir.path(), n, if n < 2 { &addr0 } else { &addr1 }))
        .collect();
    wait_for("20 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == RANKS).count() >= 20
    });

    let mut fe = fe;
    fe.child.kill().unwrap();
    let _ = fe.child.wait();
    proxy.stall();
    proxy.reset();
    let (mut fe, again) = frontend(dir.path(), &listen, streams_after);
    assert_eq!(
        std::fs::canonicalize(&again).unwrap(),
        std::fs::canonicalize(&store).unwrap(),
        "the restarted front-end continues the run"
    );
    // relay-1 comes back 5 s after the front-end.
    std::thread::sleep(Duration::from_secs(5));
    proxy.resume();
    let seen = read_rounds(&store).last().map_or(0, |r| r.round);
    wait_for(
        "20 full rounds after the restart",
        Duration::from_secs(60),
        || {
            read_rounds(&store)
                .iter()
                .filter(|r| r.round > seen && r.covered == RANKS)
                .count()
                >= 20
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());
    read_rounds(&store)
}

/// Every round of stream 1 from 0 to its last has its row, expects every rank, and each rank-round is covered,
/// late with its data, or counted dropped or stopped; none counted twice and none claimed whole while missing.
fn assert_stats_accounted(rounds: &[RoundRow]) {
    let stats: Vec<RoundRow> = rounds.iter().filter(|r| r.stream_id == 1).cloned().collect();
    assert_every_round_has_its_row(&stats);
    assert_accounted(&stats, RANKS, &[MissingReason::Dropped, MissingReason::Stopped]);
    for r in &stats {
        let counted: u32 = r.missing.iter().map(|(_, n)| n).sum::<u32>();
        assert_eq!(r.covered + counted, RANKS, "{r:?}");
    }
}

#[test]
fn a_restarted_frontend_waits_for_the_ranks_its_run_expects_and_loses_none() {
    let rounds = restarted_with("stats");
    assert_stats_accounted(&rounds);
}

#[test]
fn a_restarted_frontend_with_other_streams_loses_none_of_the_stream_it_keeps() {
    let rounds = restarted_with("stats,histogram");
    assert_stats_accounted(&rounds);
}

#[test]
fn a_new_tree_in_a_crashed_runs_directory_starts_a_new_run_and_the_old_trees_nodes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    let args = ["--listen", &listen, "--streams", "stats"];
    let (mut old_fe, _, old_store) = start_frontend(dir.path(), &args);
    let (mut old_relay, relay_addr) = start_relay(dir.path(), "relay-0", &listen, "127.0.0.1:0");
    let _old_agent = agent(dir.path(), 0, &relay_addr);
    wait_for("rounds of the old run", Duration::from_secs(30), || {
        read_rounds(&old_store).len() >= 10
    });
    old_fe.child.kill().unwrap();
    let _ = old_fe.child.wait();
    std::thread::sleep(Duration::from_secs(3));

    // A new front-end on the same address and directory, its crashed predecessor silent for longer than
    // --resume-within-s, and a new tree: one agent of its own.
    let _ = std::fs::remove_file(dir.path().join("frontend.ready"));
    let args = [
        "--listen",
        &listen,
        "--streams",
        "stats",
        "--resume-within-s",
        "2",
    ];
    let (mut fe, _, store) = start_frontend(dir.path(), &args);
    assert_ne!(
        std::fs::canonicalize(&store).unwrap(),
        std::fs::canonicalize(&old_store).unwrap(),
        "the new tree was filed into the crashed run"
    );
    assert!(fe.log_text().contains("starting a new run"), "{}", fe.log_text());
    let _new_agent = new_tree_agent(dir.path(), &listen);
    // The old run's relay, retrying the address all along, is refused, and says why.
    assert!(
        old_relay.wait_timeout(Duration::from_secs(30)).is_some(),
        "the old run's relay was not refused:\n{}",
        old_relay.log_text()
    );
    let log = old_relay.log_text();
    assert!(log.contains("belongs to run"), "{log}");
    wait_for("rounds of the new run", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 10
    });
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());
    let rounds = read_rounds(&store);
    assert_eq!(rounds[0].round, 0, "the new run counts its own rounds");
    for r in &rounds {
        assert_eq!((r.covered, r.expected, r.late_ranks), (4, 4, 0), "{r:?}");
    }
    let fe_log = fe.log_text();
    assert!(
        fe_log.contains("refused child: node relay-0 belongs to run"),
        "{fe_log}"
    );
}

#[test]
fn a_new_tree_that_attaches_first_to_a_resumed_run_gets_a_new_run_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    let args = ["--listen", &listen, "--streams", "stats"];
    let (mut old_fe, _, old_store) = start_frontend(dir.path(), &args);
    let mut old_agent = agent(dir.path(), 0, &listen);
    wait_for("rounds of the old run", Duration::from_secs(30), || {
        read_rounds(&old_store).len() >= 10
    });
    // The whole job dies, front-end first; a new one starts at once in the same directory, well within
    // resume_within_s: the front-end takes it for the crashed run until its first child says otherwise.
    old_fe.child.kill().unwrap();
    let _ = old_fe.child.wait();
    old_agent.child.kill().unwrap();
    let _ = old_agent.child.wait();
    let _ = std::fs::remove_file(dir.path().join("frontend.ready"));
    let (mut fe, _, resumed) = start_frontend(dir.path(), &args);
    assert_eq!(
        std::fs::canonicalize(&resumed).unwrap(),
        std::fs::canonicalize(&old_store).unwrap(),
        "within resume_within_s the front-end continues the run until a child attaches"
    );
    let _new_agent = new_tree_agent(dir.path(), &listen);
    let ready = dir.path().join("frontend.ready");
    let mut store = None;
    wait_for("the front-end's new store", Duration::from_secs(30), || {
        let now = canopy_integration_tests::Ready::read(&ready)
            .ok()
            .flatten()
            .and_then(|r| r.store);
        store = now.filter(|s| std::fs::canonicalize(s).ok() != std::fs::canonicalize(&old_store).ok());
        store.is_some()
    });
    let store = store.unwrap();
    wait_for("rounds of the new run", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 10
    });
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());
    let rounds = read_rounds(&store);
    assert_eq!(rounds[0].round, 0, "the new run counts its own rounds");
    for r in &rounds {
        assert_eq!((r.covered, r.expected, r.late_ranks), (4, 4, 0), "{r:?}");
    }
    // The crashed run was ended, saying why, and holds nothing of the new tree.
    let old = canopy_integration_tests::reader(&old_store);
    assert_eq!(
        old.meta("ended_by").unwrap().as_deref(),
        Some("a new tree attached first (agent-new)")
    );
    assert!(old.meta(canopy_store::ENDED).unwrap().is_some());
    assert!(
        read_rounds(&old_store)
            .iter()
            .all(|r| r.covered <= RANKS_PER_AGENT && r.late_ranks == 0)
    );
    let log = fe.log_text();
    assert!(log.contains("a node of a new tree attached first"), "{log}");
}

/// The highest round number a plain `canopy watch` printed.
fn last_round_shown(text: &str) -> Option<u64> {
    text.split("round")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .max()
}

#[test]
fn canopy_watch_follows_a_restarted_frontend_with_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    let (fe, store) = frontend(dir.path(), &listen, "stats");
    let _agents: Vec<Proc> = (0..4).map(|n| agent(dir.path(), n, &listen)).collect();
    wait_for("rounds", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 10
    });
    let (out, err) = (dir.path().join("watch.out"), dir.path().join("watch.err"));
    let mut watch = canopy_integration_tests::canopy_command()
        .args(["watch", "--plain", "--frontend", &listen])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for("the watch's first rounds", Duration::from_secs(20), || {
        last_round_shown(&read(&out)).is_some()
    });
    let mut fe = fe;
    fe.child.kill().unwrap();
    let _ = fe.child.wait();
    let before = last_round_shown(&read(&out)).unwrap();
    wait_for("the watch's notice", Duration::from_secs(20), || {
        read(&err).contains("front-end lost") && read(&err).contains("reconnecting")
    });
    let (mut fe, _) = frontend(dir.path(), &listen, "stats");
    wait_for("the watch to reconnect", Duration::from_secs(30), || {
        read(&err).contains("reconnected to")
    });
    wait_for(
        "rounds after the restart in the watch",
        Duration::from_secs(30),
        || last_round_shown(&read(&out)).is_some_and(|r| r > before + 10),
    );
    assert!(watch.try_wait().unwrap().is_none(), "the watch is still running");
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());
    let status = watch.wait().unwrap();
    assert!(
        status.success(),
        "the watch ends with the run: {status}\n{}",
        read(&err)
    );
}
