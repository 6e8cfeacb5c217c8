//! An in-process tree for tests: drives a [`Filter`] through the whole protocol over a random tree shape and a
//! random (seeded) arrival order, with rounds pipelined, and returns what the root's finalize produced.
//!
//! It plays the host's part: leaves get their ranks' inputs in phase 0, every node's packets emitted up are
//! grouped by (round, phase) at its parent until one came from each child, packets emitted down go to every
//! child, and the root hands every packet it emits up to finalize. Which pending delivery happens next is
//! drawn at random, so round r + 1 routinely starts before round r finishes and children report in any order.

use std::collections::BTreeMap;

use canopy_filter_sdk::{Emit, Filter, Level};

use crate::Rng;

/// A tree shape: node 0 is the root, nodes without children are leaves.
#[derive(Debug, Clone)]
pub struct Tree {
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
    leaves: Vec<usize>,
}

impl Tree {
    /// A random shape: depth 1 to `max_depth` (levels below the root), each interior node with its own number
    /// of children (1 to `max_fanout`), some branches ending early. Past about `max_nodes` nodes, interior
    /// nodes still queued get one leaf each, so the tree stays within twice the budget.
    pub fn random(rng: &mut Rng, max_depth: usize, max_fanout: usize, max_nodes: usize) -> Tree {
        let depth = rng.between(1, max_depth.max(1));
        let mut t = Tree {
            parent: vec![None],
            children: vec![Vec::new()],
            leaves: Vec::new(),
        };
        // Breadth first, so the node budget cuts the deep end, not one whole subtree.
        // (node, level, on the spine): the spine is the branch of first children that reaches the drawn depth.
        let mut frontier = vec![(0usize, 0usize, true)];
        let mut next = Vec::new();
        while !frontier.is_empty() {
            for (node, level, spine) in frontier.drain(..) {
                let fanout = rng.between(1, max_fanout.max(1));
                for c in 0..fanout {
                    // Every interior node gets at least one child, even past the budget.
                    if c > 0 && t.parent.len() >= max_nodes {
                        break;
                    }
                    let child = t.add(node);
                    let on_spine = spine && c == 0;
                    let interior =
                        level + 1 < depth && (on_spine || (t.parent.len() < max_nodes && !rng.chance(0.2)));
                    if interior {
                        next.push((child, level + 1, on_spine));
                    }
                }
            }
            std::mem::swap(&mut frontier, &mut next);
        }
        t.finish();
        t
    }

    /// A shape given as the list of each node's parent (node 0, the root, has none: pass `usize::MAX`).
    pub fn from_parents(parents: &[usize]) -> Tree {
        let mut t = Tree {
            parent: vec![None],
            children: vec![Vec::new()],
            leaves: Vec::new(),
        };
        for &p in &parents[1..] {
            t.add(p);
        }
        t.finish();
        t
    }

    /// The root with `n` leaves under it.
    pub fn star(n: usize) -> Tree {
        let mut parents = vec![usize::MAX];
        parents.extend(std::iter::repeat_n(0, n.max(1)));
        Tree::from_parents(&parents)
    }

    fn add(&mut self, parent: usize) -> usize {
        let id = self.parent.len();
        self.parent.push(Some(parent));
        self.children.push(Vec::new());
        self.children[parent].push(id);
        id
    }

    fn finish(&mut self) {
        self.leaves = (0..self.parent.len())
            .filter(|&n| n != 0 && self.children[n].is_empty())
            .collect();
    }

    /// How many leaves (agents) the tree has.
    pub fn leaf_count(&self) -> usize {
        self.leaves.len()
    }

    pub fn node_count(&self) -> usize {
        self.parent.len()
    }

