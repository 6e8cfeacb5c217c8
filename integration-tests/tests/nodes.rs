//! The node stream end to end: four agents (samplers at their default, a sample per round) under two relays and
//! the front-end on loopback, a `passthrough` stream of the ranks' profiles beside a `nodes` stream. Every CPU of
//! the node is loaded for 1.5 s in the middle of the run, and the node stream shows it against the second before;
//! every round holds one sample per agent naming its ranks, and a rank's round finds its node's sample in the
//! store.
//!
//! The node's CPU is shared with whatever else runs on the machine, so the test asks what a load must do whatever
//! the rest does: take the idle time, raise the user share, and count at least the user time the busy threads
//! had. One test in this file: no other test of its binary runs beside it.

#![allow(
    clippy::disallowed_types,
    reason = "the busy threads run for a span of real time, measured by the wall clock"
)]

use std::time::{Duration, Instant};

use canopy_integration_tests::{NodeSampleRow, Select, TreeBuilder, assert_eventually, reader};

const AGENTS: usize = 4;
const RANKS: u32 = 16;
const PERIOD_MS: u64 = 100;
/// The node stream's id: the second stream opened.
const NODES: u32 = 2;

/// User CPU time of the calling thread so far, in seconds (utime of /proc/thread-self/stat, in clock ticks).
fn thread_user_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime is the 12th, in 1/100 s.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .nth(11)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    ticks as f64 / 100.0
}

