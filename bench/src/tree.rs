//! A tree on loopback (in-process daemons, or processes through `canopy up`), run to its end and read back from
//! its store: the shape, the run's figures, and the `tree` and TLS-cost benchmarks over them.

use std::time::Duration;

use anyhow::Context as _;
use canopy_integration_tests::TreeBuilder;

use crate::{percentile, processes, stats};

/// A tree benchmark's shape.
pub struct Shape {
    pub ranks: u32,
    pub agents: usize,
    pub fanout: usize,
    pub events: u32,
    pub period_ms: u64,
    pub rounds: u64,
    pub filter: String,
    /// The stream's parameters (JSON), in-process only; `None`: the filter's defaults.
    pub params: Option<String>,
    /// Separate processes (`canopy up`) instead of in-process daemons.
    pub processes: bool,
    /// Mutual TLS between the nodes (the default of a deployed tree); otherwise plaintext on loopback.
    pub tls: bool,
    /// Milliseconds a round waits for a missing child.
    pub timeout_ms: u32,
}

/// One run of a tree on loopback, read back from its store.
pub struct TreeRun {
    /// Rounds stored per second.
    pub rate: f64,
    /// Rounds stored, and the seconds from the first round's first dump to the last round's close.
    pub rounds: usize,
    pub elapsed_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency p50 of the first and of the last quarter of the rounds: a lag that grows shows between them.
    pub first_quarter_ms: f64,
    pub last_quarter_ms: f64,
    pub coverage: f64,
    /// CPU of every daemon of the tree (with the simulated ranks' generation at the agents) per round stored,
    /// in ms: the whole process's in-process, the sum of the processes' with `processes`.
    pub cpu_ms_per_round: f64,
    /// With `processes`: the CPU per round by kind of process.
    pub cpu_by_kind: Option<processes::CpuByKind>,
}

/// User and system CPU this process has used.
fn process_cpu() -> anyhow::Result<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let d = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Ok(d(u.user_time()) + d(u.system_time()))
}

/// Runs one tree of `shape` to its end.
pub async fn tree_run(shape: &Shape) -> anyhow::Result<TreeRun> {
    if shape.processes {
        let dir = tempfile::tempdir()?;
        let (store, cpu) = processes::run(shape, dir.path())?;
        return read_run(&store, cpu.total(), Some(cpu));
    }
    let builder = TreeBuilder {
        agents: shape.agents,
        fanout: shape.fanout,
        ranks: shape.ranks,
        rounds: shape.rounds,
        period_ms: shape.period_ms,
        events: shape.events,
        timeout_ms: shape.timeout_ms,
        streams: vec![shape.filter.clone()],
        stream_params: shape
            .params
            .iter()
            .map(|p| (shape.filter.clone(), p.clone()))
            .collect(),
        tls: shape.tls,
        ..TreeBuilder::default()
    };
    let cpu_before = process_cpu()?;
    let mut sandbox = builder.start().await;
    sandbox
        .wait_frontend(Duration::from_secs(600))
        .await
        .map_err(anyhow::Error::msg)?;
    let cpu = process_cpu()? - cpu_before;
    let rounds = canopy_store::StoreReader::open(&sandbox.store)?
        .rounds(canopy_store::Select::all())?
        .len();
    read_run(
        &sandbox.store,
        cpu.as_secs_f64() * 1e3 / rounds.max(1) as f64,
        None,
    )
}

