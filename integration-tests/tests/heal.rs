//! A relay killed and not restarted: its orphans attach to the next parent of their list, the adopter counts
//! their ranks, no rank is expected twice, and what the relay held comes again from its orphans.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, SimAgent, read_rounds, reader, start_frontend, start_relay, wait_for};
use canopy_proto::v1::{MissingReason, NodeState};
use nix::sys::signal::Signal;

#[test]
fn orphans_of_a_killed_relay_are_adopted_and_every_round_expects_each_rank_once_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, store) = start_frontend(
        dir.path(),
        &["--expect-ranks", "32", "--stream-timeout-ms", "500"],
    );
    let (mut relay0, relay0_addr) = start_relay(dir.path(), "relay-0", &fe_addr, "127.0.0.1:0");
    let (_relay1, relay1_addr) = start_relay(dir.path(), "relay-1", &fe_addr, "127.0.0.1:0");
    // Each agent's parents: its relay, then the front-end.
    let agent = |id: &str, relay: &str, offset: u32| {
        SimAgent {
            id,
            parents: &format!("{relay},{fe_addr}"),
            ranks: 8,
            offset,
            total: 32,
            period_ms: 20,
            rounds: 0,
        }
        .start(dir.path())
    };
    let agents = [
        agent("agent-0", &relay0_addr, 0),
        agent("agent-1", &relay0_addr, 8),
        agent("agent-2", &relay1_addr, 16),
        agent("agent-3", &relay1_addr, 24),
    ];
    wait_for("10 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == 32).count() >= 10
    });
    // The relay holds rounds of agent-0 while it waits for agent-1 (stopped), and dies holding them.
    agents[1].signal(Signal::SIGSTOP);
    std::thread::sleep(Duration::from_millis(200));
    let killed_at = Instant::now();
    relay0.signal(Signal::SIGKILL);
    let _ = relay0.child.wait();
    std::thread::sleep(Duration::from_millis(50));
    agents[1].signal(Signal::SIGCONT);
    let last_before = read_rounds(&store).last().unwrap().round;
    // Adopted by the front-end: rounds are whole again, soon.
    wait_for("full rounds after the adoption", Duration::from_secs(10), || {
        read_rounds(&store)
            .iter()
            .any(|r| r.round > last_before + 2 && r.covered == 32)
    });
    let recovered = killed_at.elapsed();
    wait_for(
        "10 full rounds after the adoption",
        Duration::from_secs(20),
        || {
            read_rounds(&store)
                .iter()
                .filter(|r| r.round > last_before + 2 && r.covered == 32)
                .count()
                >= 10
        },
    );
    eprintln!("back to full coverage {recovered:?} after the kill");
    assert!(recovered < Duration::from_secs(3), "{recovered:?}");
    // No rank was expected twice, nor left out; no rank-round was lost: what the dead relay held came again
    // from its orphans, into the round or late, and nothing came twice.
    let rounds = read_rounds(&store);
    let upto = rounds.last().unwrap().round.saturating_sub(5);
    for r in rounds.iter().filter(|r| r.round <= upto) {
        assert_eq!(r.expected, 32, "{r:?}");
        assert_eq!(
            r.covered + r.late_ranks,
            32,
            "a rank-round lost or counted twice: {r:?}"
        );
    }
    // The agents show attached to their adopter, and their history the way there.
    let nodes = reader(&store).nodes().unwrap();
    for id in ["agent-0", "agent-1"] {
        let n = nodes.iter().find(|n| n.node_id == id).unwrap();
        assert_eq!(
            (n.state, n.parent.as_deref()),
            (NodeState::Attached, Some("frontend")),
            "{n:?}"
        );
        let history: Vec<(Option<String>, NodeState)> = reader(&store)
            .node_history(id)
            .unwrap()
            .into_iter()
            .map(|c| (c.parent, c.state))
            .collect();
        assert_eq!(
            history.first(),
            Some(&(Some("relay-0".into()), NodeState::Attached)),
            "{history:?}"
        );
        assert_eq!(
            history.last(),
            Some(&(Some("frontend".into()), NodeState::Attached)),
            "{history:?}"
        );
    }
}

