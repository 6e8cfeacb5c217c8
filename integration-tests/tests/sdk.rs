//! The application SDK end to end: the C and Rust examples as real processes against a real tree on
//! loopback, an agent killed under a running application, control applied at the dump, and ranks that
//! misbehave on the agent's socket.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::{
    Proc, Select, bin_dir, build_c_example, ids_named, read_rounds, reader, start_frontend,
    start_socket_agent, wait_for, wait_socket,
};
use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::MissingReason;
use canopy_wire::v1::{AgentMessage, RankHello, RankMessage, agent_message, rank_message};
use canopy_wire::{RANK_PROTOCOL_VERSION, encode_frame, read_frame};
use nix::sys::signal::Signal;

/// Starts `n` ranks of `exe` against `socket`, each with its own output file in `dir`.
fn start_ranks(
    dir: &Path,
    exe: &Path,
    socket: &Path,
    n: u32,
    args: &[&str],
    env: &[(&str, &str)],
) -> Vec<Child> {
    (0..n)
        .map(|r| {
            let out = std::fs::File::create(dir.join(format!("rank{r}.log"))).unwrap();
            Command::new(exe)
                .args(args)
                .env("CANOPY_AGENT_SOCKET", socket)
                .env("CANOPY_RANK", r.to_string())
                .env("CANOPY_NRANKS", n.to_string())
                .envs(env.iter().copied())
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
    reason = "a synchronous poll of another process; no runtime worker is blocked"
)]
fn wait_ranks(dir: &Path, ranks: &mut [Child], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    for (r, child) in ranks.iter_mut().enumerate() {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default();
                assert!(status.success(), "rank {r} exited with {status}:\n{log}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "rank {r} still running after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs `ranks` processes of an example against a fresh tree (stats and passthrough streams) to the end, and
/// checks the store: every round of both streams at full coverage, and per rank and timer, calls that add up
/// to exactly `iterations * calls_per_iteration`, exclusive time never above inclusive.
fn run_example(exe: &Path, timers: &[(&str, i64)], ranks: u32, iterations: i64) {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, store) = start_frontend(
        dir.path(),
        &["--streams", "stats,passthrough", "--exit-on-fin", "true"],
    );
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let iters = iterations.to_string();
    let mut procs = start_ranks(dir.path(), exe, &socket, ranks, &[&iters, "64", "0"], &[]);
    wait_ranks(dir.path(), &mut procs, Duration::from_secs(60));
    let status = fe.wait_timeout(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end did not finish:\n{}",
        fe.log_text()
    );

    let rounds = read_rounds(&store);
    for stream in ["stats", "passthrough"] {
        let of: Vec<_> = rounds.iter().filter(|r| r.stream == stream).collect();
        assert_eq!(of.len() as i64, iterations, "{stream}: {of:?}");
        for (k, r) in of.iter().enumerate() {
            assert_eq!(r.round, k as u64);
            assert_eq!(
                (r.covered, r.expected),
                (ranks, ranks),
                "{stream} round {}: {r:?}",
                r.round
            );
        }
    }
    let stored = reader(&store);
    let samples = stored.samples(Select::all()).unwrap();
    let stats = stored.stats(Select::all()).unwrap();
    for (timer, per_iteration) in timers {
        let ids = ids_named(&store, timer);
        // Per rank: the sum of its calls, the largest total, and how many samples.
        let mut per_rank: BTreeMap<u32, (i64, i64, i64)> = BTreeMap::new();
        for s in samples.iter().filter(|s| ids.contains(&s.event_id)) {
            let row = per_rank.entry(s.rank).or_default();
            row.0 += s.calls.expect("calls") as i64;
            row.1 = row.1.max(s.calls_total.expect("calls_total") as i64);
            row.2 += 1;
        }
        assert_eq!(per_rank.len() as u32, ranks, "{timer}: {per_rank:?}");
        for (rank, (calls, total, n)) in &per_rank {
            let expect = iterations * per_iteration;
            assert_eq!((*calls, *total), (expect, expect), "{timer}, rank {rank}");
            assert_eq!(*n, iterations, "{timer}: one sample per round");
        }
        // The stats stream saw every rank in every round.
        let counts = stats
            .iter()
            .filter(|s| ids.contains(&s.id) && s.metric == Metric::Calls && s.count == u64::from(ranks))
            .count() as i64;
        assert_eq!(counts, iterations, "{timer}: stats count");
    }
    let above =
        |excl: Option<f64>, incl: Option<f64>| matches!((excl, incl), (Some(e), Some(i)) if e > i + 1e-9);
    let bad = samples
        .iter()
        .filter(|s| above(s.excl_us, s.incl_us) || above(s.excl_total_us, s.incl_total_us))
        .count();
    assert_eq!(bad, 0, "exclusive time above inclusive");
    let exchanged = ids_named(&store, "bytes_exchanged");
    let total = (iterations * 2 * 64 * 8) as f64;
    let bytes = stored
        .counters(Select::all())
        .unwrap()
        .iter()
        .filter(|c| {
            exchanged.contains(&c.counter_id) && c.round == (iterations - 1) as u64 && c.total == Some(total)
        })
        .count();
    assert_eq!(bytes, ranks as usize, "every rank's bytes_exchanged total");
}

/// The drain of a tree whose ranks the test killed (not finished): nothing can deliver their rounds, so the
/// front-end waits out the drain's time-out; these tests keep it short.
const KILLED_RANKS_DRAIN_MS: &str = "2000";

/// A front-end (with `extra` and the short drain of [`KILLED_RANKS_DRAIN_MS`]) and one socket agent under it,
/// its socket up: the tree of the tests whose ranks are killed. Returns the front-end, its address, the agent,
/// the store and the agent's socket.
fn killed_ranks_tree(dir: &Path, extra: &[&str]) -> (Proc, String, Proc, PathBuf, PathBuf) {
    let args: Vec<&str> = extra
        .iter()
        .copied()
        .chain(["--drain-timeout-ms", KILLED_RANKS_DRAIN_MS])
        .collect();
    let (fe, addr, store) = start_frontend(dir, &args);
    let socket = dir.join("agent.sock");
    let mut agent = start_socket_agent(dir, "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    (fe, addr, agent, store, socket)
}

#[test]
fn the_c_example_on_8_processes_reports_every_timer_with_exact_call_counts() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let timers = [
        ("iteration", 1),
        ("halo_exchange", 1),
        ("sweep", 1),
        ("residual", 1),
    ];
    run_example(&exe, &timers, 8, 40);
}

#[test]
fn the_rust_example_on_8_processes_adds_up_the_timers_of_its_threads() {
    let exe = bin_dir().join("canopy-stencil");
    // sweep_half runs in two threads per iteration: both count in the rank's profile.
    let timers = [
        ("iteration", 1),
        ("halo_exchange", 1),
        ("sweep", 1),
        ("sweep_half", 2),
        ("residual", 1),
    ];
    run_example(&exe, &timers, 8, 40);
}

/// The seconds an example run reports ("... in X s").
fn reported_seconds(out: &[u8]) -> f64 {
    let text = String::from_utf8_lossy(out);
    let line = text
        .lines()
        .find(|l| l.contains(" iterations of "))
        .expect("the summary line");
    let secs = line
        .split(" in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .expect("a time");
    secs.parse().expect("seconds")
}

#[test]
fn without_an_agent_the_example_exits_0_without_stalling() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let plain = build_c_example(dir.path(), true);
    let missing = dir.path().join("no-agent.sock");
    let run = |exe: &Path| {
        let started = Instant::now();
        let out = Command::new(exe)
            .args(["400", "128", "0"])
            .env("CANOPY_AGENT_SOCKET", &missing)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (reported_seconds(&out.stdout), started.elapsed(), out.stderr)
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        with.push(run(&exe));
        without.push(run(&plain));
    }
    // Finalize says what was lost and why, and returns at once.
    let err = String::from_utf8_lossy(&with[0].2);
    assert!(err.contains("400 dumps were not delivered"), "{err}");
    assert!(err.contains("no-agent.sock: cannot connect"), "{err}");
    // No stall: a dump that waited on the absent agent would cost milliseconds per iteration. (The overhead
    // itself is measured by the bench, not here.)
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut w: Vec<f64> = with.iter().map(|r| r.0).collect();
    let mut p: Vec<f64> = without.iter().map(|r| r.0).collect();
    let (w, p) = (median(&mut w), median(&mut p));
    assert!(w < p * 2.0 + 0.05, "instrumented {w} s against plain {p} s");
    assert!(
        with.iter().all(|r| r.1 < Duration::from_secs(5)),
        "a run took too long"
    );
}

/// `canopy` against the front-end at `addr`.
fn canopy(addr: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--frontend", addr]);
    canopy_integration_tests::canopy_cli(&all)
}

#[test]
fn an_agent_killed_and_restarted_under_a_running_application() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let (mut fe, addr, store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    // 150 iterations of at least 20 ms: 3 s of sleeping, whatever happens to the agent.
    let env = [("CANOPY_QUEUE_DUMPS", "4")];
    let mut ranks = start_ranks(dir.path(), &exe, &socket, 2, &["150", "32", "20000"], &env);
    wait_for("10 rounds", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 10
    });
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait_timeout(Duration::from_secs(5));
    #[allow(
        clippy::disallowed_methods,
        reason = "lets the ranks notice the lost agent; there is no event to wait on from here"
    )]
    std::thread::sleep(Duration::from_millis(700));
    // Restarted as systemd's Restart= would: same id, same socket (left stale by the kill).
    let agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_ranks(dir.path(), &mut ranks, Duration::from_secs(30));
    for r in 0..2 {
        let out = std::fs::read(dir.path().join(format!("rank{r}.log"))).unwrap();
        let secs = reported_seconds(&out);
        assert!(
            secs < 3.0 + 1.5,
            "rank {r} took {secs} s: the application stalled"
        );
    }
    // Later rounds arrive again, complete.
    wait_for("the last round", Duration::from_secs(20), || {
        read_rounds(&store)
            .iter()
            .any(|r| r.round == 149 && r.covered == 2)
    });
    let rounds = read_rounds(&store);
    let full_after: Vec<_> = rounds.iter().filter(|r| r.round >= 120).collect();
    assert!(
        full_after.len() >= 25 && full_after.iter().all(|r| r.covered == 2),
        "{full_after:?}"
    );
    // The ranks counted what they dropped while the agent was away, and the tree shows it.
    let log = agent.log_text();
    assert!(log.contains("reports dumps it could not deliver"), "{log}");
    let topology = canopy(&addr, &["topology", "--json"]);
    let dropped: u64 = topology
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|v| v["nodes"].as_array().cloned().unwrap_or_default())
        .filter(|n| n["nodeId"] == "agent-0")
        .filter_map(|n| n["rankDumpsDropped"].as_str().and_then(|s| s.parse::<u64>().ok()))
        .sum();
    assert!(dropped >= 2, "rank_dumps_dropped {dropped} in {topology}");
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
    drop(agent);
}

