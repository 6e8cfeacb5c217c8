//! A relay killed and not restarted: its orphans attach to the next parent of their list, the adopter counts
//! their ranks, no rank is expected twice, and what the relay held comes again from its orphans.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, read_rounds, reader, start_frontend, start_relay, wait_for};
use canopy_proto::v1::NodeState;
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
    let agent = |id: &str, relay: &str, offset: &str| {
        let parents = format!("{relay},{fe_addr}");
        let args = [
            "--node-id",
            id,
            "--parent",
            &parents,
            "--socket",
            "none",
            "--simulate-ranks",
            "8",
            "--rank-offset",
            offset,
            "--total-ranks",
            "32",
            "--simulate-period-ms",
            "20",
        ];
        Proc::start(dir.path(), "canopy-agent", id, &args)
    };
    let agents = [
        agent("agent-0", &relay0_addr, "0"),
        agent("agent-1", &relay0_addr, "8"),
        agent("agent-2", &relay1_addr, "16"),
        agent("agent-3", &relay1_addr, "24"),
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
    // The agents show attached to their adopter.
    let nodes = reader(&store).nodes().unwrap();
    for id in ["agent-0", "agent-1"] {
        let n = nodes.iter().find(|n| n.node_id == id).unwrap();
        assert_eq!(
            (n.state, n.parent.as_deref()),
            (NodeState::Attached, Some("frontend")),
            "{n:?}"
        );
    }
}
