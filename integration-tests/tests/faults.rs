//! A cluster's link faults between a relay and the front-end, made by a fault proxy in the path: a link that
//! stalls for 20 s (longer than the keep-alive time-out: both ends give the connection up), one that stalls for
//! 3 s (the link holds; the front-end closes rounds without the relay), one that resets, a slow one, and one that
//! loses what it carried up after the parent had closed those rounds. The relay comes back to the same parent,
//! which asks it for what it sent that the parent does not hold: every rank-round of the run is covered, or late
//! with its data, or counted with its reason; and the relay catches up on the multi-phase histogram as on stats.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::accounting::{assert_accounted, assert_every_round_has_its_row};
use canopy_integration_tests::{
    FaultProxy, Proc, RoundRow, SimAgent, read_rounds, reader, start_frontend, start_relay, wait_for,
};
use canopy_proto::v1::{MissingReason, NodeState};
use nix::sys::signal::Signal;

const RANKS_PER_AGENT: u32 = 8;
const AGENTS: u32 = 4;
const RANKS: u32 = RANKS_PER_AGENT * AGENTS;

/// A front-end, relay-0 under it through a fault proxy and relay-1 directly, two agents of simulated ranks under
/// each relay.
struct Tree {
    fe: Proc,
    store: std::path::PathBuf,
    proxy: FaultProxy,
    _relays: Vec<Proc>,
    _agents: Vec<Proc>,
}

fn tree(dir: &Path) -> Tree {
    let args = [
        "--streams",
        "stats,histogram",
        "--stream-timeout-ms",
        "1000",
        "--expect-ranks",
        &RANKS.to_string(),
    ];
    let (fe, fe_addr, store) = start_frontend(dir, &args);
    let proxy = FaultProxy::start(&fe_addr);
    let (relay0, addr0) = start_relay(dir, "relay-0", proxy.addr(), "127.0.0.1:0");
    let (relay1, addr1) = start_relay(dir, "relay-1", &fe_addr, "127.0.0.1:0");
    let agents = (0..AGENTS)
        .map(|i| {
            let parent = if i < 2 { &addr0 } else { &addr1 };
            let id = format!("agent-{i}");
            SimAgent {
                id: &id,
                parents: parent,
                ranks: RANKS_PER_AGENT,
                offset: i * RANKS_PER_AGENT,
                total: RANKS,
                period_ms: 20,
                rounds: 0,
            }
            .start(dir)
        })
        .collect();
    wait_for("10 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == RANKS).count() >= 10
    });
    Tree {
        fe,
        store,
        proxy,
        _relays: vec![relay0, relay1],
        _agents: agents,
    }
}

/// Waits until relay-0 is attached and `n` more full rounds of each stream are stored, then ends the run and
/// returns the stats stream's rounds.
fn finish(mut t: Tree, n: usize) -> Vec<RoundRow> {
    wait_for("relay-0 attached", Duration::from_secs(30), || {
        reader(&t.store)
            .node("relay-0")
            .unwrap()
            .is_some_and(|r| r.state == NodeState::Attached)
    });
    let seen = read_rounds(&t.store).last().unwrap().round;
    // Whole rounds of both streams: relay-0's histogram rounds that the front-end closed without it end there, so
    // they do not hold its window and it catches up with relay-1.
    wait_for(
        "full rounds of each stream after the fault",
        Duration::from_secs(40),
        || {
            let rounds = read_rounds(&t.store);
            [1, 2].iter().all(|stream| {
                rounds
                    .iter()
                    .filter(|r| r.stream_id == *stream && r.round > seen && r.covered == RANKS)
                    .count()
                    >= n
            })
        },
    );
    // Late data still on its way lands before the run ends.
    std::thread::sleep(Duration::from_secs(2));
    t.fe.signal(Signal::SIGTERM);
    assert!(t.fe.wait_timeout(Duration::from_secs(30)).is_some());
    // The stats stream accounts for every rank-round; histogram rounds under way when a link broke have no last
    // phase, and count their ranks late without data.
    read_rounds(&t.store)
        .into_iter()
        .filter(|r| r.stream_id == 1)
        .collect()
}