    /// The number of levels below the root on the longest branch.
    pub fn depth(&self) -> usize {
        self.leaves
            .iter()
            .map(|&l| {
                let (mut d, mut n) = (0, l);
                while let Some(p) = self.parent[n] {
                    d += 1;
                    n = p;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }

    fn level(&self, node: usize) -> Level {
        if node == 0 {
            Level::Root
        } else if self.children[node].is_empty() {
            Level::Leaf
        } else {
            Level::Relay
        }
    }

    /// The shape in a line, for failure messages: each node's children counts by level.
    pub fn describe(&self) -> String {
        format!(
            "{} nodes, {} leaves, depth {}, fanouts {:?}",
            self.node_count(),
            self.leaf_count(),
            self.depth(),
            self.children
                .iter()
                .map(Vec::len)
                .filter(|&n| n > 0)
                .collect::<Vec<_>>()
        )
    }

    /// A random leaf (by leaf number) for each of `slots` ranks; some leaves may get none.
    pub fn place(&self, rng: &mut Rng, slots: usize) -> Vec<usize> {
        (0..slots).map(|_| rng.below(self.leaf_count())).collect()
    }
}

/// What a call emitted, as the host would collect it.
#[derive(Debug, Clone, Default)]
pub struct Collect {
    pub up: Vec<(u32, Vec<u8>)>,
    pub down: Vec<(u32, Vec<u8>)>,
    pub rejects: Vec<(usize, String)>,
}

impl Emit for Collect {
    fn up(&mut self, phase: u32, payload: &[u8]) {
        self.up.push((phase, payload.to_vec()));
    }

    fn down(&mut self, phase: u32, payload: &[u8]) {
        self.down.push((phase, payload.to_vec()));
    }

    fn reject(&mut self, index: usize, reason: &str) {
        self.rejects.push((index, reason.to_string()));
    }
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct Run<'a> {
    /// The filter's JSON parameters.
    pub params: &'a str,
    /// Given to every node's `names` before the first round.
    pub names: &'a [(u64, String)],
    /// For each rank slot, the leaf (by leaf number) that holds it.
    pub placement: &'a [usize],
    /// Per round (numbered from `first_round`), per rank slot: the leaf's input (an encoded `ProfileBatch`).
    pub rounds: &'a [Vec<Vec<u8>>],
    pub first_round: u64,
    /// Draws the arrival order.
    pub seed: u64,
}

/// An input some node rejected.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub node: usize,
    pub round: u64,
    pub phase: u32,
    /// At a leaf, the rank slot of the input; elsewhere `None`.
    pub slot: Option<usize>,
    pub reason: String,
}

/// What a run produced.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The root's finalized results by (round, phase).
    pub results: BTreeMap<(u64, u32), Vec<u8>>,
    pub rejects: Vec<Rejected>,
    /// The most rounds that were started at some leaf but not yet finalized, at any one time: above 1 means
    /// the run pipelined.
    pub max_open_rounds: usize,
}

/// Packets waiting at one node until every child has sent its own for the (round, phase).
type Groups = BTreeMap<(u64, u32), Vec<Vec<u8>>>;

enum Msg {
    Start {
        leaf: usize,
        round: u64,
    },
    Up {
        to: usize,
        round: u64,
        phase: u32,
        bytes: Vec<u8>,
    },
    Down {
        to: usize,
        round: u64,
        phase: u32,
        bytes: Vec<u8>,
    },
}

struct Sim<'t, F> {
    tree: &'t Tree,
    filters: Vec<F>,
    pool: Vec<Msg>,
    /// Per node, the packets its children sent up so far, by (round, phase).
    groups: Vec<Groups>,
    out: Outcome,
    started: BTreeMap<u64, ()>,
}

