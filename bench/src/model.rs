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
use canopy_topology::Topology;

use crate::{Shape, TreeRun, stats, tree_run};

/// A tree by its ranks, agents and fanout (the shape `canopy up --ranks --agents --fanout` builds).
#[derive(Debug, Clone, Copy)]
pub struct TreeShape {
    pub ranks: u32,
    pub agents: usize,
    pub fanout: usize,
}

impl std::str::FromStr for TreeShape {
    type Err = String;

    /// `RANKS:AGENTS:FANOUT`, as the peer kit writes its shapes.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [ranks, agents, fanout] = parts[..] else {
            return Err(format!("{s:?}: expected RANKS:AGENTS:FANOUT"));
        };
        let num = |what: &str, v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{s:?}: {what} {v:?} is not a number"))
        };
        let shape = TreeShape {
            ranks: u32::try_from(num("ranks", ranks)?).map_err(|_| format!("{s:?}: too many ranks"))?,
            agents: num("agents", agents)?,
            fanout: num("fanout", fanout)?,
        };
        if shape.agents == 0 || shape.ranks < shape.agents as u32 {
            return Err(format!("{s:?}: every agent needs a rank"));
        }
        Topology::for_leaves(shape.agents, shape.fanout).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(shape)
    }
}

impl std::fmt::Display for TreeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.ranks, self.agents, self.fanout)
    }
}

/// What a tree holds, by kind of node: the counts and inputs the model's costs multiply.
#[derive(Debug, Clone, PartialEq)]
pub struct Census {
    pub agents: f64,
    pub ranks: f64,
    pub relays: f64,
    /// Packets into relays per round: the relays' children, summed.
    pub relay_children: f64,
    /// The front-end's children.
    pub root_children: f64,
    /// Hops from an agent to the front-end, on the deepest path.
    pub hops: f64,
    /// Children of the relays on the deepest path, from the front-end's child down.
    pub path_children: Vec<f64>,
}

impl Census {
    pub fn of(ranks: f64, agents: usize, fanout: usize) -> anyhow::Result<Census> {
        let t = Topology::for_leaves(agents, fanout).map_err(|e| anyhow::anyhow!("{e}"))?;
        let root = t.root().clone();
        let (mut relays, mut relay_children) = (0.0, 0.0);
        for n in t.nodes() {
            let k = t.children(n).len();
            if *n != root && k > 0 {
                relays += 1.0;
                relay_children += k as f64;
            }
        }
        // The deepest path: down the first child at every level (the topology is balanced).
        let mut path_children = Vec::new();
        let mut at = t.children(&root).first().cloned();
        while let Some(n) = at {
            let below = t.children(&n);
            if below.is_empty() {
                break;
            }
            path_children.push(below.len() as f64);
            at = below.first().cloned();
        }
        Ok(Census {
            agents: agents as f64,
            ranks,
            relays,
            relay_children,
            root_children: t.children(&root).len() as f64,
            hops: path_children.len() as f64 + 1.0,
            path_children,
        })
    }
}

/// A cost per round and a cost per input, in microseconds of CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct Line {
    pub per_round: f64,
    pub per_input: f64,
}

impl Line {
    pub fn at(&self, inputs: f64) -> f64 {
        self.per_round + self.per_input * inputs
    }
}

/// The costs the model is built from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Costs {
    /// The simulated ranks' generation per rank-round (the ranks' own work in a deployment), measured apart.
    pub generate: f64,
    /// An agent, its ranks' generation taken out: per round, and per rank-round.
    pub agent: Line,
    /// A relay: per round, and per child packet.
    pub relay: Line,
    /// The front-end with its store: per round, and per child packet.
    pub root: Line,
    /// Latency at a light rate: a constant, and a cost per hop, in microseconds.
    pub latency_base: f64,
    pub latency_hop: f64,
}

/// Where a tree's nodes run.
#[derive(Debug, Clone, Copy)]
pub enum Machine {
    /// Every node shares these cores (this machine), offered at most `offered` rounds per second.
    Shared { cores: f64, offered: f64 },
    /// Every node on a core of its own (a deployment: one agent a node, relays on nodes of their own).
    Spread,
}

