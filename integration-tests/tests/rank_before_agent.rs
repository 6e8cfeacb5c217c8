//! An application started before its node's agent: the ranks dump into their bounded queues, drop what does not
//! fit and count it, and deliver the rest once the agent is there. When the run ends every round has its row: the
//! rounds no rank could deliver are counted dropped, so a report shows the gap as a gap.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::process::{Command, Stdio};
use std::time::Duration;

use canopy_integration_tests::accounting::assert_every_round_has_its_row;
use canopy_integration_tests::{bin_dir, read_rounds, start_frontend, start_socket_agent, wait_for};
use canopy_proto::v1::MissingReason;
use nix::sys::signal::Signal;

#[test]
fn rounds_a_rank_dumped_before_its_agent_was_there_are_counted_dropped_and_none_goes_without_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--streams", "stats", "--expect-ranks", "2"]);
    let socket = dir.path().join("run").join("agent.sock");
    // Two ranks of 300 iterations, 10 ms each, with room for 16 dumps while no agent is there.
    let ranks: Vec<std::process::Child> = (0..2)
        .map(|rank| {
            Command::new(bin_dir().join("canopy-stencil"))
                .args(["300", "32", "10000"])
                .env("CANOPY_AGENT_SOCKET", &socket)
                .env("CANOPY_RANK", rank.to_string())
                .env("CANOPY_NRANKS", "2")
                .env("CANOPY_QUEUE_DUMPS", "16")
                .env("CANOPY_FINALIZE_TIMEOUT_MS", "5000")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let _agent = start_socket_agent(dir.path(), "agent-0", &fe_addr, &socket);
    let mut said = String::new();
    for rank in ranks {
        let out = rank.wait_with_output().unwrap();
        said.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    assert!(
        said.contains("were not delivered"),
        "the ranks dropped dumps and said so: {said}"
    );
    // Each rank said at its start that no agent was there, and where it looked.
    for rank in 0..2 {
        let start = format!(
            "canopy: rank {rank}: no agent is listening at {}",
            socket.display()
        );
        assert!(said.contains(&start), "{said}");
    }
    wait_for("the last round", Duration::from_secs(30), || {
        read_rounds(&store).last().is_some_and(|r| r.round >= 299)
    });
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());

    let rounds = read_rounds(&store);
    assert_every_round_has_its_row(&rounds);
    assert_eq!(rounds.last().map(|r| r.round), Some(299));
    let mut dropped = 0;
    for r in &rounds {
        assert_eq!(r.expected, 2, "{r:?}");
        let counted: u32 = r.missing.iter().map(|(_, n)| n).sum();
        assert_eq!(r.covered + counted, 2, "{r:?}");
        dropped += r.missing.get(MissingReason::Dropped);
    }
    assert!(
        dropped > 0,
        "the rounds dumped while no agent was there are counted dropped"
    );
    eprintln!("{dropped} rank-rounds dropped before the agent was there");
}