/// Trees of random shape as real processes, a relay killed with SIGKILL at a random moment: every round of the
/// run is stored, each rank expected once in it, and each rank-round either in the round or among its late
/// arrivals, never both.
#[test]
fn no_rank_round_is_lost_or_counted_twice_whatever_the_tree_and_the_moment_a_relay_dies() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 4,
        max_shrink_iters: 0,
        failure_persistence: None,
        ..Config::default()
    });
    let trees = (2usize..=3).prop_flat_map(|fanout| {
        (
            Just(fanout),
            (fanout + 1)..=7,
            0u64..100,
            2u64..=64,
            any::<prop::sample::Index>(),
        )
    });
    runner
        .run(&trees, |(fanout, agents, kill_after_ms, in_flight, victim)| {
            relay_killed_in_a_tree(fanout, agents, kill_after_ms, in_flight, victim);
            Ok(())
        })
        .unwrap();
}

fn relay_killed_in_a_tree(
    fanout: usize,
    agents: usize,
    kill_after_ms: u64,
    in_flight: u64,
    victim: proptest::sample::Index,
) {
    const ROUNDS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let topology = canopy_topology::Topology::for_leaves(agents, fanout).unwrap();
    let ranks = agents as u32 * 4;
    let (mut fe, fe_addr, store) = start_frontend(
        dir.path(),
        &[
            "--expect-ranks",
            &ranks.to_string(),
            "--exit-on-fin",
            "true",
            "--max-rounds-in-flight",
            &in_flight.to_string(),
        ],
    );
    let root = topology.root().clone();
    let mut addr_of = std::collections::HashMap::from([(root.to_string(), fe_addr)]);
    // A node's parent, then every ancestor up to the root, as `canopy up` gives them.
    let parents_of = |n: &canopy_topology::NodeName, addr_of: &std::collections::HashMap<String, String>| {
        let mut list = Vec::new();
        let mut at = topology.parent(n).cloned();
        while let Some(p) = at {
            list.push(addr_of[&p.to_string()].clone());
            at = topology.parent(&p).cloned();
        }
        list.join(",")
    };
    let mut relays = Vec::new();
    for n in topology
        .nodes()
        .filter(|n| **n != root && !topology.children(n).is_empty())
    {
        let (relay, addr) = start_relay(
            dir.path(),
            &n.to_string(),
            &parents_of(n, &addr_of),
            "127.0.0.1:0",
        );
        addr_of.insert(n.to_string(), addr);
        relays.push(relay);
    }
    let mut procs = Vec::new();
    for (i, leaf) in topology.leaves().into_iter().enumerate() {
        let agent = SimAgent {
            id: &leaf.to_string(),
            parents: &parents_of(leaf, &addr_of),
            ranks: 4,
            offset: i as u32 * 4,
            total: ranks,
            period_ms: 20,
            rounds: ROUNDS,
        };
        procs.push(agent.start(dir.path()));
    }
    let victim = victim.index(relays.len());
    let shape = format!(
        "{agents} agents, fanout {fanout}, {in_flight} rounds in flight, {} killed {kill_after_ms} ms after round 3",
        relays[victim].name
    );
    wait_for("3 rounds", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 3
    });
    std::thread::sleep(Duration::from_millis(kill_after_ms));
    relays[victim].signal(Signal::SIGKILL);
    let _ = relays[victim].child.wait();
    assert!(
        fe.wait_timeout(Duration::from_secs(30)).is_some(),
        "{shape}: the run did not finish"
    );
    let stored = read_rounds(&store);
    let table: Vec<String> = stored
        .iter()
        .map(|r| {
            format!(
                "{}:{}+{}/{} {:?}",
                r.round, r.covered, r.late_ranks, r.expected, r.missing_reason
            )
        })
        .collect();
    assert_eq!(stored.len() as u64, ROUNDS, "{shape}: rounds stored {table:?}");
    for r in &stored {
        assert_eq!(r.expected, ranks, "{shape}: {r:?}");
        assert_eq!(
            r.covered + r.late_ranks,
            ranks,
            "{shape}: a rank-round lost or counted twice: {r:?}"
        );
    }
}

