//! `canopy-bench model`: what a node costs per rank-round and per child packet, measured on trees of processes,
//! and a model built from those costs that predicts any tree's throughput, latency and CPU per level.
//!
//! The costs come from calibration trees (`canopy up`, every node a process) chosen so each kind of node is seen
//! with two loads: agents with few and many ranks, relays and the front-end with few and many children. For each
//! kind a least-squares line through the runs gives a cost per round and a cost per input (a rank-round at an
//! agent, a child's packet at a relay or the front-end). The simulated ranks' generation, which in a deployment
//! is the ranks' own work in the SDK, is measured apart in-process and taken out of the agent's cost.
//!
//! The model then predicts, for a tree of any size and fanout:
//! - CPU per round by level: the nodes' counts from the same topology `canopy up` builds, times their costs;
//! - throughput on this machine: every node shares its cores, so the rate is the cores over the CPU of a round
//!   (and at most the rate offered); on real nodes each node has its own core, so the rate is one over the
//!   costliest node's CPU per round;
//! - latency at a light rate: a constant, a cost per hop (both fitted on the calibration trees at that rate), and
//!   the work of one round along the path from an agent to the front-end.
//!
//! It checks itself against trees that were not used to build it, measured the same way, and prints its
//! predictions for deployments of 100,000 and 1,000,000 ranks.

use std::time::Instant;

use canopy_agent::sim::Selection;

use crate::{Shape, TreeRun, stats, tree_run};

mod tree;
pub use tree::*;

/// The plan of a `model` run.
pub struct Plan<'a> {
    pub calibrate: &'a [TreeShape],
    pub check: &'a [TreeShape],
    pub events: u32,
    pub filter: &'a str,
    /// Rounds of a saturated run; a tree's run is shortened so it takes about as long as a small one's.
    pub rounds: u64,
    /// The light rate's period for latency, ms.
    pub light_period_ms: u64,
    pub light_rounds: u64,
    pub deploy_ranks: &'a [f64],
    pub deploy_ranks_per_agent: &'a [f64],
    pub deploy_fanouts: &'a [usize],
}

/// The cores this machine gives the tree.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// One measured tree: saturated (CPU per round by kind, rate, coverage) and at a light rate (latency).
struct Measured {
    shape: TreeShape,
    census: Census,
    /// The saturated runs' period, ms.
    period_ms: u64,
    /// Per repeat: CPU per round by kind in us (a long run's CPU less a short one's, over the rounds between, so
    /// neither start nor end counts), rounds per second from the long run's first dump to its last close, and
    /// its coverage in percent.
    saturated: Vec<(crate::processes::CpuByKind, f64, f64)>,
    /// The light runs' period, ms, and their p50s in us.
    light_ms: u64,
    light_p50_us: Vec<f64>,
}

impl Measured {
    /// A kind's CPU per round, us: the median over the repeats.
    fn cpu_us(&self, kind: fn(&crate::processes::CpuByKind) -> f64) -> f64 {
        stats(self.saturated.iter().map(|(c, _, _)| kind(c)).collect()).0
    }

    fn rate(&self) -> f64 {
        stats(self.saturated.iter().map(|(_, r, _)| *r).collect()).0
    }

    /// The lowest coverage of the saturated runs, percent of rank-rounds.
    fn coverage(&self) -> f64 {
        self.saturated.iter().map(|(_, _, c)| *c).fold(100.0, f64::min)
    }

    fn p50_us(&self) -> f64 {
        stats(self.light_p50_us.clone()).0
    }
}

