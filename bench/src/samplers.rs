//! `canopy-bench samplers`: what the agent's node samplers cost. Two tables:
//!
//! - `sample`: one sample of this machine's /proc in-process, by sampler and with all five, as the CPU time of
//!   the sampling thread (its schedstat, in nanoseconds, so other threads and processes do not count), and what
//!   it makes at one sample a second.
//! - `agent`: two idle `canopy-agent` processes attached to one front-end, one sampling every `--period-ms` on
//!   its samplers' thread and one with no samplers, over the same windows: the samplers thread's CPU and each
//!   whole agent's, summed over its threads (from /proc/PID/task/TID/schedstat, in nanoseconds: utime and stime
//!   move in 10 ms ticks, as much as a whole window's sampling).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use canopy_agent::samplers::{Roots, SamplerKind, Samplers, THREAD_NAME};
use canopy_integration_tests::{Proc, start_frontend};
use canopy_proto::filters::v1::NodeSample;

use crate::stats;

/// What to measure.
pub struct Plan<'a> {
    pub tables: &'a [String],
    /// Samples per repeat of the `sample` table.
    pub samples: u32,
    /// The sampling period of the `agent` table's agent.
    pub period_ms: u64,
    /// Seconds per repeat of the `agent` table.
    pub seconds: f64,
    pub repeats: usize,
}

pub fn run(plan: &Plan<'_>) -> anyhow::Result<()> {
    for table in plan.tables {
        match table.as_str() {
            "sample" => sample(plan),
            "agent" => agent(plan)?,
            other => anyhow::bail!("unknown table `{other}`: expected sample or agent"),
        }
    }
    Ok(())
}

/// This thread's CPU time so far (user and system), to the nanosecond (CLOCK_THREAD_CPUTIME_ID: getrusage's
/// per-thread times, and the scheduler's account of a running thread, move in clock ticks, coarser than a
/// sample).
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

fn sample(plan: &Plan<'_>) {
    println!(
        "\n## samplers: one sample of this machine's /proc, CPU of the sampling thread, {} samples per repeat, {} repeats",
        plan.samples, plan.repeats
    );
    println!("| samplers | us per sample (median) | min | max | share of a core at 1 sample/s |");
    println!("|---|---:|---:|---:|---:|");
    let sets: Vec<(String, Vec<SamplerKind>)> = SamplerKind::ALL
        .iter()
        .map(|k| (k.name().to_string(), vec![*k]))
        .chain(std::iter::once((
            "all five".to_string(),
            SamplerKind::ALL.to_vec(),
        )))
        .collect();
    for (name, kinds) in sets {
        let mut samplers = Samplers::start(&kinds, &Roots::default());
        if samplers.running().len() != kinds.len() {
            println!("| {name} | left out: see the log | | | |");
            continue;
        }
        let mut per_sample = Vec::with_capacity(plan.repeats);
        let mut s = NodeSample::default();
        for _ in 0..plan.repeats.max(1) {
            let before = thread_cpu();
            for _ in 0..plan.samples {
                samplers.read(&mut s);
            }
            let cpu = thread_cpu() - before;
            per_sample.push(cpu.as_secs_f64() * 1e6 / f64::from(plan.samples.max(1)));
        }
        let (m, lo, hi) = stats(per_sample);
        // A sample a second: us per second, as a percentage of one core.
        println!(
            "| {name} | {m:.1} | {lo:.1} | {hi:.1} | {:.4}% |",
            m / 1e6 * 100.0
        );
    }
}

/// Nanoseconds each thread of `pid` has run (schedstat's first field, exact for a thread that is not running),
/// by thread id, with the threads' names.
fn threads_ns(pid: u32) -> HashMap<u32, (String, u64)> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        if let Some(ns) = ns {
            out.insert(tid, (comm.trim().to_string(), ns));
        }
    }
    out
}

/// Nanoseconds the named thread of `pid` has run, if it exists.
fn thread_ns(pid: u32, name: &str) -> Option<u64> {
    threads_ns(pid)
        .into_values()
        .find_map(|(comm, ns)| (comm == name).then_some(ns))
}

/// The CPU time a process's threads had between two readings: a thread's run since the first, or since it
/// started if it is new. A thread that ended in between takes its last run with it (an idle agent's threads
/// live as long as it does).
fn process_ns(before: &HashMap<u32, (String, u64)>, after: &HashMap<u32, (String, u64)>) -> u64 {
    after
        .iter()
        .map(|(tid, (_, ns))| ns.saturating_sub(before.get(tid).map_or(0, |(_, b)| *b)))
        .sum()
}

#[allow(clippy::disallowed_methods)] // the benchmark's own thread waits out its windows
fn agent(plan: &Plan<'_>) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_fe, fe_addr, _store) = start_frontend(dir.path(), &["--streams", "nodes"]);
    let period = plan.period_ms.to_string();
    let start = |id: &str, samplers: &str| -> Proc {
        let socket = dir.path().join(format!("{id}/agent.sock"));
        let args = [
            "--node-id",
            id,
            "--parent",
            &fe_addr,
            "--socket",
            socket.to_str().unwrap_or_default(),
            "--samplers",
            samplers,
            "--sample-period-ms",
            &period,
        ];
        Proc::start(dir.path(), "canopy-agent", id, &args)
    };
    let sampling = start("sampling", "cpu,memory,network,disk,load");
    let without = start("without", "");
    // Attached and settled: the samplers' thread is running and has sampled.
    let settle = Instant::now() + Duration::from_secs(10);
    while thread_ns(sampling.child.id(), THREAD_NAME).is_none() {
        anyhow::ensure!(
            Instant::now() < settle,
            "the agent's samplers thread never ran:\n{}",
            sampling.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(plan.period_ms.max(1000)));
    anyhow::ensure!(
        thread_ns(without.child.id(), THREAD_NAME).is_none(),
        "the agent without samplers has a samplers thread"
    );
    let window = Duration::from_secs_f64(plan.seconds);
    let (mut thread, mut with_all, mut without_all) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.repeats.max(1) {
        let t0 = Instant::now();
        let th0 = thread_ns(sampling.child.id(), THREAD_NAME).unwrap_or(0);
        let (a0, b0) = (threads_ns(sampling.child.id()), threads_ns(without.child.id()));
        std::thread::sleep(window);
        let th1 = thread_ns(sampling.child.id(), THREAD_NAME).unwrap_or(0);
        let (a1, b1) = (threads_ns(sampling.child.id()), threads_ns(without.child.id()));
        let wall = t0.elapsed().as_secs_f64();
        let pct = |ns: u64| 100.0 * ns as f64 / 1e9 / wall;
        thread.push(pct(th1.saturating_sub(th0)));
        with_all.push(pct(process_ns(&a0, &a1)));
        without_all.push(pct(process_ns(&b0, &b1)));
    }
    println!(
        "\n## samplers: an idle agent process sampling every {} ms, {} windows of {:.0} s, % of one core",
        plan.period_ms,
        plan.repeats.max(1),
        plan.seconds
    );
    println!("| what | % of a core (median) | min | max |");
    println!("|---|---:|---:|---:|");
    for (what, xs) in [
        (format!("the samplers' thread ({THREAD_NAME}), all five"), thread),
        ("the whole agent, sampling".to_string(), with_all),
        ("the whole agent, no samplers".to_string(), without_all),
    ] {
        let (m, lo, hi) = stats(xs);
        println!("| {what} | {m:.4} | {lo:.4} | {hi:.4} |");
    }
    for line in sampling.log_text().lines().filter(|l| l.contains("is left out")) {
        println!("\n{line}");
    }
    Ok(())
}
