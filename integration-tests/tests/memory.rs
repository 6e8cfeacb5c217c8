//! A declared memory budget holds under load when the root stops reading: the front-end is stopped for 60 s
//! while 256 ranks go on dumping every 20 ms through two relays, and no daemon's resident size passes its
//! `memory_budget_mb`; once it runs again, every rank-round is covered, late with its data, or counted with its
//! reason.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::time::{Duration, Instant};

use canopy_integration_tests::accounting::{assert_accounted, assert_every_round_has_its_row, unaccounted};
use canopy_integration_tests::{SimAgent, read_rounds, start_frontend, start_relay_with, wait_for};
use canopy_proto::v1::MissingReason;
use nix::sys::signal::Signal;

const BUDGET_MB: u64 = 64;
const RANKS: u32 = 256;

#[test]
fn a_root_that_stops_reading_for_60_s_leaves_every_daemon_under_its_memory_budget_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let budget = BUDGET_MB.to_string();
    let budget_args = ["--memory-budget-mb", budget.as_str()];
    let expect = RANKS.to_string();
    let mut fe_args = vec!["--streams", "stats,histogram", "--expect-ranks", &expect];
    fe_args.extend(budget_args);
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &fe_args);
    let relays: Vec<(canopy_integration_tests::Proc, String)> = (0..2)
        .map(|i| {
            start_relay_with(
                dir.path(),
                &format!("relay-{i}"),
                &fe_addr,
                "127.0.0.1:0",
                &budget_args,
            )
        })
        .collect();
    let agents: Vec<canopy_integration_tests::Proc> = (0..4u32)
        .map(|i| {
            let id = format!("agent-{i}");
            SimAgent {
                id: &id,
                parents: &relays[(i / 2) as usize].1,
                ranks: RANKS / 4,
                offset: i * RANKS / 4,
                total: RANKS,
                period_ms: 20,
                rounds: 0,
            }
            .start_with(dir.path(), &budget_args)
        })
        .collect();
    wait_for("20 full rounds", Duration::from_secs(40), || {
        read_rounds(&store).iter().filter(|r| r.covered == RANKS).count() >= 40
    });

    fe.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let mut peak_kib = vec![0u64; relays.len() + agents.len()];
    while stopped.elapsed() < Duration::from_secs(60) {
        for (peak, p) in peak_kib
            .iter_mut()
            .zip(relays.iter().map(|(p, _)| p).chain(&agents))
        {
            *peak = (*peak).max(p.rss_kib());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    fe.signal(Signal::SIGCONT);
    let mut fe_peak = 0;
    // Both relays gave the stopped front-end up at the keep-alive time-out: each is back once it attached again
    // (the store's rows still say attached from before the stop until the front-end reads the old links' end).
    wait_for("the relays back", Duration::from_secs(40), || {
        fe_peak = fe_peak.max(fe.rss_kib());
        relays
            .iter()
            .all(|(p, _)| p.log_text().matches("attached to parent").count() >= 2)
    });
    let seen = read_rounds(&store).last().unwrap().round;
    wait_for("20 full rounds after the stop", Duration::from_secs(60), || {
        fe_peak = fe_peak.max(fe.rss_kib());
        read_rounds(&store)
            .iter()
            .filter(|r| r.stream_id == 1 && r.round > seen && r.covered == RANKS)
            .count()
            >= 20
    });
    eprintln!("peak resident KiB: relays and agents {peak_kib:?}, front-end after the stop {fe_peak}");
    for kib in peak_kib.iter().chain([&fe_peak]) {
        assert!(
            *kib < BUDGET_MB << 10,
            "a daemon past its budget: {kib} KiB of {BUDGET_MB} MiB"
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(60)).is_some());
    let rounds: Vec<_> = read_rounds(&store)
        .into_iter()
        .filter(|r| r.stream_id == 1)
        .collect();
    let checked = std::panic::catch_unwind(|| {
        assert_every_round_has_its_row(&rounds);
        assert_accounted(&rounds, RANKS, &[MissingReason::Dropped, MissingReason::Stopped])
    });
    let late = checked.unwrap_or_else(|failure| {
        // What the links did around the stop: the sessions that ended, the returns and what was sent again.
        for p in std::iter::once(&fe).chain(relays.iter().map(|(p, _)| p)) {
            let log = p.log_text();
            let moves = log.lines().filter(|l| {
                ["lost", "attached", "asking", "again", "dropped"]
                    .iter()
                    .any(|w| l.contains(w))
            });
            eprintln!("{}:\n{}", p.name, moves.collect::<Vec<_>>().join("\n"));
        }
        let reasons = [MissingReason::Dropped, MissingReason::Stopped];
        eprintln!(
            "rounds not accounted for:\n{}",
            unaccounted(&rounds, RANKS, &reasons).join("\n")
        );
        std::panic::resume_unwind(failure)
    });
    eprintln!("{} rounds, {late} rank-rounds late with their data", rounds.len());
}