/// What the model predicts for one tree.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    /// CPU per round in ms: agents (with the simulated ranks' generation if theirs), relays, front-end.
    pub agents_ms: f64,
    pub relays_ms: f64,
    pub root_ms: f64,
    /// The CPU of one agent's round, and of the busiest relay's, in ms.
    pub agent_ms: f64,
    pub relay_ms: f64,
    /// Rounds per second at most: shared, the cores over the CPU of a round, and at most the rate offered;
    /// spread, one over the costliest node's CPU per round.
    pub rate: f64,
    /// The kind of node that bounds `rate` when spread; "the cores" when shared.
    pub bottleneck: &'static str,
    /// p50 latency at a light rate, ms.
    pub latency_ms: f64,
}

impl Costs {
    /// The model's prediction for `census`, its agents' ranks simulated (`generate` counts) or real (it does not).
    pub fn predict(&self, c: &Census, simulated: bool, machine: Machine) -> Prediction {
        let gen_per_rank = if simulated { self.generate } else { 0.0 };
        let per_agent_ranks = c.ranks / c.agents;
        let agent_us = self.agent.at(per_agent_ranks) + gen_per_rank * per_agent_ranks;
        let agents_us = c.agents * agent_us;
        let relays_us = self.relay.per_round * c.relays + self.relay.per_input * c.relay_children;
        let root_us = self.root.at(c.root_children);
        let busiest_relay = c.path_children.iter().copied().fold(0.0, f64::max);
        let relay_us = if c.relays > 0.0 {
            self.relay.at(busiest_relay)
        } else {
            0.0
        };
        let path_relays_us: f64 = c.path_children.iter().map(|k| self.relay.at(*k)).sum();
        let (rate, bottleneck, agents_done_us) = match machine {
            Machine::Shared { cores, offered } => {
                let total = agents_us + relays_us + root_us;
                // Every agent works on the round at once: the last is done when the cores have done them all.
                let done = agent_us.max(agents_us / cores);
                ((cores * 1e6 / total).min(offered), "the cores", done)
            }
            Machine::Spread => {
                let (bottleneck, worst) = [("agent", agent_us), ("relay", relay_us), ("front-end", root_us)]
                    .into_iter()
                    .fold(("agent", 0.0), |a, b| if b.1 > a.1 { b } else { a });
                (1e6 / worst, bottleneck, agent_us)
            }
        };
        Prediction {
            agents_ms: agents_us / 1e3,
            relays_ms: relays_us / 1e3,
            root_ms: root_us / 1e3,
            agent_ms: agent_us / 1e3,
            relay_ms: relay_us / 1e3,
            rate,
            bottleneck,
            latency_ms: (self.latency_base
                + self.latency_hop * c.hops
                + agents_done_us
                + path_relays_us
                + root_us)
                / 1e3,
        }
    }
}