/// A finished run's figures, from its store.
fn read_run(
    store: &std::path::Path,
    cpu_ms_per_round: f64,
    cpu_by_kind: Option<processes::CpuByKind>,
) -> anyhow::Result<TreeRun> {
    let mut stored = canopy_store::StoreReader::open(store)?.rounds(canopy_store::Select::all())?;
    stored.sort_by_key(|r| r.round);
    let rows: Vec<(i64, i64, i64, i64)> = stored
        .iter()
        .map(|r| {
            let at = |t: Option<u64>| t.context("a round without its times").map(|t| t as i64);
            Ok((
                at(r.first_dump_unix_ns)?,
                at(r.closed_unix_ns)?,
                r.covered.into(),
                r.expected.into(),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let lat: Vec<f64> = rows.iter().map(|(f, c, _, _)| (c - f) as f64 / 1e6).collect();
    let span = (rows.last().map(|r| r.1).unwrap_or(0) - rows.first().map(|r| r.1).unwrap_or(0)) as f64 / 1e9;
    let q = (lat.len() / 4).max(1);
    let (cov, exp) = rows.iter().fold((0i64, 0i64), |(a, b), r| (a + r.2, b + r.3));
    let elapsed = rows.iter().map(|r| r.1).max().unwrap_or(0) - rows.iter().map(|r| r.0).min().unwrap_or(0);
    Ok(TreeRun {
        rate: (rows.len().saturating_sub(1)) as f64 / span.max(1e-9),
        rounds: rows.len(),
        elapsed_s: elapsed as f64 / 1e9,
        p50_ms: percentile(lat.clone(), 0.5),
        p99_ms: percentile(lat.clone(), 0.99),
        first_quarter_ms: percentile(lat[..q.min(lat.len())].to_vec(), 0.5),
        last_quarter_ms: percentile(lat[lat.len().saturating_sub(q)..].to_vec(), 0.5),
        coverage: 100.0 * cov as f64 / exp.max(1) as f64,
        cpu_ms_per_round,
        cpu_by_kind,
    })
}

pub async fn tree(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    let Shape {
        ranks,
        agents,
        fanout,
        events,
        period_ms,
        ref filter,
        processes,
        ..
    } = *shape;
    let how = if processes {
        "separate processes (canopy up)"
    } else {
        "in-process daemons"
    };
    println!(
        "\n## tree: {ranks} simulated ranks, {agents} agents, fanout {fanout}, {events} events, one round every {period_ms} ms, {filter}, {how} over loopback gRPC"
    );
    let offered = 1000.0 / period_ms as f64;
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut coverage = Vec::new();
    let mut cpu = Vec::new();
    let mut by_kind = Vec::new();
    for _ in 0..repeats {
        let run = tree_run(shape).await?;
        cpu.push(run.cpu_ms_per_round);
        by_kind.extend(run.cpu_by_kind);
        rates.push(run.rate);
        p50s.push(run.p50_ms);
        p99s.push(run.p99_ms);
        coverage.push(run.coverage);
    }
    let (r, rlo, rhi) = stats(rates);
    let (p50, _, _) = stats(p50s);
    let (p99, p99lo, p99hi) = stats(p99s);
    let (c, _, _) = stats(coverage);
    let (cpu, cpu_lo, cpu_hi) = stats(cpu);
    println!(
        "| offered rounds/s | stored rounds/s (median) | min | max | stored/offered | latency p50 ms | latency p99 ms (median) | p99 min | p99 max | coverage % |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {offered:.1} | {r:.1} | {rlo:.1} | {rhi:.1} | {:.3} | {p50:.2} | {p99:.2} | {p99lo:.2} | {p99hi:.2} | {c:.1} |",
        r / offered
    );
    // Their own tables, so the one above keeps its columns for the tools that read it.
    if !by_kind.is_empty() {
        print_cpu_by_kind(&[(format!("{} runs", by_kind.len()), by_kind)]);
        return Ok(());
    }
    println!(
        "\n| CPU ms per round stored, whole process: every daemon and the simulated ranks' generation (median) | min | max |"
    );
    println!("|---:|---:|---:|");
    println!("| {cpu:.2} | {cpu_lo:.2} | {cpu_hi:.2} |");
    Ok(())
}

/// What mutual TLS costs: each repeat runs the tree in plaintext, then on TLS, in this process; the medians of
/// both, and TLS's ratio to plaintext.
pub async fn tls_cost(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    let how = if shape.processes {
        "separate processes (canopy up)"
    } else {
        "in-process daemons"
    };
    println!(
        "\n## tree, plaintext against mutual TLS: {} simulated ranks, {} agents, fanout {}, {} events, one round every {} ms, {}, {how}",
        shape.ranks, shape.agents, shape.fanout, shape.events, shape.period_ms, shape.filter
    );
    let mut runs: [Vec<TreeRun>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..repeats {
        for (i, tls) in [false, true].into_iter().enumerate() {
            let shape = Shape {
                tls,
                filter: shape.filter.clone(),
                params: shape.params.clone(),
                ..*shape
            };
            runs[i].push(tree_run(&shape).await?);
        }
    }
    println!(
        "| links | stored rounds/s (median) | min | max | latency p50 ms | latency p99 ms | CPU ms per round (median) | min | max | coverage % |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (label, runs) in ["plaintext", "mutual TLS"].into_iter().zip(&runs) {
        let (r, rlo, rhi) = stats(runs.iter().map(|r| r.rate).collect());
        let (p50, _, _) = stats(runs.iter().map(|r| r.p50_ms).collect());
        let (p99, _, _) = stats(runs.iter().map(|r| r.p99_ms).collect());
        let (cpu, cpu_lo, cpu_hi) = stats(runs.iter().map(|r| r.cpu_ms_per_round).collect());
        let (c, _, _) = stats(runs.iter().map(|r| r.coverage).collect());
        println!(
            "| {label} | {r:.1} | {rlo:.1} | {rhi:.1} | {p50:.2} | {p99:.2} | {cpu:.2} | {cpu_lo:.2} | {cpu_hi:.2} | {c:.1} |"
        );
        medians.push((r, cpu, p50));
    }
    let ((r0, c0, p0), (r1, c1, p1)) = (medians[0], medians[1]);
    println!(
        "\nTLS/plaintext: throughput {:.3}, CPU per round {:.3}, latency p50 {:.3}",
        r1 / r0.max(f64::MIN_POSITIVE),
        c1 / c0.max(f64::MIN_POSITIVE),
        p1 / p0.max(f64::MIN_POSITIVE)
    );
    Ok(())
}

/// CPU per round by kind of process, one row per labelled set of repeats: median, min and max of each kind.
pub fn print_cpu_by_kind(rows: &[(String, Vec<processes::CpuByKind>)]) {
    println!(
        "\n| CPU ms per round stored, from /proc (median, min to max) | front-end | relays, all | agents, all (with the simulated ranks) | total |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, runs) in rows {
        let col = |f: fn(&processes::CpuByKind) -> f64| {
            let (m, lo, hi) = stats(runs.iter().map(f).collect());
            format!("{m:.2} ({lo:.2} to {hi:.2})")
        };
        println!(
            "| {label} | {} | {} | {} | {} |",
            col(|c| c.frontend),
            col(|c| c.relays),
            col(|c| c.agents),
            col(processes::CpuByKind::total)
        );
    }
}
