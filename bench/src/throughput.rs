//! `canopy-bench throughput`: the highest round rate a tree sustains without a growing lag, for a number of
//! simulated ranks, a fanout and a filter: offered rates go up until one is not kept (rounds stored per second
//! below 97% of those offered, or the latency of the last quarter of the rounds above twice the first
//! quarter's plus 20 ms); the table gives the last rate kept, with its latency from the round's first dump to
//! its stored result (p50, p99), median over the repeats.

use crate::{Shape, stats, tree_run};

pub async fn run(
    sizes: &[u32],
    fanouts: &[usize],
    filters: &[String],
    rates: &[u64],
    events: u32,
    repeats: usize,
) -> anyhow::Result<()> {
    println!(
        "\n## throughput: simulated ranks ({events} events, flash), 128 ranks per agent, in-process daemons over loopback gRPC"
    );
    println!(
        "\n| ranks | fanout | filter | highest rate kept, rounds/s | stored rounds/s (median) | min | max | latency p50 ms | p99 ms (median) | p99 min | p99 max | CPU ms per round, whole process (median) | next rate: stored/offered |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for &ranks in sizes {
        for &fanout in fanouts {
            for filter in filters {
                let mut kept: Option<(u64, Vec<crate::TreeRun>)> = None;
                let mut next = String::from("-");
                for &rate in rates {
                    let period_ms = (1000 / rate.max(1)).max(1);
                    let shape = Shape {
                        ranks,
                        agents: (ranks as usize / 128).max(1),
                        fanout,
                        events,
                        period_ms,
                        rounds: (rate * 3).clamp(30, 600),
                        filter: filter.clone(),
                    };
                    let mut runs = Vec::new();
                    for _ in 0..repeats {
                        runs.push(tree_run(&shape).await?);
                    }
                    let offered = 1000.0 / period_ms as f64;
                    let (r, _, _) = stats(runs.iter().map(|r| r.rate).collect());
                    let (first, _, _) = stats(runs.iter().map(|r| r.first_quarter_ms).collect());
                    let (last, _, _) = stats(runs.iter().map(|r| r.last_quarter_ms).collect());
                    if r >= 0.97 * offered && last <= 2.0 * first + 20.0 {
                        kept = Some((rate, runs));
                    } else {
                        next = format!("{rate}: {:.2}", r / offered);
                        break;
                    }
                }
                match kept {
                    Some((rate, runs)) => {
                        let (r, rlo, rhi) = stats(runs.iter().map(|r| r.rate).collect());
                        let (p50, _, _) = stats(runs.iter().map(|r| r.p50_ms).collect());
                        let (p99, p99lo, p99hi) = stats(runs.iter().map(|r| r.p99_ms).collect());
                        let (cpu, _, _) = stats(runs.iter().map(|r| r.cpu_ms_per_round).collect());
                        println!(
                            "| {ranks} | {fanout} | {filter} | {rate} | {r:.1} | {rlo:.1} | {rhi:.1} | {p50:.2} | {p99:.2} | {p99lo:.2} | {p99hi:.2} | {cpu:.2} | {next} |"
                        );
                    }
                    None => println!(
                        "| {ranks} | {fanout} | {filter} | below {} | | | | | | | | | {next} |",
                        rates[0]
                    ),
                }
            }
        }
    }
    Ok(())
}