/// The distinct event names in rounds at or above `from`, per rank, from the passthrough samples.
fn events_since(store: &Path, from: i64) -> Vec<String> {
    let stored = reader(store);
    let names: HashMap<u64, String> = stored.names().unwrap().into_iter().collect();
    let events: BTreeSet<String> = stored
        .samples(Select::all().from_round(from as u64))
        .unwrap()
        .iter()
        .filter_map(|s| names.get(&s.event_id).cloned())
        .collect();
    events.into_iter().collect()
}

fn max_round(store: &Path) -> i64 {
    reader(store).max_round().unwrap().map_or(-1, |r| r as i64)
}

#[test]
fn control_changes_the_next_dumps_of_real_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let (mut fe, addr, _agent, store, socket) =
        killed_ranks_tree(dir.path(), &["--streams", "passthrough,stats"]);
    let mut ranks = start_ranks(dir.path(), &exe, &socket, 4, &["100000", "16", "5000"], &[]);
    wait_for("10 rounds", Duration::from_secs(20), || max_round(&store) >= 10);
    // Each change reaches a rank at its next dump, which may be up to a window of rounds ahead of the last stored
    // round: the checks look at the latest five rounds once the change shows in all of them.
    let settle = |store: &Path, applied: &dyn Fn(i64) -> bool| {
        let sent = max_round(store);
        let mut from = sent;
        wait_for("rounds after the change", Duration::from_secs(30), || {
            from = max_round(store) - 5;
            from > sent && applied(from)
        });
        from
    };

    canopy(&addr, &["ctl", "set", "--include", "^halo"]);
    let from = settle(&store, &|from| events_since(&store, from) == ["halo_exchange"]);
    assert_eq!(events_since(&store, from), vec!["halo_exchange"]);

    canopy(&addr, &["ctl", "set", "--metrics", "exclusive"]);
    // Every rank on the new options: all four events again, and no time but exclusive.
    let only_exclusive = |from: i64| {
        reader(&store)
            .samples(Select::all().from_round(from as u64))
            .unwrap()
            .iter()
            .all(|s| s.calls.is_none() && s.incl_us.is_none())
    };
    let from = settle(&store, &|from| {
        events_since(&store, from).len() == 4 && only_exclusive(from)
    });
    assert_eq!(events_since(&store, from).len(), 4, "the include is replaced");
    let later = reader(&store)
        .samples(Select::all().from_round(from as u64))
        .unwrap();
    let with_calls = later
        .iter()
        .filter(|s| s.calls.is_some() || s.incl_us.is_some())
        .count();
    let with_excl = later.iter().filter(|s| s.excl_us.is_some()).count();
    assert_eq!(with_calls, 0, "only exclusive time is reported");
    assert!(with_excl > 0);

    // Per-event counters from the root: every rank opens them at its next events, and the stats stream
    // reduces them like time.
    let faults = |from: i64| {
        reader(&store)
            .stats(Select::all().from_round(from as u64))
            .unwrap()
            .iter()
            .filter(|s| s.metric == Metric::ContextSwitchesInclusive && s.count == 4)
            .count()
    };
    assert_eq!(faults(0), 0, "no counters before they are asked for");
    canopy(
        &addr,
        &["ctl", "set", "--counters", "context-switches,page-faults"],
    );
    let from = settle(&store, &|from| faults(from) > 0);
    assert!(
        faults(from) > 0,
        "context switches of every rank after the change"
    );

    canopy(&addr, &["ctl", "set", "--sample-below", "2"]);
    // The options reach the ranks at their next dump, which may be up to a window of rounds ahead of the last
    // stored round, and each rank at its own: every round before the first with ranks 0 and 1 only misses at
    // most one rank, sampled out, and every round from it on has ranks 0 and 1 only.
    let sent = max_round(&store) as u64;
    let rounds_since = || reader(&store).rounds(Select::all().from_round(sent)).unwrap();
    wait_for("rounds sampled below rank 2", Duration::from_secs(20), || {
        rounds_since().iter().filter(|r| r.covered == 2).count() >= 16
    });
    let rounds = rounds_since();
    let first = rounds
        .iter()
        .filter(|r| r.covered == 2)
        .map(|r| r.round)
        .min()
        .unwrap();
    assert!(
        first <= sent + 64,
        "sampling took effect at round {first}, sent at {sent}"
    );
    for r in &rounds {
        let got = (r.covered, r.expected, r.missing.get(MissingReason::SampledOut));
        if r.round < first {
            assert!(
                got == (4, 4, 0) || got == (3, 4, 1),
                "round {} before the sampling took effect: {got:?}",
                r.round
            );
        } else {
            assert_eq!(got, (2, 4, 2), "round {}: ranks 2 and 3 sampled out", r.round);
        }
    }

    // A period: the SDK dumps on its own every 50 ms (the application's own dumps, every 5 ms, then do nothing).
    canopy(&addr, &["ctl", "set", "--period-ms", "50"]);
    let sent = max_round(&store);
    wait_for("period rounds", Duration::from_secs(20), || {
        max_round(&store) >= sent + 12
    });
    let mut rank0: Vec<(u64, i64)> = reader(&store)
        .samples(Select::all().from_round((sent + 4) as u64))
        .unwrap()
        .iter()
        .filter(|s| s.rank == 0)
        .map(|s| (s.round, s.dump_unix_ns.expect("dump time") as i64))
        .collect();
    rank0.sort_by_key(|(round, _)| *round);
    // Each dump time once, in round order.
    let mut dumps: Vec<i64> = Vec::new();
    for (_, dump) in rank0 {
        if !dumps.contains(&dump) {
            dumps.push(dump);
        }
    }
    let mut gaps: Vec<i64> = dumps.windows(2).map(|w| (w[1] - w[0]) / 1_000_000).collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    assert!(
        (40..=80).contains(&median),
        "median ms between dumps {median}: {gaps:?}"
    );

    canopy(&addr, &["ctl", "stop"]);
    #[allow(
        clippy::disallowed_methods,
        reason = "a negative test: it waits to see that nothing more arrives"
    )]
    std::thread::sleep(Duration::from_millis(500));
    let stopped_at = max_round(&store);
    #[allow(
        clippy::disallowed_methods,
        reason = "a negative test: it waits to see that nothing more arrives"
    )]
    std::thread::sleep(Duration::from_millis(800));
    assert!(max_round(&store) <= stopped_at + 1, "rounds went on after stop");
    canopy(&addr, &["ctl", "start"]);
    wait_for("rounds after start", Duration::from_secs(20), || {
        max_round(&store) >= stopped_at + 5
    });

    // A window of rounds: the real ranks report exactly rounds FROM to TO, and nothing before or after, from the
    // first round the tree has not admitted (which a window in the past is told).
    let refused = std::process::Command::new(canopy_integration_tests::bin_dir().join("canopy"))
        .args(["ctl", "window", "--from", "0", "--to", "0", "--frontend", &addr])
        .env("CANOPY_TLS_DIR", &canopy_integration_tests::credentials().dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr).into_owned();
    let first: u64 = message
        .rsplit_once("start the window at round ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no first round in {message:?}"));
    let (from, to) = (first + 5, first + 9);
    assert_eq!(
        canopy(
            &addr,
            &[
                "ctl",
                "window",
                "--from",
                &from.to_string(),
                "--to",
                &to.to_string()
            ]
        )
        .trim(),
        format!("window: rounds {from} to {to}: applied")
    );
    wait_for("the window's last round", Duration::from_secs(20), || {
        max_round(&store) >= to as i64
    });
    #[allow(
        clippy::disallowed_methods,
        reason = "a negative test: it waits to see that nothing more arrives"
    )]
    std::thread::sleep(Duration::from_millis(600));
    // Every rank reports each round of the window: in time, or late (a loaded machine may close a round at its
    // time-out before a rank's dump is in), never lost.
    let rows = reader(&store)
        .rounds(Select::all().stream(2).from_round(first))
        .unwrap();
    let windowed: Vec<(u64, u32)> = rows
        .iter()
        .map(|r| {
            let reported =
                r.covered + r.missing.get(MissingReason::SampledOut) + r.missing.get(MissingReason::Late);
            (r.round, reported)
        })
        .collect();
    let expected: Vec<(u64, u32)> = (from..=to).map(|round| (round, 4)).collect();
    assert_eq!(windowed, expected, "{rows:?}");

    for r in &mut ranks {
        let _ = r.kill();
        let _ = r.wait();
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

/// A rank speaking the socket protocol by hand.
struct RawRank {
    stream: UnixStream,
}

impl RawRank {
    fn connect(socket: &Path, rank: u32, nranks: u32) -> RawRank {
        RawRank::connect_as(socket, "raw", rank, nranks)
    }

    fn connect_as(socket: &Path, app: &str, rank: u32, nranks: u32) -> RawRank {
        let mut stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let hello = RankMessage {
            msg: Some(rank_message::Msg::Hello(RankHello {
                protocol_version: RANK_PROTOCOL_VERSION,
                app: app.into(),
                rank,
                nranks,
                pid: std::process::id(),
                next_round: 0,
            })),
        };
        let mut frame = Vec::new();
        encode_frame(&hello, &mut frame);
        stream.write_all(&frame).unwrap();
        RawRank { stream }
    }

    fn read(&mut self) -> AgentMessage {
        read_frame(&mut self.stream, &mut Vec::new()).unwrap()
    }

    fn dump(&mut self, rank: u32, round: u64) {
        let dump = RankMessage {
            msg: Some(rank_message::Msg::Dump(canopy_integration_tests::work_dump(
                "raw", rank, round,
            ))),
        };
        let mut frame = Vec::new();
        encode_frame(&dump, &mut frame);
        self.stream.write_all(&frame).unwrap();
    }
}

#[test]
fn ranks_that_connect_twice_send_garbage_or_vanish_close_as_lost_and_disturb_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let mut ranks: Vec<RawRank> = (0..3).map(|r| RawRank::connect(&socket, r, 3)).collect();
    for r in &mut ranks {
        assert!(matches!(r.read().msg, Some(agent_message::Msg::Control(c)) if c.collecting));
    }
    // The same rank again: refused with the reason, the first connection untouched.
    let mut twin = RawRank::connect(&socket, 1, 3);
    match twin.read().msg {
        Some(agent_message::Msg::Refused(r)) => {
            assert!(r.reason.starts_with("rank 1 of raw"), "{}", r.reason);
            assert!(r.reason.contains("is already attached"), "{}", r.reason);
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(
        twin.stream.read(&mut [0u8; 8]).unwrap(),
        0,
        "the refused connection is closed"
    );
    // A length prefix past the agent's frame limit (1 MiB by default), with nothing behind it: the connection is
    // closed at once, nothing allocated for it.
    let mut claims: Vec<UnixStream> = (0..48)
        .map(|_| {
            let mut s = UnixStream::connect(&socket).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(&(16u32 << 20).to_le_bytes()).unwrap();
            s
        })
        .collect();
    for s in &mut claims {
        assert_eq!(
            s.read(&mut [0u8; 8]).unwrap(),
            0,
            "a 16 MiB claim is closed by the agent"
        );
    }
    // Sizes no application has: refused with the reason, and nothing the agent tells its parent changes (a count
    // past the tree's bound would get the agent itself refused).
    for (rank, nranks, says) in [
        (
            5,
            u32::MAX,
            "announces 4294967295 ranks, more than this agent's max_app_ranks (1048576)",
        ),
        (3, 3, "is not below the application's announced size 3"),
    ] {
        let mut odd = RawRank::connect(&socket, rank, nranks);
        match odd.read().msg {
            Some(agent_message::Msg::Refused(r)) => assert!(r.reason.contains(says), "{}", r.reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    // An application name too long to carry in every round's coverage: refused, naming the bound.
    let mut long = RawRank::connect_as(&socket, &"a".repeat(200), 0, 3);
    match long.read().msg {
        Some(agent_message::Msg::Refused(r)) => assert!(
            r.reason
                .contains("names an application of 200 bytes, longer than the 128 allowed"),
            "{}",
            r.reason
        ),
        other => panic!("not refused: {other:?}"),
    }

    let dump_rounds = |ranks: &mut [RawRank], which: &[usize], rounds: std::ops::Range<u64>| {
        for round in rounds {
            for &i in which {
                ranks[i].dump(i as u32, round);
            }
        }
    };
    dump_rounds(&mut ranks, &[0, 1, 2], 0..5);
    wait_for("rounds 0-4", Duration::from_secs(10), || {
        read_rounds(&store).len() >= 5
    });
    // Rank 2 sends garbage: its connection is closed, its rounds close as lost.
    ranks[2]
        .stream
        .write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff])
        .unwrap();
    // Rank 1 vanishes.
    ranks[1].stream.shutdown(std::net::Shutdown::Both).unwrap();
    wait_for("the agent to drop both", Duration::from_secs(10), || {
        agent.log_text().matches("vanished").count() >= 2
    });
    dump_rounds(&mut ranks, &[0], 5..10);
    wait_for("rounds 5-9", Duration::from_secs(10), || {
        read_rounds(&store).len() >= 10
    });
    let rounds = read_rounds(&store);
    for r in &rounds[..5] {
        assert_eq!((r.covered, r.expected), (3, 3), "{r:?}");
    }
    for r in &rounds[5..10] {
        assert_eq!(
            (r.covered, r.expected, r.missing.get(MissingReason::Lost)),
            (1, 3, 2),
            "{r:?}"
        );
    }
    let log = agent.log_text();
    assert!(log.contains("refused a rank: rank 1 of raw"), "{log}");
    assert!(
        log.contains("rank 2 of raw") && log.contains("bad message"),
        "{log}"
    );
    assert!(
        log.contains("rank 1 of raw") && log.contains("connection closed"),
        "{log}"
    );
    assert!(log.contains("its rounds close as lost"), "{log}");
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn the_c_api_returns_codes_and_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("errors.c");
    std::fs::write(
        &src,
        r#"#include <canopy.h>
#include <stdio.h>
int main(void) {
    int rc = canopy_dump();
    printf("dump before init: %d %s\n", rc, canopy_last_error());
    canopy_timer *t = canopy_timer_get(NULL);
    printf("null timer: %p %s\n", (void *)t, canopy_last_error());
    canopy_start(NULL); canopy_stop(NULL);
    int a = canopy_activity("work"), same = canopy_activity("work");
    canopy_timer *work = canopy_timer_get("work");
    printf("activity: %d %d %s\n", a >= 0, a == same, work ? "timer" : "no timer");
    rc = canopy_activity(NULL);
    printf("null activity: %d %s\n", rc, canopy_last_error());
    rc = canopy_counter_id(NULL);
    printf("null counter: %d %s\n", rc, canopy_last_error());
    canopy_begin(-1); canopy_end(123456); canopy_count(-5, 1.0); canopy_send(-1, 8); /* ignored */
    canopy_begin(a); canopy_send(1, 64); canopy_idle_begin(); canopy_idle_end(); canopy_end(a);
    canopy_count(canopy_counter_id("items"), 2.0);
    rc = canopy_init("errors", 3, 2);
    printf("bad rank: %d %s\n", rc, canopy_last_error());
    rc = canopy_init(NULL, -1, -1);
    printf("init: %d\n", rc);
    if (rc != 0) printf("init error: %s\n", canopy_last_error());
    rc = canopy_init("errors", 0, 1);
    printf("init again: %d %s\n", rc, canopy_last_error());
    printf("finalize: %d\n", canopy_finalize());
    rc = canopy_finalize();
    printf("finalize again: %d %s\n", rc, canopy_last_error());
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("errors");
    let lib = bin_dir();
    let status = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/c/include"))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lcanopy")
        .status()
        .unwrap();
    assert!(status.success());
    let run = |env: &[(&str, &str)]| {
        let out = Command::new(&exe)
            .env("CANOPY_AGENT_SOCKET", dir.path().join("none.sock"))
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = run(&[]);
    assert!(
        out.contains("dump before init: -2 canopy is not initialized"),
        "{out}"
    );
    assert!(out.contains("activity: 1 1 timer"), "{out}");
    assert!(
        out.contains("null activity: -1 canopy_activity: the name is NULL"),
        "{out}"
    );
    assert!(
        out.contains("null counter: -1 canopy_counter_id: the name is NULL"),
        "{out}"
    );
    assert!(
        out.contains("null timer: (nil) canopy_timer_get: the name is NULL"),
        "{out}"
    );
    assert!(
        out.contains("bad rank: -1 rank 3 is not below the size 2"),
        "{out}"
    );
    assert!(out.contains("init: 0\n"), "{out}");
    assert!(
        out.contains("init again: -2 canopy is already initialized"),
        "{out}"
    );
    // No dump was taken: nothing was lost.
    assert!(out.contains("finalize: 0\n"), "{out}");
    assert!(out.contains("finalize again: -2 canopy was finalized"), "{out}");
    // A bad environment variable is named.
    let out = run(&[("CANOPY_QUEUE_DUMPS", "0")]);
    assert!(
        out.contains("init error: bad value \"0\" in CANOPY_QUEUE_DUMPS: must be between 1 and 65536"),
        "{out}"
    );
    let out = run(&[("CANOPY_MODULES", "profile,tau")]);
    assert!(
        out.contains(
            "init error: bad value \"profile,tau\" in CANOPY_MODULES: unknown measurement module \"tau\" (profile, trace, utilization, null)"
        ),
        "{out}"
    );
}

#[test]
fn an_agent_refuses_a_socket_another_agent_serves_and_one_that_would_serve_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut first = start_socket_agent(dir.path(), "agent-0", "127.0.0.1:9", &socket);
    wait_socket(&socket, &mut first);
    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["--insecure", "--parent", "127.0.0.1:9", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("another agent is listening on {}", socket.display())),
        "{err}"
    );
    // The first one still serves: a rank attaches and gets its control.
    let mut rank = RawRank::connect(&socket, 0, 1);
    assert!(matches!(rank.read().msg, Some(agent_message::Msg::Control(_))));

    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["validate", "--socket", "none"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--socket` (from command-line flags): is none and simulate_ranks is 0"),
        "{err}"
    );
}

#[test]
fn rounds_a_rank_dropped_count_it_as_dropped_and_do_not_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    // A minute's time-out: a round that waited for the rank would not be stored within the test's wait.
    let (mut fe, _addr, store) = start_frontend(
        dir.path(),
        &["--streams", "stats,histogram", "--stream-timeout-ms", "60000"],
    );
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &_addr, &socket);
    wait_socket(&socket, &mut agent);
    let mut ranks: Vec<RawRank> = (0..3).map(|r| RawRank::connect(&socket, r, 3)).collect();
    for r in &mut ranks {
        assert!(matches!(r.read().msg, Some(agent_message::Msg::Control(c)) if c.collecting));
    }
    for round in 0..8 {
        for i in [0usize, 2] {
            ranks[i].dump(i as u32, round);
        }
        // Rank 1's queue was full for rounds 3 to 5: it never sent them.
        if !(3..6).contains(&round) {
            ranks[1].dump(1, round);
        }
    }
    wait_for("8 rounds of both streams", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 16
    });
    let mut dropped = reader(&store).rounds(Select::all()).unwrap();
    dropped.sort_by(|a, b| (&a.stream, a.round).cmp(&(&b.stream, b.round)));
    assert_eq!(dropped.len(), 16, "{dropped:?}");
    for row in &dropped {
        let round = row.round;
        let want = if (3..6).contains(&round) {
            (2, 3, 1)
        } else {
            (3, 3, 0)
        };
        assert_eq!(
            (row.covered, row.expected, row.missing.get(MissingReason::Dropped)),
            want,
            "round {round}: {row:?}"
        );
        assert_eq!(
            row.missing.get(MissingReason::Late),
            0,
            "nothing is late: {row:?}"
        );
        if want.2 == 1 {
            assert_eq!(row.missing_reason.as_deref(), Some("dropped: 1"));
        }
    }
    // The histogram's later phases of those rounds went through with the two ranks that sent them.
    let stored = reader(&store);
    let histograms: HashSet<u32> = stored
        .streams()
        .unwrap()
        .iter()
        .filter(|s| s.filter == "histogram")
        .map(|s| s.stream_id)
        .collect();
    let hist = stored
        .results(Select::all().late(false))
        .unwrap()
        .iter()
        .filter(|r| histograms.contains(&r.stream_id) && !r.payload.is_empty())
        .count();
    assert!(hist >= 8, "histogram results: {hist}");
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

/// A log line without its terminal colour codes.
fn strip_colors(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn ranks_far_faster_than_the_tree_drop_and_count_dumps_and_every_stored_round_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    // The histogram needs three trips through the tree per round; tiny iterations offer thousands of rounds
    // a second. A round that waited for a dump that never came would hold the run for the minute's time-out.
    let (mut fe, addr, store) = start_frontend(
        dir.path(),
        &[
            "--streams",
            "histogram",
            "--stream-timeout-ms",
            "60000",
            "--exit-on-fin",
            "true",
        ],
    );
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let exe = bin_dir().join("canopy-stencil");
    let (ranks, iterations) = (4u32, 3000i64);
    let env = [("CANOPY_QUEUE_DUMPS", "4")];
    let mut procs = start_ranks(
        dir.path(),
        &exe,
        &socket,
        ranks,
        &[&iterations.to_string(), "8", "0"],
        &env,
    );
    wait_ranks(dir.path(), &mut procs, Duration::from_secs(60));
    let status = fe.wait_timeout(Duration::from_secs(40));
    if !status.is_some_and(|s| s.success()) {
        // The agent's last lines are mostly drop counts; what the front-end last did says which round waited.
        let tail = |log: String| {
            let lines: Vec<String> = log.lines().rev().take(40).map(str::to_string).collect();
            lines.into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        panic!(
            "front-end did not finish; the agent's last lines:\n{}\nthe front-end's last lines:\n{}",
            tail(agent.log_text()),
            tail(fe.log_text())
        );
    }
    let mut stored = reader(&store).rounds(Select::all()).unwrap();
    stored.sort_by_key(|r| r.round);
    assert!(!stored.is_empty());
    let mut covered = 0;
    let mut dropped_in_rows = 0;
    for row in &stored {
        let away = [
            MissingReason::Late,
            MissingReason::Lost,
            MissingReason::Unspecified,
        ]
        .map(|reason| i64::from(row.missing.get(reason)))
        .iter()
        .sum::<i64>();
        let dropped = i64::from(row.missing.get(MissingReason::Dropped));
        assert_eq!(away, 0, "a round lost ranks or waited for them: {row:?}");
        assert_eq!(
            i64::from(row.covered) + dropped,
            i64::from(row.expected),
            "{row:?}"
        );
        assert_eq!(i64::from(row.expected), i64::from(ranks));
        covered += i64::from(row.covered);
        dropped_in_rows += dropped;
    }
    // The ranks ran far ahead of the tree: most rounds were dropped in the application, and the agent logged it.
    // A round every rank dropped still has its row once the run has ended, every rank counted dropped.
    let every_rank_dropped = stored
        .iter()
        .filter(|r| r.covered == 0 && r.missing.get(MissingReason::Dropped) == ranks)
        .count();
    assert!(
        every_rank_dropped > 0,
        "no round that every rank dropped: the tree kept up, so the test proves nothing"
    );
    let log = agent.log_text();
    assert!(log.contains("reports dumps it could not deliver"), "{log}");
    // Every rank-round is either in a stored round (covered or dropped) or was dropped by every rank; the latter
    // show up in the ranks' own counts, reported to the agent with their dumps and FIN.
    let reported: i64 = log
        .lines()
        .filter(|l| l.contains("reports dumps it could not deliver"))
        .map(strip_colors)
        .filter_map(|l| {
            l.split("dropped=")
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<i64>().ok())
        })
        .sum::<i64>()
        // Dumps the agent held for the start and had to let go (one per line).
        + log.matches("its oldest held dump is dropped").count() as i64;
    // Rounds every rank dropped before the first stored round or after the last have no row.
    let whole_rounds_dropped = (iterations - stored.len() as i64) * i64::from(ranks);
    assert_eq!(
        covered + reported,
        iterations * i64::from(ranks),
        "covered {covered}, dropped in rows {dropped_in_rows}, reported {reported}, whole rounds dropped \
         {whole_rounds_dropped}"
    );
    assert_eq!(reported, dropped_in_rows + whole_rounds_dropped);
}

#[test]
fn an_application_that_announces_more_ranks_than_come_starts_at_the_start_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, store) =
        start_frontend(dir.path(), &["--streams", "stats", "--start-timeout-ms", "500"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    // The application says 6 ranks; 2 come. The run is not blocked: it starts half a second after the first.
    let mut ranks: Vec<RawRank> = (0..2).map(|r| RawRank::connect(&socket, r, 6)).collect();
    for round in 0..3 {
        for (i, r) in ranks.iter_mut().enumerate() {
            r.dump(i as u32, round);
        }
    }
    wait_for("rounds 0-2", Duration::from_secs(10), || {
        read_rounds(&store).len() >= 3
    });
    for r in read_rounds(&store).iter().take(3) {
        assert_eq!((r.covered, r.expected), (2, 6), "{r:?}");
        assert_eq!(r.missing.get(MissingReason::Absent), 4, "{r:?}");
    }
    drop(ranks);
    agent.signal(Signal::SIGTERM);
    fe.signal(Signal::SIGTERM);
    let _ = agent.wait_timeout(Duration::from_secs(10));
    let _ = fe.wait_timeout(Duration::from_secs(10));
}

/// Rows of `trace` at or above round `from`, per (stream, round, rank): the begins of `activity`.
fn traced_begins(store: &Path, from: u64, activity: u64) -> BTreeMap<(u32, u64, u32), u64> {
    let mut out = BTreeMap::new();
    for t in reader(store).trace(Select::all().from_round(from)).unwrap() {
        if t.kind == "begin" && t.event_id == Some(activity) {
            *out.entry((t.stream_id, t.round, t.rank)).or_default() += 1;
        }
    }
    out
}

#[test]
fn a_detail_request_makes_its_ranks_ship_their_trace_and_modules_switch_from_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    // The front-end's configuration puts the trace module in force on every rank from the start.
    let (mut fe, addr, _agent, store, socket) = killed_ranks_tree(
        dir.path(),
        &["--streams", "passthrough", "--modules", "profile,trace"],
    );
    let mut ranks = start_ranks(dir.path(), &exe, &socket, 4, &["100000", "16", "5000"], &[]);
    wait_for("10 rounds", Duration::from_secs(20), || max_round(&store) >= 10);
    // A change reaches every rank within a few rounds (5 ms each); the checks look at rounds well after it.
    let settle = |store: &Path| {
        let sent = max_round(store);
        wait_for("rounds after the change", Duration::from_secs(20), || {
            max_round(store) >= sent + 80
        });
        sent + 60
    };
    assert!(
        reader(&store).trace(Select::all()).unwrap().is_empty(),
        "no rank ships a trace before one is asked for"
    );

    // A detail stream for ranks 1 and 2: they ship their trace, in every passthrough stream.
    let opened = canopy(&addr, &["ctl", "detail", "1-2"]);
    let detail: u32 = opened
        .trim()
        .rsplit("stream ")
        .next()
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no stream id in {opened:?}"));
    settle(&store);
    let sweep = *ids_named(&store, "sweep").iter().next().expect("sweep named");
    // Control applies at each rank's next dump after it arrives; the round after the first traced one is whole.
    let all = traced_begins(&store, 0, sweep);
    let from = (1..=2)
        .map(|rank| {
            all.keys()
                .filter(|k| k.2 == rank)
                .map(|k| k.1)
                .min()
                .unwrap_or_else(|| panic!("rank {rank} shipped no trace: {all:?}"))
        })
        .max()
        .unwrap()
        + 1;
    // The trace module and the profile module saw the same events: as many traced begins of "sweep" in a
    // round as the profile counts calls. The samples are read first, so every round they hold is stored whole
    // when the traces are read.
    let calls: BTreeMap<(u32, u64, u32), u64> = reader(&store)
        .samples(Select::all().from_round(from))
        .unwrap()
        .iter()
        .filter(|s| s.event_id == sweep && (1..=2).contains(&s.rank))
        .map(|s| ((s.stream_id, s.round, s.rank), s.calls.unwrap_or(0)))
        .collect();
    let begins = traced_begins(&store, from, sweep);
    let traced_ranks: BTreeSet<u32> = begins.keys().map(|k| k.2).collect();
    assert_eq!(traced_ranks, BTreeSet::from([1, 2]), "{begins:?}");
    let both: Vec<_> = calls.keys().filter(|k| begins.contains_key(k)).collect();
    assert!(both.len() >= 10, "{calls:?}");
    for k in &calls.keys().cloned().collect::<Vec<_>>() {
        assert_eq!(begins.get(k).copied().unwrap_or(0), calls[k], "{k:?}");
    }
    assert!(
        begins.keys().any(|k| k.0 == detail) && begins.keys().any(|k| k.0 != detail),
        "both streams store the trace: {:?}",
        begins.keys().map(|k| k.0).collect::<BTreeSet<_>>()
    );

    // Closing the detail stream ends the traces.
    canopy(&addr, &["streams", "close", &detail.to_string()]);
    let last_traced = || {
        reader(&store)
            .trace(Select::all())
            .unwrap()
            .iter()
            .map(|t| t.round as i64)
            .max()
            .unwrap_or(-1)
    };
    wait_for("40 rounds without a trace", Duration::from_secs(20), || {
        max_round(&store) >= last_traced() + 40
    });

    // The root switches the profile module off: the profiles go on, with no calls in them; then on again.
    canopy(&addr, &["ctl", "set", "--modules", "null"]);
    let from = settle(&store) as u64;
    let later = reader(&store).samples(Select::all().from_round(from)).unwrap();
    assert!(!later.is_empty() && later.iter().all(|s| s.calls == Some(0)));
    canopy(&addr, &["ctl", "set", "--modules", "profile"]);
    let from = settle(&store) as u64;
    let later = reader(&store).samples(Select::all().from_round(from)).unwrap();
    assert!(
        later
            .iter()
            .filter(|s| s.event_id == sweep)
            .all(|s| s.calls == Some(1))
    );
    assert!(
        reader(&store)
            .trace(Select::all().from_round(from))
            .unwrap()
            .is_empty()
    );
    // Options that name no module run the front-end's configured ones: rank 3 traces again.
    canopy(&addr, &["ctl", "set", "--trace-ranks", "3"]);
    let from = settle(&store) as u64;
    let traced: BTreeSet<u32> = reader(&store)
        .trace(Select::all().from_round(from))
        .unwrap()
        .iter()
        .map(|t| t.rank)
        .collect();
    assert_eq!(traced, BTreeSet::from([3]));

    for r in &mut ranks {
        let _ = r.kill();
        let _ = r.wait();
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn a_rank_that_dumps_by_period_delivers_its_last_partial_period_at_finalize() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let (mut fe, addr, store) =
        start_frontend(dir.path(), &["--streams", "passthrough", "--exit-on-fin", "true"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    // A period far longer than the run: no tick comes, every call is in the dump finalize takes.
    let env = [("CANOPY_DUMP_PERIOD_MS", "600000")];
    let mut ranks = start_ranks(dir.path(), &exe, &socket, 2, &["30", "16", "0"], &env);
    wait_ranks(dir.path(), &mut ranks, Duration::from_secs(30));
    assert!(
        fe.wait_timeout(Duration::from_secs(30))
            .is_some_and(|s| s.success())
    );
    let rounds = read_rounds(&store);
    assert_eq!(rounds.len(), 1, "{rounds:?}");
    assert_eq!((rounds[0].covered, rounds[0].expected), (2, 2));
    let sweep = ids_named(&store, "sweep");
    let calls: BTreeMap<u32, u64> = reader(&store)
        .samples(Select::all())
        .unwrap()
        .iter()
        .filter(|s| sweep.contains(&s.event_id))
        .map(|s| (s.rank, s.calls.unwrap_or(0)))
        .collect();
    assert_eq!(calls, BTreeMap::from([(0, 30), (1, 30)]));
}

/// Per-event counters of real ranks through a real tree: a program that touches a known number of fresh pages
/// and sleeps a known number of times per iteration, run with CANOPY_COUNTERS, has the stats stream's page
/// faults and context switches per event match them, each event's depth at entry, and a hardware counter
/// this VM cannot count reported by name while the rest go on.
#[test]
fn per_event_counters_of_real_ranks_match_the_pages_they_touch_and_the_sleeps_they_take() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, store) = start_frontend(
        dir.path(),
        &["--streams", "stats,passthrough", "--exit-on-fin", "true"],
    );
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let (ranks, iterations, pages, sleeps) = (3u32, 6u64, 1500.0, 4.0);
    let mut procs = start_ranks(
        dir.path(),
        &bin_dir().join("canopy-touch"),
        &socket,
        ranks,
        &[&iterations.to_string(), "1500", "4"],
        &[("CANOPY_COUNTERS", "page-faults,context-switches,cycles,depth")],
    );
    wait_ranks(dir.path(), &mut procs, Duration::from_secs(60));
    let status = fe.wait_timeout(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end:\n{}",
        fe.log_text()
    );

    let stats = reader(&store).stats(Select::all()).unwrap();
    let of = |event: &str, metric: Metric| -> Vec<_> {
        let ids = ids_named(&store, event);
        stats
            .iter()
            .filter(|s| ids.contains(&s.id) && s.metric == metric)
            .cloned()
            .collect()
    };
    let touch = of("touch", Metric::PageFaultsExclusive);
    assert_eq!(touch.len() as u64, iterations, "{touch:?}");
    for s in &touch {
        assert_eq!(s.count, u64::from(ranks), "{s:?}");
        // One fault per page, and a few for the allocator's own pages; never fewer.
        let (min, max) = (s.min.unwrap(), s.max.unwrap());
        assert!(
            min >= pages && max <= pages + 100.0,
            "touch page faults {min}..{max}"
        );
    }
    let nap = of("nap", Metric::ContextSwitchesExclusive);
    assert_eq!(nap.len() as u64, iterations, "{nap:?}");
    for s in &nap {
        let (min, max) = (s.min.unwrap(), s.max.unwrap());
        // One switch per sleep; a busy machine may preempt a rank a few more times. A sleep whose timer
        // expires before the thread gives up its CPU (a virtual CPU held by its host for 200 us at that
        // instant) returns without a switch, so a rank may show one fewer in a round, never none.
        assert!(
            min >= sleeps - 1.0 && max <= sleeps + 10.0,
            "nap switches {min}..{max}"
        );
    }
    // And such a sleep is rare: over every rank and round, at most one switch short per round.
    let switches: f64 = nap.iter().map(|s| s.mean.unwrap() * s.count as f64).sum();
    let least = (iterations * u64::from(ranks)) as f64 * sleeps - iterations as f64;
    assert!(
        switches >= least,
        "nap switches {switches} in all, fewer than {least}"
    );
    // The enclosing event counts its children's faults inclusively, and little of its own exclusively.
    let outer_incl = of("iteration", Metric::PageFaultsInclusive);
    let outer_excl = of("iteration", Metric::PageFaultsExclusive);
    assert_eq!(outer_incl.len() as u64, iterations);
    for (i, e) in outer_incl.iter().zip(&outer_excl) {
        assert!(i.min.unwrap() >= pages, "{i:?}");
        assert!(e.max.unwrap() < 50.0, "{e:?}");
    }
    // The passthrough stream keeps each rank's own counts: every rank, every round, as many faults as pages.
    let touch_ids = ids_named(&store, "touch");
    let per_rank: Vec<_> = reader(&store)
        .event_metrics(Select::all())
        .unwrap()
        .into_iter()
        .filter(|m| touch_ids.contains(&m.event_id) && m.metric == Metric::PageFaultsExclusive)
        .collect();
    assert_eq!(per_rank.len() as u64, u64::from(ranks) * iterations);
    for m in &per_rank {
        let v = m.value.unwrap();
        assert!((pages..pages + 100.0).contains(&v), "{m:?}");
    }
    let last_total: f64 = per_rank.iter().filter_map(|m| m.total).fold(0.0, f64::max);
    assert!(last_total >= pages * iterations as f64, "total {last_total}");
    let depths: BTreeSet<u64> = ["iteration", "touch", "nap"]
        .iter()
        .flat_map(|e| of(e, Metric::DepthAtEntry))
        .map(|s| s.max.unwrap() as u64 * 10 + s.min.unwrap() as u64)
        .collect();
    assert_eq!(
        depths,
        BTreeSet::from([11, 22]),
        "depth at entry: iteration 1, touch and nap 2"
    );
    // No PMU in this VM: cycles is reported by each rank, by name and reason, and left out.
    if std::fs::read_dir("/sys/bus/event_source/devices/cpu").is_err() {
        for r in 0..ranks {
            let log = std::fs::read_to_string(dir.path().join(format!("rank{r}.log"))).unwrap();
            assert!(
                log.contains("canopy: counter \"cycles\" is unavailable (the machine has no such counter"),
                "rank {r}:\n{log}"
            );
            assert!(log.contains("unavailable: cycles:"), "rank {r}:\n{log}");
        }
        assert!(of("touch", Metric::CyclesExclusive).is_empty());
        // And once per rank in its agent's log, so an operator sees it without the application's output.
        let log = agent.log_text();
        let told = log
            .lines()
            .filter(|l| l.contains("counter \"cycles\" is unavailable (the machine has no such counter"))
            .count();
        assert_eq!(told, ranks as usize, "{log}");
    }
}

/// Per application, the events and the ranks that reported them in rounds `from..to`; the coverage of those
/// rounds, as (covered, expected, sampled out), in all and per application (`round_apps`); and the
/// applications the stats stream's rows stand for.
type Reported = (
    BTreeMap<String, (BTreeSet<String>, BTreeSet<u32>)>,
    BTreeSet<(u32, u32, u32)>,
    BTreeSet<(String, u32, u32, u32)>,
    BTreeSet<String>,
);

fn reported(store: &Path, from: u64, to: u64) -> Reported {
    let stored = reader(store);
    let names: HashMap<u64, String> = stored.names().unwrap().into_iter().collect();
    let mut by_app: BTreeMap<String, (BTreeSet<String>, BTreeSet<u32>)> = BTreeMap::new();
    for s in stored.samples(Select::all().from_round(from)).unwrap() {
        if s.round < to {
            let app = by_app.entry(s.app.clone()).or_default();
            app.0.insert(names[&s.event_id].clone());
            app.1.insert(s.rank);
        }
    }
    let coverage = stored
        .rounds(Select::all().from_round(from))
        .unwrap()
        .iter()
        .filter(|r| r.round < to)
        .map(|r| (r.covered, r.expected, r.missing.get(MissingReason::SampledOut)))
        .collect();
    let per_app = stored
        .round_apps(Select::all().from_round(from))
        .unwrap()
        .into_iter()
        .filter(|r| r.round < to)
        .map(|r| {
            (
                r.app,
                r.covered,
                r.expected,
                r.missing.get(MissingReason::SampledOut),
            )
        })
        .collect();
    let stats_apps = stored
        .stats(Select::all().from_round(from))
        .unwrap()
        .into_iter()
        .filter(|r| r.round < to)
        .filter_map(|r| r.app)
        .collect();
    (by_app, coverage, per_app, stats_apps)
}

/// Waits until the latest rounds show `want` (a change of options has reached every rank, at whatever pace
/// the machine allows), then checks that the ten rounds from there all show it.
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of the store other processes write; no runtime worker is blocked"
)]
fn in_force(store: &Path, want: &Reported) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let from = loop {
        let max = max_round(store).max(4) as u64;
        let seen = reported(store, max - 4, max - 1);
        if seen == *want {
            break max - 4;
        }
        assert!(
            Instant::now() < deadline,
            "never in force: {want:?}; the latest rounds show {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    wait_for("ten rounds more", Duration::from_secs(20), || {
        max_round(store) >= from as i64 + 14
    });
    assert_eq!(
        reported(store, from, from + 10),
        *want,
        "rounds {from} to {}",
        from + 9
    );
}

#[test]
fn each_application_in_one_tree_runs_its_own_options() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c_example(dir.path(), false);
    let (mut fe, addr, _agent, store, socket) =
        killed_ranks_tree(dir.path(), &["--streams", "passthrough,stats"]);
    // A simulation and an in-situ analysis, three ranks each, against one agent.
    let mut ranks = Vec::new();
    for app in ["sim", "analysis"] {
        let logs = dir.path().join(app);
        std::fs::create_dir(&logs).unwrap();
        let args = ["100000", "16", "5000"];
        ranks.push(start_ranks(
            &logs,
            &exe,
            &socket,
            3,
            &args,
            &[("CANOPY_APP", app)],
        ));
    }
    wait_for("10 rounds", Duration::from_secs(20), || max_round(&store) >= 10);
    let events = |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
    let every_event = events(&["halo_exchange", "iteration", "residual", "sweep"]);
    let ranks_0_to_2: BTreeSet<u32> = [0, 1, 2].into();
    let apps = |entries: &[(&str, &BTreeSet<String>)]| {
        entries
            .iter()
            .map(|(app, events)| (app.to_string(), ((*events).clone(), ranks_0_to_2.clone())))
            .collect::<BTreeMap<_, _>>()
    };
    // Each application's part of every round: (application, covered, expected, sampled out).
    let whole = |app: &str| (app.to_string(), 3, 3, 0);
    let both_whole: BTreeSet<_> = [whole("analysis"), whole("sim")].into();
    let analysis_off: BTreeSet<_> = [("analysis".to_string(), 0, 3, 3), whole("sim")].into();
    let stats_of = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    in_force(
        &store,
        &(
            apps(&[("sim", &every_event), ("analysis", &every_event)]),
            [(6, 6, 0)].into(),
            both_whole.clone(),
            stats_of(&["analysis", "sim"]),
        ),
    );

    // An include for the simulation alone: the analysis's events stay whole, every rank of both is covered.
    let applied = canopy(&addr, &["ctl", "set", "--app", "sim", "--include", "^halo"]);
    assert_eq!(applied.trim(), "options of application \"sim\": applied");
    let halo = events(&["halo_exchange"]);
    in_force(
        &store,
        &(
            apps(&[("sim", &halo), ("analysis", &every_event)]),
            [(6, 6, 0)].into(),
            both_whole.clone(),
            stats_of(&["analysis", "sim"]),
        ),
    );

    // The analysis sampled to 0: none of its ranks reports, each counts as sampled out (neither lost nor late);
    // the simulation keeps its own options.
    canopy(&addr, &["ctl", "set", "--app", "analysis", "--sample-below", "0"]);
    in_force(
        &store,
        &(
            apps(&[("sim", &halo)]),
            [(3, 6, 3)].into(),
            analysis_off.clone(),
            stats_of(&["sim"]),
        ),
    );

    // Global options replace the global ones alone: the analysis stays disabled, the simulation keeps its
    // include (with the global exclude, which leaves its event alone).
    canopy(&addr, &["ctl", "set", "--exclude", "^resid"]);
    in_force(
        &store,
        &(
            apps(&[("sim", &halo)]),
            [(3, 6, 3)].into(),
            analysis_off.clone(),
            stats_of(&["sim"]),
        ),
    );

    // Both back on the global options: every rank, every event but the excluded one.
    canopy(&addr, &["ctl", "set", "--app", "analysis"]);
    canopy(&addr, &["ctl", "set", "--app", "sim"]);
    let unexcluded = events(&["halo_exchange", "iteration", "sweep"]);
    in_force(
        &store,
        &(
            apps(&[("sim", &unexcluded), ("analysis", &unexcluded)]),
            [(6, 6, 0)].into(),
            both_whole.clone(),
            stats_of(&["analysis", "sim"]),
        ),
    );

    // Bad options for one application are refused, naming it.
    let refused = canopy_integration_tests::canopy_command()
        .args([
            "ctl",
            "set",
            "--app",
            "analysis",
            "--include",
            "(",
            "--frontend",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("apps[\"analysis\"]: bad pattern \"(\""),
        "{message}"
    );

    for r in ranks.iter_mut().flatten() {
        let _ = r.kill();
        let _ = r.wait();
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn a_rank_is_sent_its_own_application_s_options_and_no_other_s() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, _store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    canopy(&addr, &["ctl", "set", "--app", "other", "--sample-below", "0"]);
    let mut rank = RawRank::connect(&socket, 0, 1);
    let mut options = || match rank.read().msg {
        Some(agent_message::Msg::Control(c)) => c.options.unwrap_or_default(),
        other => panic!("a control, not {other:?}"),
    };
    assert!(options().apps.is_empty(), "the other application's entry");
    canopy(&addr, &["ctl", "set", "--app", "raw", "--include", "^work"]);
    let own = loop {
        let o = options();
        assert!(o.apps.iter().all(|a| a.app == "raw"), "{o:?}");
        if !o.apps.is_empty() {
            break o;
        }
    };
    assert_eq!(
        own.apps,
        [canopy_proto::v1::AppOptions {
            app: "raw".into(),
            include: vec!["^work".into()],
            ..Default::default()
        }]
    );
    drop(rank);
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}