/// y = a·u + b·v by least squares over `points` (u, v, y); `None` when the points do not tell a from b.
pub fn fit(points: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let (mut uu, mut uv, mut vv, mut uy, mut vy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (u, v, y) in points {
        uu += u * u;
        uv += u * v;
        vv += v * v;
        uy += u * y;
        vy += v * y;
    }
    let det = uu * vv - uv * uv;
    if det.abs() <= 1e-12 * (uu * vv).max(1e-300) {
        return None;
    }
    Some(((uy * vv - vy * uv) / det, (vy * uu - uy * uv) / det))
}

/// [`fit`], with neither cost below zero: when the best line has one negative, the best with that one at zero.
pub fn fit_non_negative(points: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let (a, b) = fit(points)?;
    if a >= 0.0 && b >= 0.0 {
        return Some((a, b));
    }
    // y = a·u alone, or y = b·v alone: whichever leaves the smaller squared error.
    let one = |pick: fn(&(f64, f64, f64)) -> f64| {
        let (xx, xy) = points.iter().fold((0.0, 0.0), |(xx, xy), p| {
            (xx + pick(p) * pick(p), xy + pick(p) * p.2)
        });
        let k = if xx > 0.0 { (xy / xx).max(0.0) } else { 0.0 };
        let err: f64 = points.iter().map(|p| (p.2 - k * pick(p)).powi(2)).sum();
        (k, err)
    };
    let (ka, ea) = one(|p| p.0);
    let (kb, eb) = one(|p| p.1);
    Some(if ea <= eb { (ka, 0.0) } else { (0.0, kb) })
}

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

/// Whether `a` is the better tree than `b`: a rate at least 10% higher, or within 10% and a lower latency.
fn better(a: &Prediction, b: &Prediction) -> bool {
    if a.rate > b.rate * 1.1 {
        return true;
    }
    if b.rate > a.rate * 1.1 {
        return false;
    }
    a.latency_ms < b.latency_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_least_squares_line_recovers_the_costs_it_was_made_from() {
        let points: Vec<_> = [(2.0, 64.0), (2.0, 512.0), (8.0, 256.0), (16.0, 512.0)]
            .into_iter()
            .map(|(u, v)| (u, v, 40.0 * u + 3.5 * v))
            .collect();
        let (a, b) = fit(&points).unwrap();
        assert!((a - 40.0).abs() < 1e-9 && (b - 3.5).abs() < 1e-9, "{a} {b}");
        // Loads in one proportion do not tell the two costs apart.
        assert_eq!(fit(&[(1.0, 2.0, 3.0), (2.0, 4.0, 6.0)]), None);
        // A constant below zero is no cost: the best line through the origin instead.
        let points = [(1.0, 1.0, 1.0), (1.0, 3.0, 5.0)];
        assert_eq!(fit(&points), Some((-1.0, 2.0)));
        let (a, b) = fit_non_negative(&points).unwrap();
        assert_eq!(a, 0.0);
        assert!((b - 1.6).abs() < 1e-9, "{b}");
    }

    #[test]
    fn a_census_counts_what_canopy_up_builds() {
        // 8 agents under fanout 2: two levels of relays (2 + 4), each with two children.
        let c = Census::of(256.0, 8, 2).unwrap();
        assert_eq!((c.relays, c.relay_children, c.root_children), (6.0, 12.0, 2.0));
        assert_eq!((c.hops, c.path_children.clone()), (3.0, vec![2.0, 2.0]));
        // Agents right under the front-end: no relay, one hop.
        let c = Census::of(64.0, 2, 2).unwrap();
        assert_eq!((c.relays, c.root_children, c.hops), (0.0, 2.0, 1.0));
    }

    #[test]
    fn the_prediction_adds_the_costs_of_every_node() {
        let costs = Costs {
            generate: 10.0,
            agent: Line {
                per_round: 100.0,
                per_input: 2.0,
            },
            relay: Line {
                per_round: 50.0,
                per_input: 20.0,
            },
            root: Line {
                per_round: 300.0,
                per_input: 30.0,
            },
            latency_base: 500.0,
            latency_hop: 100.0,
        };
        let c = Census::of(256.0, 8, 2).unwrap();
        let shared = Machine::Shared {
            cores: 2.0,
            offered: f64::INFINITY,
        };
        let p = costs.predict(&c, true, shared);
        // Agents: 8 x (100 + 32 x 2 + 32 x 10); relays: 6 x 50 + 12 x 20; front-end: 300 + 2 x 30.
        assert!((p.agents_ms - 8.0 * 484.0 / 1e3).abs() < 1e-9);
        assert!((p.relays_ms - 0.54).abs() < 1e-9);
        assert!((p.root_ms - 0.36).abs() < 1e-9);
        let total = 3.872 + 0.54 + 0.36;
        assert!((p.rate - 2.0 * 1e3 / total).abs() < 1e-6);
        // Latency on shared cores: 500 + 3 hops, the eight agents' rounds on two cores, two relays of 2, the
        // front-end.
        let path = 8.0 * 484.0 / 2.0 + 2.0 * 90.0 + 360.0;
        assert!((p.latency_ms - (500.0 + 300.0 + path) / 1e3).abs() < 1e-9);
        // Spread, with real ranks: their generation is theirs; one agent's round is on the path, and the
        // front-end (360 us) bounds the rate against an agent's 164.
        let real = costs.predict(&c, false, Machine::Spread);
        assert!((real.agents_ms - 8.0 * 164.0 / 1e3).abs() < 1e-9);
        assert_eq!(real.bottleneck, "front-end");
        assert!((real.rate - 1e6 / 360.0).abs() < 1e-6);
        let path = 164.0 + 2.0 * 90.0 + 360.0;
        assert!((real.latency_ms - (500.0 + 300.0 + path) / 1e3).abs() < 1e-9);
    }

    #[test]
    fn shapes_are_read_as_the_kit_writes_them() {
        let s: TreeShape = "1024:16:4".parse().unwrap();
        assert_eq!((s.ranks, s.agents, s.fanout), (1024, 16, 4));
        assert!(
            "1024:16"
                .parse::<TreeShape>()
                .unwrap_err()
                .contains("RANKS:AGENTS:FANOUT")
        );
        assert!(
            "4:8:2"
                .parse::<TreeShape>()
                .unwrap_err()
                .contains("every agent needs a rank")
        );
        assert!("64:4:1".parse::<TreeShape>().unwrap_err().contains("fanout"));
    }
}
