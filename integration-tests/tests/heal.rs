//! A relay killed and not restarted: its orphans attach to the next parent of their list, the adopter counts
//! their ranks, and no rank is expected twice.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, read_rounds, reader, start_frontend, start_relay, wait_for};
use canopy_proto::v1::NodeState;

#[test]
fn orphans_of_a_killed_relay_are_adopted_and_every_round_expects_each_rank_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, store) = start_frontend(
        dir.path(),
        &["--expect-ranks", "16", "--stream-timeout-ms", "500"],
    );
    let (mut relay, relay_addr) = start_relay(dir.path(), "relay-0", &fe_addr, "127.0.0.1:0");
    // Each agent's parents: the relay, then the front-end.
    let parents = format!("{relay_addr},{fe_addr}");
    let agent = |id: &str, offset: &str| {
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
            "16",
            "--simulate-period-ms",
            "20",
        ];
        Proc::start(dir.path(), "canopy-agent", id, &args)
    };
    let _a0 = agent("agent-0", "0");
    let _a1 = agent("agent-1", "8");
    wait_for("10 full rounds", Duration::from_secs(30), || {
        read_rounds(&store).iter().filter(|r| r.covered == 16).count() >= 10
    });
    let killed_at = Instant::now();
    relay.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = relay.child.wait();
    let last_before = read_rounds(&store).last().unwrap().round;
    // Adopted by the front-end: rounds are whole again, soon.
    wait_for("full rounds after the adoption", Duration::from_secs(10), || {
        read_rounds(&store)
            .iter()
            .any(|r| r.round > last_before + 2 && r.covered == 16)
    });
    let recovered = killed_at.elapsed();
    wait_for(
        "10 full rounds after the adoption",
        Duration::from_secs(20),
        || {
            read_rounds(&store)
                .iter()
                .filter(|r| r.round > last_before + 2 && r.covered == 16)
                .count()
                >= 10
        },
    );
    eprintln!("back to full coverage {recovered:?} after the kill");
    assert!(recovered < Duration::from_secs(3), "{recovered:?}");
    // No rank was expected twice, nor left out.
    for r in read_rounds(&store) {
        assert_eq!(r.expected, 16, "{r:?}");
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
