//! `canopy-bench throughput`: the highest round rate a tree sustains without a growing lag, for a number of
//! simulated ranks, a fanout and a filter: offered rates go up until one is not kept (rounds stored per second
//! below 97% of those offered, or the latency of the last quarter of the rounds above twice the first
//! quarter's plus 20 ms); the table gives the last rate kept, with its latency from the round's first dump to
//! its stored result (p50, p99), median over the repeats.

use crate::{Shape, stats, tree_run};

/// What `throughput` sweeps.
pub struct Sweep<'a> {
    pub sizes: &'a [u32],
    pub fanouts: &'a [usize],
    pub filters: &'a [String],
    pub rates: &'a [u64],
    pub events: u32,
    /// Separate processes (`canopy up`), with CPU by kind of process.
    pub processes: bool,
}

pub async fn run(sweep: &Sweep<'_>, repeats: usize) -> anyhow::Result<()> {
    let Sweep {
        sizes,
        fanouts,
        filters,
        rates,
        events,
        processes,
    } = *sweep;
    let how = if processes {
        "separate processes (canopy up)"
    } else {
        "in-process daemons"
    };
    println!(
        "\n## throughput: simulated ranks ({events} events, flash), 128 ranks per agent, {how} over loopback gRPC"
    );
    println!(
        "\n| ranks | fanout | filter | highest rate kept, rounds/s | stored rounds/s (median) | min | max | latency p50 ms | p99 ms (median) | p99 min | p99 max | CPU ms per round, all daemons (median) | next rate: stored/offered |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut by_kind = Vec::new();
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
                        params: None,
                        processes,
                        tls: true,
                        timeout_ms: 5000,
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
                        let kinds: Vec<_> = runs.iter().filter_map(|r| r.cpu_by_kind).collect();
                        if !kinds.is_empty() {
                            by_kind.push((
                                format!("{ranks} ranks, fanout {fanout}, {filter}, {rate} rounds/s"),
                                kinds,
                            ));
                        }
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
    if !by_kind.is_empty() {
        crate::print_cpu_by_kind(&by_kind);
    }
    Ok(())
}