/// Measures `shape`: saturated with a round offered every `period_ms`, then at a light rate.
async fn measure(
    plan: &Plan<'_>,
    shape: TreeShape,
    period_ms: u64,
    repeats: usize,
) -> anyhow::Result<Measured> {
    let census = Census::of(f64::from(shape.ranks), shape.agents, shape.fanout)?;
    // A large tree runs fewer rounds, so each run takes about as long as a small one's.
    let rounds = (plan.rounds * 256 / u64::from(shape.ranks).max(256)).max(30);
    // Saturated, a round may wait behind the whole window of rounds in flight: it is given the time.
    let run = |period_ms: u64, rounds: u64, timeout_ms: u32| Shape {
        ranks: shape.ranks,
        agents: shape.agents,
        fanout: shape.fanout,
        events: plan.events,
        period_ms,
        rounds,
        filter: plan.filter.to_string(),
        params: None,
        processes: true,
        tls: true,
        timeout_ms,
    };
    let total = |r: &TreeRun| {
        let c = r.cpu_by_kind.unwrap_or_default();
        let n = r.rounds as f64 * 1e3;
        (c.frontend * n, c.relays * n, c.agents * n)
    };
    let mut m = Measured {
        shape,
        census,
        period_ms,
        saturated: Vec::new(),
        light_ms: plan.light_period_ms,
        light_p50_us: Vec::new(),
    };
    for _ in 0..repeats {
        let short = tree_run(&run(period_ms, rounds, 60_000)).await?;
        let long = tree_run(&run(period_ms, 3 * rounds, 60_000)).await?;
        let (a, b) = (total(&short), total(&long));
        let between = long.rounds.saturating_sub(short.rounds).max(1) as f64;
        let cpu = crate::processes::CpuByKind {
            frontend: (b.0 - a.0) / between,
            relays: (b.1 - a.1) / between,
            agents: (b.2 - a.2) / between,
        };
        let rate = long.rounds as f64 / long.elapsed_s.max(1e-9);
        m.saturated.push((cpu, rate, long.coverage.min(short.coverage)));
    }
    // Light: a third of the rate the tree sustains at most, so no round waits behind another; at most 20 s.
    let light_ms = plan
        .light_period_ms
        .max((3000.0 / m.rate().max(1e-3)).ceil() as u64);
    let light_rounds = plan.light_rounds.min(20_000 / light_ms).max(20);
    for _ in 0..repeats {
        let r = tree_run(&run(light_ms, light_rounds, 5000)).await?;
        m.light_p50_us.push(r.p50_ms * 1e3);
    }
    m.light_ms = light_ms;
    eprintln!(
        "  measured {shape}: {:.1} rounds/s, p50 {:.2} ms at a round every {light_ms} ms",
        m.rate(),
        m.p50_us() / 1e3,
    );
    Ok(m)
}

/// The simulated ranks' generation and encoding per rank-round, in-process, one thread.
fn generate_us(events: u32, repeats: usize) -> f64 {
    let (ranks, rounds) = (64u32, 200u64);
    let xs = (0..repeats)
        .map(|_| {
            let mut sim = crate::leaf::flash(ranks, events);
            let selection = Selection::everything();
            let t = Instant::now();
            for round in 0..rounds {
                sim.encode_round(round, 1, &selection, |_, b| {
                    std::hint::black_box(b);
                });
            }
            t.elapsed().as_secs_f64() * 1e6 / (f64::from(ranks) * rounds as f64)
        })
        .collect();
    stats(xs).0
}

/// Fits the model's costs to the calibration trees: each kind's line by least squares, no cost below zero.
fn calibrate(generate: f64, runs: &[Measured]) -> anyhow::Result<Costs> {
    let need = |what: &str, fitted: Option<(f64, f64)>| {
        fitted.ok_or_else(|| {
            anyhow::anyhow!(
                "the calibration trees do not tell {what}'s cost per round from its cost per input: give shapes \
                 with other loads"
            )
        })
    };
    let agent = need(
        "an agent",
        fit_non_negative(
            &runs
                .iter()
                .map(|m| {
                    let own = m.cpu_us(|c| c.agents) - generate * m.census.ranks;
                    (m.census.agents, m.census.ranks, own)
                })
                .collect::<Vec<_>>(),
        ),
    )?;
    let with_relays: Vec<_> = runs
        .iter()
        .filter(|m| m.census.relays > 0.0)
        .map(|m| (m.census.relays, m.census.relay_children, m.cpu_us(|c| c.relays)))
        .collect();
    let relay = need("a relay", fit_non_negative(&with_relays))?;
    let root = need(
        "the front-end",
        fit_non_negative(
            &runs
                .iter()
                .map(|m| (1.0, m.census.root_children, m.cpu_us(|c| c.frontend)))
                .collect::<Vec<_>>(),
        ),
    )?;
    let mut costs = Costs {
        generate,
        agent: Line {
            per_round: agent.0,
            per_input: agent.1,
        },
        relay: Line {
            per_round: relay.0,
            per_input: relay.1,
        },
        root: Line {
            per_round: root.0,
            per_input: root.1,
        },
        ..Costs::default()
    };
    // Latency: what the path's work does not explain, as a constant and a cost per hop.
    let latency = need(
        "the latency",
        fit_non_negative(
            &runs
                .iter()
                .map(|m| {
                    let work = costs
                        .predict(
                            &m.census,
                            true,
                            Machine::Shared {
                                cores: cores(),
                                offered: f64::INFINITY,
                            },
                        )
                        .latency_ms
                        * 1e3;
                    (1.0, m.census.hops, m.p50_us() - work)
                })
                .collect::<Vec<_>>(),
        ),
    )?;
    costs.latency_base = latency.0;
    costs.latency_hop = latency.1;
    Ok(costs)
}

