//! `canopy-bench utilization`: seed 000's figures for Canopy's utilization profiles. Three tables:
//!
//! - `compress`: creating one rank's compressed profile of one second (the replay of its activity switches into
//!   1 ms bins and the sparse form), with activities switching at `--rate-hz`, against the paper's 9.3 ms per
//!   second at 1024 processors.
//! - `tree`: 1024 simulated namd ranks in time rounds of one second through the real `utilization` plugin over a
//!   tree of 32 leaves of 32 ranks, relays of fanout 8 and the root: the size of the merged packet at each level,
//!   what reaches the front-end and a subscriber per second (the paper: messages of 3.5 to 12 KB, under 12 KB/s
//!   to the client), and the time of each level's merge.
//! - `perturbation`: one rank (this process) runs a fixed amount of work in activities that switch at
//!   `--rate-hz`, through a real tree (front-end and socket agent, release binaries), with no measurement module
//!   and with the utilization module; the overhead of the module against the paper's 1.14%.

use std::time::{Duration, Instant};

use canopy_agent::sim::{Scenario, Selection, SimConfig, Simulator, TimeWindow};
use canopy_core::filter::{FilterFactory, Level};
use canopy_integration_tests::{bin_dir, start_frontend, start_socket_agent};
use canopy_wire::utilization::{DEFAULT_THRESHOLD, Replay, Switch};
use canopy_wire::v1::Utilization;
use prost::Message;

use crate::stats;

/// What to measure.
pub struct Plan<'a> {
    pub tables: &'a [String],
    /// Activity switches per second of the measured rank (a begin and an end each).
    pub rate_hz: u64,
    /// Seconds of work per perturbation run.
    pub seconds: f64,
    pub ranks: u32,
    pub repeats: usize,
}

pub fn run(plan: &Plan<'_>) -> anyhow::Result<()> {
    for table in plan.tables {
        match table.as_str() {
            "compress" => compress(plan),
            "tree" => tree(plan)?,
            "perturbation" => perturbation(plan)?,
            other => anyhow::bail!("unknown table `{other}`: expected compress, tree or perturbation"),
        }
    }
    Ok(())
}

/// One second of a rank's switches: `rate_hz` activities, each inside a long-running "main", eight kinds of
/// activity in turn with idle between some, times jittered so bins hold one to three activities.
fn second_of_switches(rate_hz: u64, start: u64, out: &mut Vec<Switch>) {
    let step = 1_000_000_000 / rate_hz.max(1);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    out.push(Switch {
        thread: 0,
        at_unix_ns: start,
        begin: true,
        activity: canopy_wire::event_id("main"),
    });
    let ids: Vec<u64> = (0..8)
        .map(|i| canopy_wire::event_id(&format!("entry {i}")))
        .chain(std::iter::once(canopy_wire::event_id("Idle")))
        .collect();
    for k in 0..rate_hz {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = start + k * step;
        let activity = ids[(x % ids.len() as u64) as usize];
        let len = step / 2 + x % (step / 2);
        out.push(Switch {
            thread: 0,
            at_unix_ns: t,
            begin: true,
            activity,
        });
        out.push(Switch {
            thread: 0,
            at_unix_ns: t + len,
            begin: false,
            activity,
        });
    }
}

#[allow(clippy::disallowed_types)] // a benchmark's wall clock, on its own thread
fn compress(plan: &Plan<'_>) {
    let second = 1_000_000_000u64;
    let mut times = Vec::new();
    let mut bytes = 0;
    let mut records = 0;
    let mut replay = Replay::default();
    let mut switches = Vec::new();
    let mut u = Utilization::default();
    let periods = plan.repeats.max(3) * 5;
    for k in 0..periods as u64 {
        second_of_switches(plan.rate_hz, k * second, &mut switches);
        let t = Instant::now();
        replay.period(
            k * second,
            (k + 1) * second,
            1_000_000,
            &mut switches,
            DEFAULT_THRESHOLD,
            0,
            &mut u,
        );
        times.push(t.elapsed().as_secs_f64() * 1e3);
        bytes = u.encoded_len();
        records = u.share.len();
    }
    let (m, lo, hi) = stats(times);
    println!(
        "\n## utilization compress: one rank's second, activities at {} Hz, 1000 bins of 1 ms, {periods} periods",
        plan.rate_hz
    );
    println!("| work | ms per rank per second (median) | min | max | seed 000 |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| replay the switches and compress ({records} records, {bytes} bytes) | {m:.3} | {lo:.3} | {hi:.3} | 9.3 ms at 1024 processors |"
    );
}