/// Spins a thread on every CPU of the node for `load`; returns the user CPU seconds they got, together.
fn busy(load: Duration) -> f64 {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let end = Instant::now() + load;
    let threads: Vec<_> = (0..cpus)
        .map(|_| {
            std::thread::spawn(move || {
                let before = thread_user_seconds();
                let mut x = 0u64;
                while Instant::now() < end {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                }
                thread_user_seconds() - before
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

/// The samples of one node whose whole interval lies in [from, to] (unix ns).
fn within<'a>(rows: &'a [NodeSampleRow], node: &str, from: u64, to: u64) -> Vec<&'a NodeSampleRow> {
    rows.iter()
        .filter(|r| r.node_id == node && r.cpu_user_share.is_some())
        .filter(|r| {
            let end = r.sample_unix_ns.unwrap_or(0);
            end <= to && end.saturating_sub(r.interval_ns.unwrap_or(u64::MAX)) >= from
        })
        .collect()
}

/// Over some samples: the mean user (with nice) and idle (with iowait) shares, and the node's user CPU seconds
/// per second.
fn cpu_of(samples: &[&NodeSampleRow]) -> (f64, f64, f64) {
    let n = samples.len().max(1) as f64;
    let user = |r: &NodeSampleRow| r.cpu_user_share.unwrap() + r.cpu_nice_share.unwrap();
    let mean_user = samples.iter().map(|r| user(r)).sum::<f64>() / n;
    let mean_idle = samples
        .iter()
        .map(|r| r.cpu_idle_share.unwrap() + r.cpu_iowait_share.unwrap())
        .sum::<f64>()
        / n;
    let seconds: f64 = samples.iter().map(|r| r.interval_ns.unwrap() as f64 / 1e9).sum();
    let user_seconds: f64 = samples
        .iter()
        .map(|r| user(r) * f64::from(r.cpus.unwrap()) * r.interval_ns.unwrap() as f64 / 1e9)
        .sum();
    (mean_user, mean_idle, user_seconds / seconds.max(1e-9))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_node_shows_in_the_node_stream_and_a_ranks_round_joins_its_nodes_sample() {
    let mut tree = TreeBuilder {
        agents: AGENTS,
        fanout: 2,
        ranks: RANKS,
        rounds: 45,
        period_ms: PERIOD_MS,
        events: 5,
        streams: vec!["passthrough".into(), "nodes".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let started = canopy_core::node::unix_ns();
    // A second of the node at rest (the tree's own work aside), then 1.5 s of every CPU busy.
    let store = tree.store.clone();
    let stored = move || {
        canopy_integration_tests::StoreReader::open(&store)
            .and_then(|r| r.node_samples(Select::all().stream(NODES)))
            .map_or(0, |rows| rows.len())
    };
    assert_eventually!(
        stored() >= 12 * AGENTS,
        Duration::from_secs(20),
        "the node stream stores no rounds"
    );
    let busy_from = canopy_core::node::unix_ns();
    let load = Duration::from_millis(1500);
    let spun = tokio::task::spawn_blocking(move || busy(load)).await.unwrap();
    let busy_to = canopy_core::node::unix_ns();
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");

    let stored = reader(&tree.store);
    let rows = stored
        .node_samples(Select::all().stream(NODES).late(false))
        .unwrap();
    let rounds = stored.rounds(Select::all().stream(NODES)).unwrap();
    assert!(rounds.len() >= 40, "{} rounds", rounds.len());
    let host = canopy_runtime::net::hostname();
    for r in &rounds {
        assert_eq!((r.covered, r.expected), (RANKS, RANKS), "{r:?}");
        // One sample per agent, sorted by node id, each naming its agent's ranks.
        let nodes: Vec<&NodeSampleRow> = rows.iter().filter(|n| n.round == r.round).collect();
        let ids: Vec<String> = nodes.iter().map(|n| n.node_id.clone()).collect();
        let want: Vec<String> = (0..AGENTS).map(|k| format!("agent:{k}")).collect();
        assert_eq!(ids, want, "round {}", r.round);
        for (k, n) in nodes.iter().enumerate() {
            let per = RANKS as usize / AGENTS;
            assert_eq!(n.ranks, format!("sim:{}-{}", k * per, k * per + per - 1));
            assert_eq!(n.hostname, host);
            let cpu = [
                n.cpu_user_share,
                n.cpu_nice_share,
                n.cpu_system_share,
                n.cpu_idle_share,
                n.cpu_iowait_share,
                n.cpu_irq_share,
                n.cpu_steal_share,
            ];
            // A round closed within a clock tick of the previous one has no CPU share; the others add up to 1.
            if cpu.iter().all(Option::is_some) {
                let sum: f64 = cpu.iter().flatten().sum();
                assert!((sum - 1.0).abs() < 1e-9, "{n:?}");
            }
            assert!(n.mem_used_bytes.unwrap() <= n.mem_total_bytes.unwrap(), "{n:?}");
            assert!(n.load_1m.is_some() && n.net_rx_bytes.is_some(), "{n:?}");
        }
    }

    // The load shows, whatever else runs on the machine: the busy threads take the CPU time that was idle, so
    // the idle share falls to at most half of what it was at rest while the user share rises; and the user CPU
    // time the node stream counts is at least what the busy threads themselves got.
    let rest = within(&rows, "agent:0", started, busy_from);
    let loaded = within(&rows, "agent:0", busy_from, busy_to);
    assert!(
        rest.len() >= 5 && loaded.len() >= 8,
        "{} and {} samples",
        rest.len(),
        loaded.len()
    );
    let (rest_user, rest_idle, _) = cpu_of(&rest);
    let (loaded_user, loaded_idle, loaded_rate) = cpu_of(&loaded);
    let spun_rate = spun / load.as_secs_f64();
    let figures = format!(
        "at rest: user {rest_user:.3}, idle {rest_idle:.3} ({} samples); loaded: user {loaded_user:.3}, idle \
         {loaded_idle:.3}, {loaded_rate:.2} CPU-s/s of user time ({} samples); the busy threads got \
         {spun_rate:.2} CPU-s/s",
        rest.len(),
        loaded.len()
    );
    eprintln!("node stream: {figures}");
    assert!(
        loaded_idle <= 0.5 * rest_idle + 0.02 && loaded_user > rest_user,
        "the load does not show in the node stream: {figures}"
    );
    assert!(
        loaded_rate >= 0.8 * spun_rate,
        "the node stream counts less user time than the busy threads had: {figures}"
    );

    // A rank's round joins its node's sample: the rank's profile of round r in the passthrough stream, and the
    // sample of round r of the agent that serves it.
    let profiles = stored.samples(Select::all().stream(1).late(false)).unwrap();
    let mut joined = 0;
    for p in profiles.iter().filter(|p| p.round % 7 == 3) {
        let node = stored
            .rank_node_sample(NODES, p.round, &p.app, p.rank)
            .unwrap()
            .unwrap_or_else(|| panic!("rank {} of round {} has no node sample", p.rank, p.round));
        let agent = p.rank as usize / (RANKS as usize / AGENTS);
        assert_eq!(node.node_id, format!("agent:{agent}"), "{p:?}");
        assert_eq!(node.round, p.round);
        let row = rows
            .iter()
            .find(|n| n.round == p.round && n.node_id == node.node_id)
            .unwrap();
        assert_eq!(&node, row);
        joined += 1;
    }
    assert!(joined >= 5 * RANKS as usize * 5, "{joined} rank rows joined");
    assert_eq!(stored.rank_node_sample(NODES, 3, "sim", RANKS).unwrap(), None);
}
