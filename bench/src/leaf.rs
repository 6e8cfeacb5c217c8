//! `canopy-bench leaf`: a leaf agent's work per rank-round, in one thread, with the simulated ranks' own work
//! apart: generating and encoding a round's profiles (in a deployment, the ranks' work, done by the SDK in
//! the application) against the leaf filter reading and folding them (the agent's work). The rest of an
//! agent's CPU (runtime, round engine, transport) is what a whole-process figure adds to these two.
//!
//! A second table times the same filters one level up: a relay's phase-0 call over `children` leaf packets
//! per round (the leaf's packets of consecutive rounds, so every child reports the same keys with its own
//! values, as the children of a relay over one application do), through the real plugin.

use std::time::Instant;

use canopy_agent::sim::{Scenario, Selection, SimConfig, Simulator};
use canopy_core::filter::{FilterFactory, Level};

use crate::stats;

/// One agent's `ranks` simulated ranks of the FLASH scenario, `events` events each, as the benchmarks time them.
pub fn flash(ranks: u32, events: u32) -> Simulator {
    Simulator::new(SimConfig {
        scenario: Scenario::Flash,
        ranks,
        events,
        rank_offset: 0,
        total_ranks: ranks,
        seed: 1,
        app: "sim".into(),
        plants: Vec::new(),
    })
}

#[allow(clippy::disallowed_types)] // a benchmark's wall clock, on its own thread
pub fn run(
    ranks: u32,
    events: u32,
    rounds: u64,
    children: usize,
    filters: &[String],
    repeats: usize,
) -> anyhow::Result<()> {
    println!(
        "\n## leaf: one agent's {ranks} simulated ranks (flash, {events} events), {rounds} rounds, one thread: us per rank-round"
    );
    println!("| work | us per rank-round (median) | min | max |");
    println!("|---|---:|---:|---:|");
    let plugins = canopy_core::plugin::filters_from(&[]);
    let rank_rounds = (u64::from(ranks) * rounds) as f64;
    let mut generate = Vec::new();
    let mut fold: Vec<Vec<f64>> = vec![Vec::new(); filters.len()];
    let mut merge: Vec<Vec<f64>> = vec![Vec::new(); filters.len()];
    for _ in 0..repeats {
        let mut sim = flash(ranks, events);
        let selection = Selection::everything();
        let mut batches: Vec<Vec<prost::bytes::Bytes>> = Vec::with_capacity(rounds as usize);
        let t = Instant::now();
        for round in 0..rounds {
            let mut batch = Vec::with_capacity(ranks as usize);
            sim.encode_round(round, 1, &selection, |_, b| batch.extend(b));
            batches.push(batch);
        }
        generate.push(t.elapsed().as_secs_f64() * 1e6 / rank_rounds);
        for (f, name) in filters.iter().enumerate() {
            // The real plugin, loaded from beside this executable as the agent loads it. A filter of several
            // phases does its whole leaf round: phase 0, then the packet a root (another instance of the same
            // plugin, its time not counted) sends down for it, so its buffers go as they do in a tree.
            let mut filter = plugins.create(name, "", Level::Leaf)?;
            let mut root = plugins.create(name, "", Level::Root)?;
            let mut leaf_us = 0.0;
            let mut packets = Vec::with_capacity(batches.len());
            for (round, batch) in batches.iter().enumerate() {
                let round = round as u64;
                let inputs: Vec<&[u8]> = batch.iter().map(|b| b.as_ref()).collect();
                let t = Instant::now();
                let mut out = filter.upstream(round, 0, &inputs)?;
                leaf_us += t.elapsed().as_secs_f64() * 1e6;
                if let Some(up) = out.up.iter().find(|p| p.phase == 0) {
                    packets.push(up.payload.clone());
                }
                while let Some(up) = out.up.pop() {
                    let down = root.upstream(round, up.phase, &[&up.payload])?.down;
                    let Some(down) = down.into_iter().next() else {
                        break;
                    };
                    let t = Instant::now();
                    out = filter.downstream(round, down.phase, &down.payload)?;
                    leaf_us += t.elapsed().as_secs_f64() * 1e6;
                }
                std::hint::black_box(out);
            }
            fold[f].push(leaf_us / rank_rounds);
            if !packets.is_empty() {
                let mut relay = plugins.create(name, "", Level::Relay)?;
                let t = Instant::now();
                for round in 0..packets.len() {
                    let inputs: Vec<&[u8]> = (0..children)
                        .map(|c| packets[(round + c) % packets.len()].as_slice())
                        .collect();
                    std::hint::black_box(relay.upstream(round as u64, 0, &inputs)?);
                }
                merge[f].push(t.elapsed().as_secs_f64() * 1e6 / packets.len() as f64);
            }
        }
    }
    let row = |label: &str, xs: Vec<f64>| {
        let (m, lo, hi) = stats(xs);
        println!("| {label} | {m:.2} | {lo:.2} | {hi:.2} |");
    };
    row(
        "the simulated ranks: generate and encode (the ranks' work)",
        generate,
    );
    for (name, xs) in filters.iter().zip(fold) {
        row(
            &format!("the leaf's `{name}` filter: its whole leaf round (the agent's work)"),
            xs,
        );
    }
    println!(
        "\n## relay: {children} children's phase-0 packets of those leaves merged, one thread: us per round"
    );
    println!("| work | us per round (median) | min | max |");
    println!("|---|---:|---:|---:|");
    for (name, xs) in filters.iter().zip(merge) {
        if !xs.is_empty() {
            row(
                &format!("the relay's `{name}` filter: decode, check, merge and encode"),
                xs,
            );
        }
    }
    Ok(())
}
