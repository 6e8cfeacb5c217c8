//! Time rounds for a workflow, end to end: real SDK ranks of two applications on one agent, the second started
//! about two seconds after the first. With time rounds (the front-end's `time_rounds` key, period 100 ms) the
//! second application joins at the window under way, so none of its rounds is late and the rounds before it do
//! not wait for it; with dump-count rounds its first rounds reach a root that closed them long ago.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::{
    build_c_example, canopy_cli, canopy_command, start_frontend, start_socket_agent, wait_socket,
};
use nix::sys::signal::Signal;

/// Ranks of each application.
const RANKS: u32 = 3;

/// Starts the ranks of application `app` running `exe ARGS` against `socket`.
fn start_app(dir: &Path, exe: &Path, socket: &Path, app: &str, args: &[&str]) -> Vec<Child> {
    (0..RANKS)
        .map(|r| {
            let out = std::fs::File::create(dir.join(format!("{app}-{r}.log"))).unwrap();
            Command::new(exe)
                .args(args)
                .env("CANOPY_AGENT_SOCKET", socket)
                .env("CANOPY_APP", app)
                .env("CANOPY_RANK", r.to_string())
                .env("CANOPY_NRANKS", RANKS.to_string())
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .expect("rank starts")
        })
        .collect()
}

#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous wait on other processes; no runtime worker is blocked"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

fn wait_all(dir: &Path, app: &str, ranks: &mut [Child]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for (r, child) in ranks.iter_mut().enumerate() {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join(format!("{app}-{r}.log"))).unwrap_or_default();
                assert!(status.success(), "rank {r} of {app} exited with {status}:\n{log}");
                break;
            }
            assert!(Instant::now() < deadline, "rank {r} of {app} still running");
            pause(Duration::from_millis(20));
        }
    }
}

/// One stored round of the passthrough stream: its number, covered and expected ranks, and the ranks missing
/// as lost, and for any other reason.
#[derive(Debug)]
struct Round {
    round: u64,
    covered: u32,
    expected: u32,
    lost: u32,
    other_missing: u32,
}

/// What a run stored.
#[derive(Debug)]
struct Stored {
    rounds: Vec<Round>,
    late_ranks: u64,
    late_arrivals: u64,
    /// The first round each application's ranks reported events in (a rank's first profile may hold none).
    first_a: u64,
    first_b: u64,
}

impl Stored {
    /// The first round that covers ranks of B (the first round with more than A's ranks covered).
    fn b_covered_from(&self) -> u64 {
        self.rounds
            .iter()
            .find(|r| r.covered > RANKS)
            .map_or(u64::MAX, |r| r.round)
    }
}

fn read(store: &Path) -> Stored {
    let db = rusqlite::Connection::open(store).unwrap();
    let rounds = db
        .prepare(
            "SELECT round, covered, expected, missing_lost,
                    missing_late + missing_stopped + missing_sampled_out + missing_malformed
                    + missing_not_waited + missing_unspecified + missing_dropped + missing_absent
             FROM rounds WHERE stream_name = 'passthrough' ORDER BY round",
        )
        .unwrap()
        .query_map([], |r| {
            Ok(Round {
                round: r.get(0)?,
                covered: r.get(1)?,
                expected: r.get(2)?,
                lost: r.get(3)?,
                other_missing: r.get(4)?,
            })
        })
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let one = |sql: &str| -> u64 { db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64 };
    Stored {
        rounds,
        late_ranks: one("SELECT coalesce(sum(late_ranks), 0) FROM rounds"),
        late_arrivals: one("SELECT count(*) FROM late_arrivals"),
        first_a: one("SELECT coalesce(min(round), -1) FROM samples WHERE app = 'A'"),
        first_b: one("SELECT coalesce(min(round), -1) FROM samples WHERE app = 'B'"),
    }
}