/// Every round has its row, and each of its rank-rounds is covered, or arrived late, or was dropped in the
/// application (the agents held their ranks while the tree did not read) and counted so, or stopped as the run
/// ended; none is counted twice. Returns the rank-rounds that arrived late.
fn assert_nothing_lost(rounds: &[RoundRow]) -> u32 {
    assert_every_round_has_its_row(rounds);
    assert_accounted(rounds, RANKS, &[MissingReason::Dropped, MissingReason::Stopped])
}

#[test]
fn a_link_that_stalls_for_20_s_loses_no_rank_round() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    t.proxy.stall();
    std::thread::sleep(Duration::from_secs(20));
    t.proxy.resume();
    let log = dir.path().join("relay-0.log");
    let rounds = finish(t, 20);
    let late = assert_nothing_lost(&rounds);
    let relay_log = std::fs::read_to_string(log).unwrap();
    assert!(
        relay_log.contains("back with the same parent: sending again what it does not hold"),
        "{relay_log}"
    );
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}

/// Shorter than the keep-alive time-out: the link holds, and everything relay-0 sent in the 3 s reaches the
/// front-end after it closed those rounds. Told that those histogram rounds ended without it, relay-0 and its
/// agents stop waiting for their last phase, so they are not left a window of rounds behind for good.
#[test]
fn a_link_that_stalls_for_3_s_leaves_its_relay_behind_for_no_longer() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    t.proxy.stall();
    std::thread::sleep(Duration::from_secs(3));
    t.proxy.resume();
    let rounds = finish(t, 20);
    let late = assert_nothing_lost(&rounds);
    assert!(late > 0, "the stalled rounds were completed late: {late}");
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}

/// The link stalls as the run ends: the front-end drains while relay-0's packets wait in the stalled link, and
/// closes those rounds without it. Relay-0 and its agents hear the drain once the link moves again and finish at
/// the round they had reached (their window was full): the rounds after it never had their ranks, which count as
/// stopped there rather than late for ever.
#[test]
fn a_link_that_stalls_as_the_run_ends_counts_the_rounds_its_ranks_never_reached_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tree(dir.path());
    t.proxy.stall();
    std::thread::sleep(Duration::from_secs(3));
    t.fe.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_secs(1));
    t.proxy.resume();
    assert!(t.fe.wait_timeout(Duration::from_secs(60)).is_some());
    let rounds: Vec<RoundRow> = read_rounds(&t.store)
        .into_iter()
        .filter(|r| r.stream_id == 1)
        .collect();
    let late = assert_nothing_lost(&rounds);
    let stopped: u32 = rounds.iter().map(|r| r.missing.get(MissingReason::Stopped)).sum();
    assert!(
        stopped >= 2 * RANKS_PER_AGENT,
        "the rounds relay-0's ranks never reached count them stopped: {stopped}"
    );
    eprintln!(
        "{} rounds, {late} rank-rounds late with their data, {stopped} stopped",
        rounds.len()
    );
}

#[test]
fn a_link_that_resets_loses_no_rank_round() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    // Each time with 3 s of packets in flight, which the reset loses: the relay has sent them, the front-end
    // never sees them.
    for _ in 0..2 {
        t.proxy.stall();
        std::thread::sleep(Duration::from_secs(3));
        t.proxy.reset();
        t.proxy.resume();
        std::thread::sleep(Duration::from_secs(1));
    }
    let rounds = finish(t, 20);
    let late = assert_nothing_lost(&rounds);
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}

/// The relay's packets are held on the way up while the front-end's messages still reach the relay: the front-end
/// closes those rounds without relay-0 (its time-out) and says so down the link, and only then does the link break,
/// losing the packets it held. The relay must have kept its copies of what the front-end never read, though their
/// rounds closed, and send them again when it is back.
#[test]
fn packets_lost_on_a_link_after_their_rounds_closed_are_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    for _ in 0..2 {
        t.proxy.stall_up();
        // Three round time-outs: rounds close without relay-0 and the closing reaches it.
        std::thread::sleep(Duration::from_secs(3));
        t.proxy.reset();
        t.proxy.resume();
        std::thread::sleep(Duration::from_secs(1));
    }
    let rounds = finish(t, 20);
    let late = assert_nothing_lost(&rounds);
    assert!(
        late > 0,
        "the rounds closed without relay-0 were completed late: {late}"
    );
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}

#[test]
fn a_slow_link_of_20_ms_each_way_loses_no_rank_round() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    t.proxy.delay(Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(5));
    let rounds = finish(t, 20);
    assert_nothing_lost(&rounds);
}
