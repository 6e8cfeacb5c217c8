//! A rack cut off from the front-end's host: three hosts as network namespaces on a switch, the front-end on
//! one, a relay and two agents on each of the others. The first rack's port goes down for 20 s (its daemons run
//! on and hold their data), then comes back: every rank-round of the run is covered, or late with its data, or
//! counted with its reason, and the rack catches up with the other on the multi-phase histogram as well as on
//! stats. Needs root (namespaces); says it skipped without.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::time::Duration;

use canopy_integration_tests::{Lan, Proc, SimAgent, read_rounds, reader, wait_for, wait_ready_file};
use canopy_proto::v1::{MissingReason, NodeState};
use nix::sys::signal::Signal;

const RANKS_PER_AGENT: u32 = 8;
const RANKS: u32 = 4 * RANKS_PER_AGENT;

#[test]
fn a_rack_cut_off_for_20_s_loses_no_rank_round() {
    let Some(lan) = Lan::new(3) else { return };
    let dir = tempfile::tempdir().unwrap();
    let hosts: Vec<String> = (0..3).map(Lan::addr).collect();
    let creds = canopy_runtime::tls::write_credentials(&dir.path().join("tls"), &hosts, 1, true).unwrap();
    let node = creds.node();
    let tls = |p: Option<std::path::PathBuf>| p.unwrap().display().to_string();
    let (ca, cert, key) = (tls(node.ca), tls(node.cert), tls(node.key));
    let tls_args = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];

    let fe_addr = format!("{}:7400", hosts[0]);
    let ready = dir.path().join("frontend.ready");
    let out = dir.path().join("out");
    let tokens = creds.tokens().display().to_string();
    let mut fe_args = vec![
        "--listen",
        &fe_addr,
        "--out",
        out.to_str().unwrap(),
        "--ready-file",
        ready.to_str().unwrap(),
        "--streams",
        "stats,histogram",
        "--stream-timeout-ms",
        "1000",
        "--token-file",
        &tokens,
    ];
    let expect = RANKS.to_string();
    fe_args.extend(["--expect-ranks", &expect]);
    fe_args.extend(tls_args);
    let mut fe = lan.start(0, dir.path(), "canopy-frontend", "frontend", &fe_args);
    let store: std::path::PathBuf = wait_ready_file(&ready, &mut fe)
        .store
        .expect("the front-end's store");

    let mut daemons: Vec<Proc> = Vec::new();
    for (rack, host) in hosts.iter().enumerate().skip(1) {
        let relay_id = format!("relay-{}", rack - 1);
        let relay_addr = format!("{host}:7401");
        let mut args = vec![
            "--node-id",
            &relay_id,
            "--parent",
            &fe_addr,
            "--listen",
            &relay_addr,
        ];
        args.extend(tls_args);
        daemons.push(lan.start(rack, dir.path(), "canopy-relay", &relay_id, &args));
        for a in 0..2 {
            let n = (rack as u32 - 1) * 2 + a;
            let id = format!("agent-{n}");
            let agent = SimAgent {
                id: &id,
                parents: &relay_addr,
                ranks: RANKS_PER_AGENT,
                offset: n * RANKS_PER_AGENT,
                total: RANKS,
                period_ms: 50,
                rounds: 0,
            };
            let mut args = agent.args();
            args.extend(tls_args.map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            daemons.push(lan.start(rack, dir.path(), "canopy-agent", &id, &args));
        }
    }
    wait_for("10 full rounds", Duration::from_secs(40), || {
        read_rounds(&store).iter().filter(|r| r.covered == RANKS).count() >= 10
    });

    // The first rack loses its uplink for 20 s: longer than the keep-alive time-out, so both sides give the
    // connection up while the rack's daemons run on.
    lan.cut(1);
    std::thread::sleep(Duration::from_secs(20));
    lan.heal(1);
    wait_for("relay-0 back", Duration::from_secs(40), || {
        reader(&store)
            .node("relay-0")
            .unwrap()
            .is_some_and(|r| r.state == NodeState::Attached)
    });
    let seen = read_rounds(&store).last().unwrap().round;
    // Both streams whole again: the rack's backlog went up late, and its histogram rounds the front-end had closed
    // without it did not hold its window, so the rack caught up with the other.
    wait_for(
        "20 full rounds of each stream after the partition",
        Duration::from_secs(40),
        || {
            let rounds = read_rounds(&store);
            [1, 2].iter().all(|stream| {
                rounds
                    .iter()
                    .filter(|r| r.stream_id == *stream && r.round > seen && r.covered == RANKS)
                    .count()
                    >= 20
            })
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(30)).is_some());

    // The stats stream accounts for every rank-round; the histogram's rounds that were under way when the link
    // went down have no last phase, and count their ranks late without data.
    let rounds: Vec<_> = read_rounds(&store)
        .into_iter()
        .filter(|r| r.stream_id == 1)
        .collect();
    let numbers: Vec<u64> = rounds.iter().map(|r| r.round).collect();
    assert_eq!(
        numbers,
        (0..=*numbers.last().unwrap()).collect::<Vec<_>>(),
        "a round without its row"
    );
    let (mut late, mut counted) = (0, 0);
    for r in &rounds {
        assert_eq!(r.expected, RANKS, "{r:?}");
        assert!(r.covered + r.late_ranks <= RANKS, "counted twice: {r:?}");
        let reasons = r.missing.get(MissingReason::Dropped) + r.missing.get(MissingReason::Stopped);
        assert_eq!(
            r.covered + r.late_ranks + reasons,
            RANKS,
            "rank-rounds neither covered, nor late with their data, nor counted with a reason: {r:?}"
        );
        late += r.late_ranks;
        counted += reasons;
    }
    assert!(
        late > 0,
        "the cut-off rack's rounds arrived late, with their data"
    );
    // Rounds closed while the rack was cut off say so, and name its relay.
    let cut_off: Vec<_> = rounds
        .iter()
        .filter(|r| r.missing.get(MissingReason::Unreachable) > 0)
        .collect();
    assert!(!cut_off.is_empty(), "no round names the rack unreachable");
    for r in &cut_off {
        assert_eq!(
            r.missing.get(MissingReason::Unreachable),
            2 * RANKS_PER_AGENT,
            "{r:?}"
        );
        let reason = r.missing_reason.as_deref().unwrap_or_default();
        assert!(reason.contains("unreachable: 16 (relay-0=16)"), "{r:?}");
        assert_eq!(
            r.late_ranks,
            2 * RANKS_PER_AGENT,
            "completed by its late data: {r:?}"
        );
    }
    eprintln!(
        "{} rounds; {late} rank-rounds late with their data, {counted} counted dropped or stopped",
        rounds.len()
    );
    drop(daemons);
}
