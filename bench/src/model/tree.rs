//! The model itself: a tree's shape and census, a node's costs as lines through the measured runs, and what they
//! predict for any tree (CPU per level, throughput, latency) on this machine or on nodes of their own.

use canopy_topology::Topology;

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

/// Whether `a` is the better tree than `b`: a rate at least 10% higher, or within 10% and a lower latency.
pub(super) fn better(a: &Prediction, b: &Prediction) -> bool {
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
