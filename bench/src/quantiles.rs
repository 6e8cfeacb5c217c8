//! `canopy-bench tree --filter stats --quantiles-cost`: what the stats filter's quantiles cost a tree. Each
//! repeat runs the same tree in this process twice, the stream without quantiles (the default) then
//! with its defaults (p50, p90 and p99 from DDSketches at 1%); the medians of both, with min and max, and the
//! ratios of with to without.

use crate::{Shape, TreeRun, stats, tree_run};

pub async fn cost(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        shape.filter == "stats",
        "--quantiles-cost measures the stats filter, not {:?}",
        shape.filter
    );
    println!(
        "\n## stats without and with quantiles: {} simulated ranks, {} agents, fanout {}, {} events, one round every {} ms, in-process daemons",
        shape.ranks, shape.agents, shape.fanout, shape.events, shape.period_ms
    );
    let variants = [
        ("stats, no quantiles", None),
        ("stats, p50 p90 p99", Some(r#"{"quantiles": true}"#.to_string())),
    ];
    let mut runs: [Vec<TreeRun>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..repeats {
        for (i, (_, params)) in variants.iter().enumerate() {
            let shape = Shape {
                filter: shape.filter.clone(),
                params: params.clone(),
                ..*shape
            };
            runs[i].push(tree_run(&shape).await?);
        }
    }
    println!(
        "| stream | stored rounds/s (median) | min | max | latency p50 ms | latency p99 ms (median) | min | max | CPU ms per round (median) | min | max |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for ((label, _), runs) in variants.iter().zip(&runs) {
        let (r, rlo, rhi) = stats(runs.iter().map(|r| r.rate).collect());
        let (p50, _, _) = stats(runs.iter().map(|r| r.p50_ms).collect());
        let (p99, p99lo, p99hi) = stats(runs.iter().map(|r| r.p99_ms).collect());
        let (cpu, cpu_lo, cpu_hi) = stats(runs.iter().map(|r| r.cpu_ms_per_round).collect());
        println!(
            "| {label} | {r:.1} | {rlo:.1} | {rhi:.1} | {p50:.2} | {p99:.2} | {p99lo:.2} | {p99hi:.2} | {cpu:.2} | {cpu_lo:.2} | {cpu_hi:.2} |"
        );
        medians.push((r, cpu, p99));
    }
    let ((r0, c0, p0), (r1, c1, p1)) = (medians[0], medians[1]);
    println!(
        "\nwith/without quantiles: throughput {:.3}, CPU per round {:.3}, latency p99 {:.3}",
        r1 / r0.max(f64::MIN_POSITIVE),
        c1 / c0.max(f64::MIN_POSITIVE),
        p1 / p0.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