#[allow(clippy::disallowed_types)] // a benchmark's wall clock, on its own thread
fn tree(plan: &Plan<'_>) -> anyhow::Result<()> {
    const LEAF_RANKS: u32 = 32;
    const FANOUT: usize = 8;
    let leaves = (plan.ranks / LEAF_RANKS).max(1);
    let plugins = canopy_core::plugin::filters_from(&[]);
    let period_ns = 1_000_000_000u64;
    let rounds = plan.repeats.max(3) as u64;
    let mut sims: Vec<Simulator> = (0..leaves)
        .map(|l| {
            Simulator::new(SimConfig {
                scenario: Scenario::Namd,
                ranks: LEAF_RANKS,
                events: 20,
                rank_offset: l * LEAF_RANKS,
                total_ranks: leaves * LEAF_RANKS,
                seed: 1,
                app: "namd".into(),
                plants: Vec::new(),
            })
        })
        .collect();
    let names: Vec<(u64, String)> = sims[0].names();
    let mut leaf_filters = Vec::new();
    for _ in 0..leaves {
        leaf_filters.push(plugins.create("utilization", "", Level::Leaf)?);
    }
    let relays = (leaves as usize).div_ceil(FANOUT);
    let mut relay_filters = Vec::new();
    for _ in 0..relays {
        relay_filters.push(plugins.create("utilization", "", Level::Relay)?);
    }
    let mut root = plugins.create("utilization", "", Level::Root)?;
    root.names(&names);
    let (mut rank_bytes, mut leaf_bytes, mut relay_bytes, mut result_bytes) =
        (vec![], vec![], vec![], vec![]);
    let (mut leaf_ms, mut relay_ms, mut root_ms) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let window = TimeWindow {
            start_unix_ns: 1_800_000_000_000_000_000 + round * period_ns,
            period_ns,
        };
        let selection = Selection {
            reported: &|_| true,
            metrics: 0,
            sampled_out: &|_| false,
            utilization: Some(window),
            step_unix_ns: 0,
        };
        let mut leaf_out = Vec::new();
        let mut t_leaf = 0.0;
        for (sim, filter) in sims.iter_mut().zip(&mut leaf_filters) {
            let mut batch = Vec::new();
            sim.encode_round(round, 1, &selection, |_, b| batch.extend(b));
            for b in &batch {
                let p = canopy_wire::v1::ProfileBatch::decode(b.as_ref())?;
                let u = p.profiles[0].utilization.as_ref().map_or(0, Message::encoded_len);
                rank_bytes.push(u as f64);
            }
            let inputs: Vec<&[u8]> = batch.iter().map(|b| b.as_ref()).collect();
            let t = Instant::now();
            let out = filter.upstream(round, 0, &inputs)?;
            t_leaf += t.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(out.rejected.is_empty(), "leaf rejected {:?}", out.rejected);
            let packet = out.up.into_iter().next().map(|p| p.payload).unwrap_or_default();
            leaf_bytes.push(packet.len() as f64);
            leaf_out.push(packet);
        }
        leaf_ms.push(t_leaf / f64::from(leaves));
        let mut relay_out = Vec::new();
        let mut t_relay = 0.0;
        for (group, filter) in leaf_out.chunks(FANOUT).zip(&mut relay_filters) {
            let inputs: Vec<&[u8]> = group.iter().map(Vec::as_slice).collect();
            let t = Instant::now();
            let out = filter.upstream(round, 0, &inputs)?;
            t_relay += t.elapsed().as_secs_f64() * 1e3;
            let packet = out.up.into_iter().next().map(|p| p.payload).unwrap_or_default();
            relay_bytes.push(packet.len() as f64);
            relay_out.push(packet);
        }
        relay_ms.push(t_relay / relays as f64);
        let inputs: Vec<&[u8]> = relay_out.iter().map(Vec::as_slice).collect();
        let t = Instant::now();
        let out = root.upstream(round, 0, &inputs)?;
        let packet = out.up.into_iter().next().map(|p| p.payload).unwrap_or_default();
        let result = root.finalize(round, 0, &packet)?;
        root_ms.push(t.elapsed().as_secs_f64() * 1e3);
        result_bytes.push(result.len() as f64);
    }
    println!(
        "\n## utilization tree: {} simulated namd ranks, time rounds of 1 s (1000 bins of 1 ms), {leaves} leaves of {LEAF_RANKS} ranks, {relays} relays of fanout {FANOUT}, the root; {rounds} rounds",
        leaves * LEAF_RANKS
    );
    println!("| level | message bytes (median) | min | max | merge ms (median) | seed 000 |");
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |label: &str, bytes: Vec<f64>, ms: Option<Vec<f64>>, paper: &str| {
        let (m, lo, hi) = stats(bytes);
        let ms = ms.map_or("".to_string(), |xs| format!("{:.3}", stats(xs).0));
        println!("| {label} | {m:.0} | {lo:.0} | {hi:.0} | {ms} | {paper} |");
    };
    row("a rank's profile", rank_bytes, None, "");
    row(
        "leaf packet (32 ranks)",
        leaf_bytes,
        Some(leaf_ms),
        "3.5 to 12 KB per message",
    );
    row(
        "relay packet (8 leaves): what reaches the front-end, per child per second",
        relay_bytes.clone(),
        Some(relay_ms),
        "",
    );
    let front_end: f64 = stats(relay_bytes).0 * relays as f64;
    row(
        "the result: what a subscriber receives per second",
        result_bytes,
        Some(root_ms),
        "under 12 KB/s at 1024 processors",
    );
    println!("\nbytes per second reaching the front-end from its {relays} children: {front_end:.0}");
    Ok(())
}

