//! `canopy-bench engine`: rounds per second through one node's round engine, passthrough, against a baseline
//! that only groups the packets.

use std::time::{Duration, Instant};

use canopy_core::engine::{Accepted, Arrival, GroupKey, RoundEngine, StreamSync};
use canopy_core::filter::{FilterFactory, Level};
use canopy_proto::v1::{AppCoverage, Coverage, EventSample, ProfileBatch, RankProfile, SyncMode};
use prost::Message;

use crate::stats;

pub fn profile(rank: u32, events: usize) -> Vec<u8> {
    let events = (0..events as u64)
        .map(|e| EventSample {
            event_id: e.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            calls: 10,
            subrs: 2,
            incl_us: 100.0 + e as f64,
            excl_us: 50.0,
            calls_total: 1000,
            subrs_total: 200,
            incl_total_us: 1e4,
            excl_total_us: 5e3,
            ..Default::default()
        })
        .collect();
    ProfileBatch {
        profiles: vec![RankProfile {
            rank,
            events,
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

pub fn run(sources: &[usize], rounds: u64, events: usize, repeats: usize) -> anyhow::Result<()> {
    println!(
        "\n## engine: rounds per second through one node (wait-for-all, passthrough), {events} events per rank"
    );
    println!(
        "| sources | bytes/round | engine rounds/s (median) | min | max | baseline rounds/s | engine/baseline |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let plugins = canopy_core::plugin::filters_from(&[]);
    for &n in sources {
        let payloads: Vec<Vec<u8>> = (0..n as u32).map(|r| profile(r, events)).collect();
        let ids: Vec<String> = (0..n).map(|i| format!("rank:{i}")).collect();
        let bytes: usize = payloads.iter().map(Vec::len).sum();
        let mut with_engine = Vec::new();
        let mut baseline = Vec::new();
        for _ in 0..repeats {
            let mut e = RoundEngine::new();
            for id in &ids {
                e.add_source(id, 1);
            }
            e.open_stream(
                1,
                StreamSync {
                    mode: SyncMode::WaitForAll,
                    timeout: Duration::from_secs(60),
                },
            );
            // The real plugin, loaded from beside this executable as the daemons load it.
            let mut filter = plugins.create("passthrough", "", Level::Relay)?;
            let t = Instant::now();
            let now = tokio::time::Instant::now();
            for round in 0..rounds {
                for (id, p) in ids.iter().zip(&payloads) {
                    let a = Arrival {
                        source: id.clone(),
                        // A rank's coverage names its application, as a leaf's does.
                        coverage: Coverage {
                            covered: 1,
                            expected: 1,
                            missing: vec![],
                            apps: vec![AppCoverage {
                                app: "bench".into(),
                                covered: 1,
                                expected: 1,
                                missing: vec![],
                            }],
                            unreachable: vec![],
                        },
                        payload: p.clone().into(),
                        first_dump_unix_ns: 0,
                    };
                    if let Accepted::Closed(c) = e.accept(
                        GroupKey {
                            stream: 1,
                            round,
                            phase: 0,
                        },
                        a,
                        now,
                    )? {
                        let inputs: Vec<&[u8]> = c.inputs.iter().map(|a| a.payload.as_ref()).collect();
                        std::hint::black_box(filter.upstream(round, 0, &inputs)?);
                    }
                }
            }
            with_engine.push(rounds as f64 / t.elapsed().as_secs_f64());
            // The least any node must do: copy each payload once and append it to the round's packet.
            let t = Instant::now();
            for _ in 0..rounds {
                let mut merged = Vec::with_capacity(bytes);
                for p in &payloads {
                    let owned = p.clone();
                    merged.extend_from_slice(&owned);
                }
                std::hint::black_box(merged);
            }
            baseline.push(rounds as f64 / t.elapsed().as_secs_f64());
        }
        let (m, lo, hi) = stats(with_engine);
        let (b, _, _) = stats(baseline);
        println!(
            "| {n} | {bytes} | {m:.0} | {lo:.0} | {hi:.0} | {b:.0} | {:.3} |",
            m / b
        );
    }
    Ok(())
}