/// Application A from the start (about 4 s of 40 ms iterations), application B from about 2 s on (about 1 s),
/// on one agent; returns what the front-end stored once the run ended.
fn run(dir: &Path, time_rounds: bool) -> Stored {
    let exe = build_c_example(dir, false);
    let mut flags = vec!["--streams", "passthrough"];
    if time_rounds {
        flags.extend(["--time-rounds", "true"]);
    }
    let (mut fe, addr, store) = start_frontend(dir, &flags);
    if time_rounds {
        // The period every rank counts windows of; time_rounds left unset keeps the front-end's key.
        let applied = canopy_cli(&["ctl", "set", "--period-ms", "100", "--frontend", &addr]);
        assert!(applied.contains("applied"), "{applied}");
        // The utilization module's rounds are time rounds: options that turn them off with it are refused.
        let refused = canopy_command()
            .args([
                "ctl",
                "set",
                "--modules",
                "profile,utilization",
                "--time-rounds",
                "off",
            ])
            .args(["--frontend", &addr])
            .output()
            .unwrap();
        assert!(!refused.status.success());
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(
            message.contains("time_rounds cannot be off while the utilization module is in force"),
            "{message}"
        );
    }
    let socket = dir.join("agent.sock");
    let mut agent = start_socket_agent(dir, "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let mut a = start_app(dir, &exe, &socket, "A", &["100", "16", "40000"]);
    pause(Duration::from_secs(2));
    let mut b = start_app(dir, &exe, &socket, "B", &["25", "16", "40000"]);
    wait_all(dir, "B", &mut b);
    wait_all(dir, "A", &mut a);
    // A drain delivers and stores every round already offloaded before the front-end exits.
    fe.signal(Signal::SIGTERM);
    assert!(
        fe.wait_timeout(Duration::from_secs(30)).is_some(),
        "the front-end did not exit:\n{}",
        fe.log_text()
    );
    agent.signal(Signal::SIGTERM);
    let _ = agent.wait_timeout(Duration::from_secs(10));
    read(&store)
}

#[test]
fn an_application_that_starts_mid_run_in_time_rounds_joins_the_window_under_way_and_is_never_late() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(dir.path(), true);
    assert!(!s.rounds.is_empty(), "no rounds stored");
    // No rank-round of B (or A) is late.
    assert_eq!((s.late_ranks, s.late_arrivals), (0, 0), "{s:#?}");
    // B's first round is the window it joined in, about 2 s (20 windows of 100 ms) after A's first, and no
    // round before it holds any of B's samples, on time or late.
    let first_b = s.b_covered_from();
    assert!(
        first_b >= s.first_a + 10 && s.first_b >= first_b,
        "B covered from round {first_b}, with samples from {}, and A from {}: {:#?}",
        s.first_b,
        s.first_a,
        s.rounds
    );
    // The rounds before B joined cover A's ranks and do not count B's as missing for a reason other than not
    // attached yet: most do not count them at all (they were not there), and a round still open when B's ranks
    // attached counts them as lost, the reason for ranks not attached in a round.
    let before: Vec<&Round> = s
        .rounds
        .iter()
        .filter(|r| r.round >= s.first_a && r.round < first_b)
        .collect();
    assert!(before.len() >= 10, "{before:#?}");
    for r in &before {
        assert_eq!(r.covered, RANKS, "{r:?}");
        assert_eq!(r.other_missing, 0, "{r:?}");
        assert_eq!(r.expected, r.covered + r.lost, "{r:?}");
    }
    let counted = before.iter().filter(|r| r.expected > RANKS).count();
    assert!(
        counted <= 1,
        "B counted in {counted} rounds before it joined: {before:#?}"
    );
    // After B's first round (whose window B's ranks may have joined at different moments) both applications
    // are covered whole.
    let joined: Vec<&Round> = s
        .rounds
        .iter()
        .filter(|r| r.round > first_b && r.round < first_b + 5)
        .collect();
    assert!(
        joined
            .iter()
            .all(|r| (r.covered, r.expected) == (2 * RANKS, 2 * RANKS)),
        "{joined:#?}"
    );
}

#[test]
fn without_time_rounds_an_application_that_starts_mid_run_dumps_rounds_the_root_closed_and_is_late() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(dir.path(), false);
    // B's k-th dump is round k: it starts at round 0, long closed, so its first rounds are stored late.
    assert_eq!(s.first_b, 0, "{s:#?}");
    assert!(
        s.late_ranks > 0 && s.late_arrivals > 0,
        "no late rank-rounds of B: {s:#?}"
    );
}