/// `canopy-bench model`.
pub async fn run(plan: &Plan<'_>, repeats: usize) -> anyhow::Result<()> {
    let cores = cores();
    println!(
        "\n## model: `{}` over {} events a rank, TLS, trees of processes on {cores} cores; saturated runs offered a \
         round every ms (calibration) or twice the rate predicted (checks); latency at a round every {} ms or \
         more (a third of the tree's saturated rate)",
        plan.filter, plan.events, plan.light_period_ms
    );
    let generate = generate_us(plan.events, repeats.max(3));
    eprintln!("calibration trees:");
    let mut calibration = Vec::new();
    for shape in plan.calibrate {
        calibration.push(measure(plan, *shape, 1, repeats).await?);
    }
    let costs = calibrate(generate, &calibration)?;
    println!("\n| cost (us of CPU) | per round | per input |");
    println!("|---|---:|---:|");
    println!(
        "| simulated ranks' generation (the ranks' own work, apart) | | {:.2} per rank-round |",
        costs.generate
    );
    println!(
        "| agent, its ranks' generation apart | {:.1} | {:.2} per rank-round |",
        costs.agent.per_round, costs.agent.per_input
    );
    println!(
        "| relay | {:.1} | {:.1} per child packet |",
        costs.relay.per_round, costs.relay.per_input
    );
    println!(
        "| front-end with its store | {:.1} | {:.1} per child packet |",
        costs.root.per_round, costs.root.per_input
    );
    println!(
        "| latency at a light rate, beyond the path's work | {:.0} | {:.0} per hop |",
        costs.latency_base, costs.latency_hop
    );
    let calibrated: Vec<String> = plan.calibrate.iter().map(ToString::to_string).collect();
    println!("\nCalibrated on {}.", calibrated.join(", "));

    eprintln!("trees checked:");
    let mut checked = Vec::new();
    for shape in plan.check {
        // Offered twice the rate predicted (at most a round a millisecond): saturated, while the rounds in flight
        // stay well within their time-out.
        let c = Census::of(f64::from(shape.ranks), shape.agents, shape.fanout)?;
        let predicted = costs
            .predict(
                &c,
                true,
                Machine::Shared {
                    cores,
                    offered: 1000.0,
                },
            )
            .rate;
        let period_ms = ((1000.0 / (2.0 * predicted)).floor() as u64).max(1);
        checked.push(measure(plan, *shape, period_ms, repeats).await?);
    }
    println!(
        "\n| tree (ranks:agents:fanout) | offered a round every (ms) | rounds/s measured | predicted | ratio | coverage | CPU ms a round: agents | relays | \
         front-end | predicted: agents | relays | front-end | light: a round every (ms) | p50 ms measured | predicted | \
         ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in calibration.iter().chain(&checked) {
        let p = costs.predict(
            &m.census,
            true,
            Machine::Shared {
                cores,
                offered: 1000.0 / m.period_ms as f64,
            },
        );
        let rate = m.rate();
        let p50 = m.p50_us() / 1e3;
        let mark = if calibration
            .iter()
            .any(|c| c.shape.to_string() == m.shape.to_string())
        {
            " (calibration)"
        } else {
            ""
        };
        println!(
            "| {}{mark} | {} | {rate:.1} | {:.1} | {:.2} | {:.1}% | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {p50:.2} | {:.2} | {:.2} |",
            m.shape,
            m.period_ms,
            p.rate,
            rate / p.rate,
            m.coverage(),
            m.cpu_us(|c| c.agents) / 1e3,
            m.cpu_us(|c| c.relays) / 1e3,
            m.cpu_us(|c| c.frontend) / 1e3,
            p.agents_ms,
            p.relays_ms,
            p.root_ms,
            m.light_ms,
            p.latency_ms,
            p50 / p.latency_ms,
        );
    }

    println!(
        "\n## model's predictions for deployments: one agent per node, its ranks real (their own work apart), every \
         node on its own core"
    );
    println!(
        "\n| ranks | ranks an agent | fanout | levels of relays | relays | rounds/s at most (bound by) | p50 ms at a light rate | \
         CPU a round: agent ms | relay ms (busiest) | front-end ms |"
    );
    println!("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for &ranks in plan.deploy_ranks {
        for &per_agent in plan.deploy_ranks_per_agent {
            let agents = (ranks / per_agent).ceil() as usize;
            let mut best: Option<(usize, Prediction)> = None;
            for &fanout in plan.deploy_fanouts {
                let c = Census::of(ranks, agents, fanout)?;
                let p = costs.predict(&c, false, Machine::Spread);
                println!(
                    "| {ranks:.0} | {per_agent:.0} | {fanout} | {} | {:.0} | {:.0} ({}) | {:.2} | {:.3} | {:.3} | {:.3} |",
                    c.path_children.len(),
                    c.relays,
                    p.rate,
                    p.bottleneck,
                    p.latency_ms,
                    p.agent_ms,
                    p.relay_ms,
                    p.root_ms,
                );
                // Advised: the lowest latency among the fanouts whose rate is within 10% of the best.
                best = match best {
                    Some((f, b)) if !better(&p, &b) => Some((f, b)),
                    _ => Some((fanout, p)),
                };
            }
            if let Some((fanout, p)) = best {
                println!(
                    "| | | **advised: {fanout}** | | | {:.0} | {:.2} | | | |",
                    p.rate, p.latency_ms
                );
            }
        }
    }
    Ok(())
}