/// A relay stopped (SIGSTOP) for 25 s under load: its agents give it up at the keep-alive time-out and are
/// adopted by the front-end; when it runs again it comes back with none of their ranks. Every rank is expected
/// once in every round, and every rank-round is in its round, late, or missing with its reason (none lost).
/// Two relays under the front-end at `fe_addr`, two agents of 16 simulated ranks under each (100 ms rounds), each
/// agent listing its relay and then the front-end as parents, with `agent_args` more.
struct RelaysAndAgents {
    relay0: Proc,
    _relay1: Proc,
    _agents: Vec<Proc>,
}

fn relays_and_agents(dir: &std::path::Path, fe_addr: &str, agent_args: &[&str]) -> RelaysAndAgents {
    let (relay0, relay0_addr) = start_relay(dir, "relay-0", fe_addr, "127.0.0.1:0");
    let (relay1, relay1_addr) = start_relay(dir, "relay-1", fe_addr, "127.0.0.1:0");
    let agents = [
        ("agent-0", &relay0_addr),
        ("agent-1", &relay0_addr),
        ("agent-2", &relay1_addr),
        ("agent-3", &relay1_addr),
    ]
    .into_iter()
    .zip((0..).step_by(16))
    .map(|((id, relay), offset)| {
        SimAgent {
            id,
            parents: &format!("{relay},{fe_addr}"),
            ranks: 16,
            offset,
            total: 64,
            period_ms: 100,
            rounds: 0,
        }
        .start_with(dir, agent_args)
    })
    .collect();
    RelaysAndAgents {
        relay0,
        _relay1: relay1,
        _agents: agents,
    }
}

