//! A relay killed at a random moment under load, over and over: how soon the tree is whole again, and whether
//! any rank-round was lost or counted twice. Each trial is a fresh tree of processes (the daemons beside this
//! executable, mutual TLS on loopback): a front-end, two relays, four agents of 16 simulated ranks each listing
//! their relay and then the front-end as parents. Once 10 rounds are stored, one relay (alternating) is killed
//! with SIGKILL at a moment drawn uniformly within a round, and not restarted; the run goes on to its last round
//! and finishes.

#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "a benchmark that waits on real processes by the wall clock, on the main thread"
)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use canopy_integration_tests::{Proc, SimAgent, read_rounds, start_frontend, start_relay};

/// One trial's figures.
struct Trial {
    victim: String,
    offset_ms: u64,
    /// From the kill to the close of the first full round dumped after it.
    recovery_ms: Option<f64>,
    /// Rounds after the kill that were not full.
    partial_after: usize,
    /// Rank-rounds neither in their round nor among its late arrivals.
    lost: u64,
    /// Rank-rounds both in their round and late, or expected more than once.
    twice: u64,
    rounds: usize,
}

const RANKS: u32 = 64;

pub fn run(trials: usize, period_ms: u64, rounds: u64) -> anyhow::Result<()> {
    println!(
        "# relay SIGKILL at a random moment within a round: front-end, 2 relays, 4 agents x 16 ranks ({RANKS}), \
         {period_ms} ms rounds, {rounds} rounds per trial, mutual TLS"
    );
    println!(
        "| trial | killed | ms into the round | back to full (ms) | partial rounds after | rank-rounds lost | counted twice | rounds stored |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut recoveries = Vec::new();
    let (mut lost, mut twice) = (0, 0);
    // A fixed sequence of moments, the same on every run of the benchmark.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for trial in 0..trials {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let offset_ms = seed % period_ms;
        let t = one(trial, offset_ms, period_ms, rounds)?;
        println!(
            "| {trial} | {} | {} | {} | {} | {} | {} | {} |",
            t.victim,
            t.offset_ms,
            t.recovery_ms.map_or("never".into(), |ms| format!("{ms:.0}")),
            t.partial_after,
            t.lost,
            t.twice,
            t.rounds
        );
        if let Some(ms) = t.recovery_ms {
            recoveries.push(ms);
        }
        lost += t.lost;
        twice += t.twice;
    }
    if recoveries.is_empty() {
        bail!("no trial came back to full coverage");
    }
    let (median, min, max) = crate::stats(recoveries.clone());
    println!();
    println!(
        "back to full coverage: median {median:.0} ms (min {min:.0}, max {max:.0}) over {} of {trials} trials; \
         rank-rounds lost: {lost}; counted twice: {twice}",
        recoveries.len()
    );
    Ok(())
}

fn one(trial: usize, offset_ms: u64, period_ms: u64, rounds: u64) -> anyhow::Result<Trial> {
    let dir = tempfile::tempdir()?;
    let (mut fe, fe_addr, store) = start_frontend(
        dir.path(),
        &["--expect-ranks", &RANKS.to_string(), "--exit-on-fin", "true"],
    );
    let mut relays = [
        start_relay(dir.path(), "relay-0", &fe_addr, "127.0.0.1:0"),
        start_relay(dir.path(), "relay-1", &fe_addr, "127.0.0.1:0"),
    ];
    let mut agents: Vec<Proc> = Vec::new();
    for a in 0..4u32 {
        let agent = SimAgent {
            id: &format!("agent-{a}"),
            parents: &format!("{},{fe_addr}", relays[a as usize / 2].1),
            ranks: 16,
            offset: a * 16,
            total: RANKS,
            period_ms,
            rounds,
        };
        agents.push(agent.start(dir.path()));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_rounds(&store).len() < 10 {
        if Instant::now() > deadline {
            bail!("trial {trial}: 10 rounds not stored within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Round k is dumped at start + k * period: wait for the chosen moment within the current round.
    let last = read_rounds(&store).last().cloned().context("a round")?;
    let dumped = last.first_dump_unix_ns.context("the round's dump time")?;
    let now = unix_ns();
    let period_ns = period_ms * 1_000_000;
    let into = now.saturating_sub(dumped) % period_ns;
    let wait = (offset_ms * 1_000_000 + period_ns - into) % period_ns;
    std::thread::sleep(Duration::from_nanos(wait));
    let victim = &mut relays[trial % 2].0;
    let killed_ns = unix_ns();
    victim.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = victim.child.wait();
    let victim = victim.name.clone();
    if fe
        .wait_timeout(Duration::from_secs(rounds * period_ms / 1000 + 30))
        .is_none()
    {
        bail!(
            "trial {trial}: the run did not finish (logs in {})",
            dir.keep().display()
        );
    }
    let stored = read_rounds(&store);
    let mut lost = 0u64;
    let mut twice = 0u64;
    let mut short = Vec::new();
    for r in &stored {
        let got = u64::from(r.covered) + u64::from(r.late_ranks);
        if got != u64::from(RANKS) {
            short.push(format!(
                "round {}: {} + {} late of {} ({})",
                r.round,
                r.covered,
                r.late_ranks,
                r.expected,
                r.missing_reason.as_deref().unwrap_or_default()
            ));
        }
        lost += u64::from(RANKS).saturating_sub(got);
        twice += got.saturating_sub(u64::from(RANKS));
        twice += u64::from(r.expected.saturating_sub(RANKS));
    }
    if !short.is_empty() {
        eprintln!(
            "trial {trial}: {} (logs in {})",
            short.join("; "),
            dir.keep().display()
        );
    }
    let after: Vec<_> = stored
        .iter()
        .filter(|r| r.first_dump_unix_ns.is_some_and(|t| t > killed_ns))
        .collect();
    let recovery_ms = after
        .iter()
        .find(|r| r.covered == RANKS)
        .and_then(|r| r.closed_unix_ns)
        .map(|closed| closed.saturating_sub(killed_ns) as f64 / 1e6);
    Ok(Trial {
        victim,
        offset_ms,
        recovery_ms,
        partial_after: after.iter().filter(|r| r.covered != RANKS).count(),
        lost,
        twice,
        rounds: stored.len(),
    })
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