/// Runs `F` over `tree` as described by `run`; an error names the call that failed or the node left waiting.
pub fn simulate<F: Filter>(tree: &Tree, run: &Run<'_>) -> Result<Outcome, String> {
    if tree.leaf_count() == 0 {
        return Err("the tree has no leaves".into());
    }
    if let Some(&bad) = run.placement.iter().find(|&&l| l >= tree.leaf_count()) {
        return Err(format!("placement names leaf {bad} of {}", tree.leaf_count()));
    }
    let names: Vec<(u64, &str)> = run.names.iter().map(|(id, n)| (*id, n.as_str())).collect();
    let mut filters = Vec::with_capacity(tree.node_count());
    for node in 0..tree.node_count() {
        let mut f =
            F::create(run.params, tree.level(node)).map_err(|e| format!("create at node {node}: {e}"))?;
        f.names(&names);
        filters.push(f);
    }
    let mut rng = Rng::new(run.seed);
    let mut sim = Sim {
        tree,
        filters,
        pool: Vec::new(),
        groups: vec![BTreeMap::new(); tree.node_count()],
        out: Outcome::default(),
        started: BTreeMap::new(),
    };
    if !run.rounds.is_empty() {
        for leaf in 0..tree.leaf_count() {
            sim.pool.push(Msg::Start {
                leaf,
                round: run.first_round,
            });
        }
    }
    while !sim.pool.is_empty() {
        let msg = sim.pool.swap_remove(rng.below(sim.pool.len()));
        match msg {
            Msg::Start { leaf, round } => {
                let idx = (round - run.first_round) as usize;
                let node = tree.leaves[leaf];
                let mut slots: Vec<usize> = (0..run.placement.len())
                    .filter(|&s| run.placement[s] == leaf)
                    .collect();
                rng.shuffle(&mut slots);
                let inputs: Vec<&[u8]> = slots.iter().map(|&s| run.rounds[idx][s].as_slice()).collect();
                sim.started.insert(round, ());
                sim.out.max_open_rounds = sim.out.max_open_rounds.max(sim.open_rounds());
                let mut c = Collect::default();
                sim.filters[node]
                    .upstream(round, 0, &inputs, &mut c)
                    .map_err(|e| format!("leaf {node} upstream round {round} phase 0: {e}"))?;
                sim.handle(node, round, 0, c, Some(&slots))?;
                if idx + 1 < run.rounds.len() {
                    sim.pool.push(Msg::Start {
                        leaf,
                        round: round + 1,
                    });
                }
            }
            Msg::Up {
                to,
                round,
                phase,
                bytes,
            } => {
                let group = sim.groups[to].entry((round, phase)).or_default();
                group.push(bytes);
                if group.len() == tree.children[to].len() {
                    let mut packets = sim.groups[to].remove(&(round, phase)).unwrap_or_default();
                    rng.shuffle(&mut packets);
                    let inputs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
                    let mut c = Collect::default();
                    sim.filters[to]
                        .upstream(round, phase, &inputs, &mut c)
                        .map_err(|e| format!("node {to} upstream round {round} phase {phase}: {e}"))?;
                    sim.handle(to, round, phase, c, None)?;
                }
            }
            Msg::Down {
                to,
                round,
                phase,
                bytes,
            } => {
                let mut c = Collect::default();
                sim.filters[to]
                    .downstream(round, phase, &bytes, &mut c)
                    .map_err(|e| format!("node {to} downstream round {round} phase {phase}: {e}"))?;
                sim.handle(to, round, phase, c, None)?;
            }
        }
    }
    for (node, groups) in sim.groups.iter().enumerate() {
        if let Some(((round, phase), got)) = groups.iter().next() {
            return Err(format!(
                "node {node} was left waiting: {} of {} packets of round {round} phase {phase}",
                got.len(),
                tree.children[node].len()
            ));
        }
    }
    Ok(sim.out)
}

impl<F: Filter> Sim<'_, F> {
    fn open_rounds(&self) -> usize {
        self.started
            .keys()
            .filter(|r| !self.out.results.keys().any(|(rr, _)| rr == *r))
            .count()
    }

    fn handle(
        &mut self,
        node: usize,
        round: u64,
        phase: u32,
        c: Collect,
        slots: Option<&[usize]>,
    ) -> Result<(), String> {
        for (index, reason) in c.rejects {
            let slot = slots.map(|s| s.get(index).copied().unwrap_or(usize::MAX));
            self.out.rejects.push(Rejected {
                node,
                round,
                phase,
                slot,
                reason,
            });
        }
        for (p, bytes) in c.up {
            match self.tree.parent[node] {
                Some(parent) => self.pool.push(Msg::Up {
                    to: parent,
                    round,
                    phase: p,
                    bytes,
                }),
                None => {
                    let result = self.filters[node]
                        .finalize(round, p, &bytes)
                        .map_err(|e| format!("finalize round {round} phase {p}: {e}"))?;
                    if self.out.results.insert((round, p), result).is_some() {
                        return Err(format!("the root emitted up twice for round {round} phase {p}"));
                    }
                }
            }
        }
        for (p, bytes) in c.down {
            if self.tree.children[node].is_empty() {
                return Err(format!("leaf {node} emitted down in round {round} phase {p}"));
            }
            for &child in &self.tree.children[node] {
                self.pool.push(Msg::Down {
                    to: child,
                    round,
                    phase: p,
                    bytes: bytes.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_trees_respect_the_bounds() {
        let mut rng = Rng::new(7);
        let mut depths = [0usize; 5];
        for _ in 0..200 {
            let t = Tree::random(&mut rng, 4, 16, 300);
            let d = t.depth();
            assert!((1..=4).contains(&d), "{}", t.describe());
            depths[d] += 1;
            assert!(t.node_count() <= 2 * 300, "{}", t.describe());
            assert!(t.children.iter().all(|c| c.len() <= 16));
            assert!(t.leaf_count() >= 1);
        }
        assert!(depths[1..].iter().all(|&n| n > 0), "{depths:?}");
    }
}