/// Busy work the optimizer cannot remove, about `ns` long on this machine once calibrated.
fn spin(iterations: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..iterations {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    std::hint::black_box(x)
}

#[allow(clippy::disallowed_types)] // a benchmark's wall clock, on its own thread
fn perturbation(plan: &Plan<'_>) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A stats stream: a utilization stream would put the module in force from the root, and this run switches
    // it itself.
    let (_fe, addr, _store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let socket = dir.path().join("agent.sock");
    let _agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() && Instant::now() < deadline {
        #[allow(
            clippy::disallowed_methods,
            reason = "synchronous harness code: no event tells when another process creates its socket"
        )]
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut config = canopy_sdk::Config::from_env("perturbation", Some(0), Some(1))?;
    config.socket = socket;
    canopy_sdk::init_with(config)?;
    // Calibrate: iterations of `spin` per activity, so activities switch at `rate_hz`.
    let calib = 10_000_000u64;
    let t = Instant::now();
    spin(calib);
    let per_ns = calib as f64 / t.elapsed().as_nanos() as f64;
    let per_activity = (per_ns * 1e9 / plan.rate_hz as f64) as u64;
    let activities = (plan.seconds * plan.rate_hz as f64) as u64;
    let names: Vec<canopy_sdk::Activity> = (0..8)
        .map(|i| canopy_sdk::activity(&format!("work {i}")))
        .collect::<Result<_, _>>()?;
    let work = |instrumented: bool| {
        let t = Instant::now();
        for k in 0..activities {
            let a = names[(k % 8) as usize];
            if instrumented {
                a.begin();
            }
            spin(per_activity);
            if instrumented {
                a.end();
            }
        }
        t.elapsed().as_secs_f64()
    };
    let (mut none, mut with) = (Vec::new(), Vec::new());
    for _ in 0..plan.repeats {
        canopy_sdk::set_modules(&[])?;
        none.push(work(false));
        canopy_sdk::set_modules(&["utilization"])?;
        with.push(work(true));
    }
    canopy_sdk::set_modules(&[])?;
    let _ = canopy_sdk::finalize();
    println!(
        "\n## utilization perturbation: one rank, {activities} activities at {} Hz ({:.1} s of work), through a real tree (binaries in {}); {} repeats",
        plan.rate_hz,
        plan.seconds,
        bin_dir().display(),
        plan.repeats
    );
    println!("| modules | time s (median) | min | max | overhead | seed 000 |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (base, lo, hi) = stats(none);
    println!("| none | {base:.4} | {lo:.4} | {hi:.4} | | |");
    let (m, lo, hi) = stats(with);
    println!(
        "| utilization (1 s time rounds, binned on the SDK's thread) | {m:.4} | {lo:.4} | {hi:.4} | {:+.3}% | 1.14% at 8192 processors |",
        (m / base - 1.0) * 100.0
    );
    Ok(())
}