#[test]
fn a_stopped_relay_is_given_up_at_the_keep_alive_time_out_and_comes_back_with_no_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, store) = start_frontend(dir.path(), &["--expect-ranks", "64"]);
    let tree = relays_and_agents(dir.path(), &fe_addr, &[]);
    let relay0 = &tree.relay0;
    wait_for("10 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == 64).count() >= 10
    });
    let stopped_at = Instant::now();
    relay0.signal(Signal::SIGSTOP);
    wait_for("the agents adopted", Duration::from_secs(25), || {
        let nodes = reader(&store).nodes().unwrap_or_default();
        ["agent-0", "agent-1"].iter().all(|id| {
            nodes.iter().any(|n| {
                n.node_id == *id && n.state == NodeState::Attached && n.parent.as_deref() == Some("frontend")
            })
        })
    });
    let adopted = stopped_at.elapsed();
    wait_for("relay-0 lost", Duration::from_secs(10), || {
        reader(&store)
            .node("relay-0")
            .unwrap()
            .is_some_and(|n| n.state == NodeState::Lost)
    });
    let relay = reader(&store).node("relay-0").unwrap().unwrap();
    eprintln!(
        "adopted {adopted:?} after the stop, relay-0 lost {:?} after it: {relay:?}",
        stopped_at.elapsed()
    );
    assert!(
        adopted > Duration::from_secs(10) && adopted < Duration::from_secs(20),
        "adopted {adopted:?} after the stop: not at the keep-alive time-out"
    );
    assert_eq!(relay.state, NodeState::Lost, "{relay:?}");
    assert!(
        relay.detail.as_deref().unwrap_or_default().contains("keep-alive"),
        "{relay:?}"
    );
    std::thread::sleep(Duration::from_secs(25).saturating_sub(stopped_at.elapsed()));
    relay0.signal(Signal::SIGCONT);
    wait_for("relay-0 back", Duration::from_secs(20), || {
        reader(&store)
            .node("relay-0")
            .unwrap()
            .is_some_and(|n| n.state == NodeState::Attached)
    });
    let back = read_rounds(&store).last().unwrap().round;
    wait_for(
        "10 full rounds after relay-0 is back",
        Duration::from_secs(20),
        || {
            read_rounds(&store)
                .iter()
                .filter(|r| r.round > back && r.covered == 64)
                .count()
                >= 10
        },
    );
    let nodes = reader(&store).nodes().unwrap();
    for id in ["agent-0", "agent-1"] {
        let n = nodes.iter().find(|n| n.node_id == id).unwrap();
        assert_eq!(
            (n.state, n.parent.as_deref()),
            (NodeState::Attached, Some("frontend")),
            "{n:?}"
        );
    }
    let relay = nodes.iter().find(|n| n.node_id == "relay-0").unwrap();
    assert_eq!(
        (relay.state, relay.ranks_below),
        (NodeState::Attached, 0),
        "{relay:?}"
    );
    let rounds = read_rounds(&store);
    let upto = rounds.last().unwrap().round.saturating_sub(5);
    let (mut late, mut dropped) = (0, 0);
    for r in rounds.iter().filter(|r| r.round <= upto) {
        assert_eq!(r.expected, 64, "{r:?}");
        assert_eq!(r.missing.get(MissingReason::Lost), 0, "rank-rounds lost: {r:?}");
        assert!(r.covered + r.late_ranks <= 64, "counted twice: {r:?}");
        late += r.late_ranks;
        dropped += r.missing.get(MissingReason::Dropped);
    }
    eprintln!("rank-rounds late: {late}, dropped at the agents while their parent did not read: {dropped}");
}

#[test]
fn adopted_agents_go_back_to_their_relay_once_it_is_healthy_and_lose_nothing_in_the_move() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--expect-ranks", "64"]);
    // Back to the relay after it has answered for 3 s.
    let tree = relays_and_agents(dir.path(), &fe_addr, &["--return-after-s", "3"]);
    let relay0 = &tree.relay0;
    wait_for("10 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == 64).count() >= 10
    });
    let parent_of = |id: &str| {
        reader(&store)
            .node(id)
            .unwrap()
            .filter(|n| n.state == NodeState::Attached)
            .and_then(|n| n.parent)
    };
    relay0.signal(Signal::SIGSTOP);
    wait_for("the agents adopted", Duration::from_secs(25), || {
        ["agent-0", "agent-1"]
            .iter()
            .all(|id| parent_of(id).as_deref() == Some("frontend"))
    });
    // Stopped longer than the hold-down: no agent goes back to a relay that does not answer.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(parent_of("agent-0").as_deref(), Some("frontend"));
    relay0.signal(Signal::SIGCONT);
    wait_for("the agents back under relay-0", Duration::from_secs(30), || {
        ["agent-0", "agent-1"]
            .iter()
            .all(|id| parent_of(id).as_deref() == Some("relay-0"))
    });
    let back = read_rounds(&store).last().unwrap().round;
    wait_for("10 full rounds after the move", Duration::from_secs(20), || {
        read_rounds(&store)
            .iter()
            .filter(|r| r.round > back && r.covered == 64)
            .count()
            >= 10
    });
    std::thread::sleep(Duration::from_secs(2));
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());
    let rounds = read_rounds(&store);
    canopy_integration_tests::accounting::assert_every_round_has_its_row(&rounds);
    let late = canopy_integration_tests::accounting::assert_accounted(
        &rounds,
        64,
        &[MissingReason::Dropped, MissingReason::Stopped],
    );
    let log = std::fs::read_to_string(dir.path().join("agent-0.log")).unwrap();
    assert!(log.contains("going back to the preferred parent"), "{log}");
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}
