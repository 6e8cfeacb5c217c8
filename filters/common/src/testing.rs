//! An in-process tree for tests: drives a [`Filter`] through the whole protocol over a random tree shape and a
//! random (seeded) arrival order, with rounds pipelined, and returns what the root's finalize produced.
//!
//! It plays the host's part: leaves get their ranks' inputs in phase 0, every node's packets emitted up are
//! grouped by (round, phase) at its parent until one came from each child, packets emitted down go to every
//! child, and the root hands every packet it emits up to finalize. Which pending delivery happens next is
//! drawn at random, so round r + 1 routinely starts before round r finishes and children report in any order.

use std::collections::BTreeMap;

use canopy_filter_sdk::{Emit, Filter, Level};
use canopy_wire::v1::{CounterSample, EventSample, ProfileBatch, RankProfile};
use prost::Message;

/// A small deterministic generator (SplitMix64): the tests need reproducible shapes and orders, not quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

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

/// Shapes of random test data: which events and counters exist and how values are drawn.
#[derive(Debug, Clone)]
pub struct DataSpec {
    /// Event names; ranks report a random subset of them.
    pub events: Vec<String>,
    /// Counter names; ranks report a random subset of them.
    pub counters: Vec<String>,
}

impl Default for DataSpec {
    fn default() -> Self {
        DataSpec {
            events: [
                "MPI_Allreduce()",
                "MPI_Send()",
                "main",
                "Patch 1 -> 0",
                "Patch 1 -> 1",
                "solve",
            ]
            .map(String::from)
            .to_vec(),
            counters: ["bytes sent", "cache misses"].map(String::from).to_vec(),
        }
    }
}

impl DataSpec {
    /// The (id, name) pairs of every event and counter, as the host gives them to `names`.
    pub fn names(&self) -> Vec<(u64, String)> {
        self.events
            .iter()
            .chain(&self.counters)
            .map(|n| (canopy_wire::event_id(n), n.clone()))
            .collect()
    }
}

/// A value of the kinds that break naive code: zeros, one value shared by many ranks, huge (1e15), tiny
/// (1e-12) and ordinary magnitudes.
pub fn edge_value(rng: &mut Rng) -> f64 {
    match rng.below(9) {
        0 => 0.0,
        1 => 1e15,
        2 => 1e-12,
        3 => 42.0,
        4 => rng.unit() * 1e15,
        5 => rng.unit() * 1e-12,
        6 => rng.between(0, 10) as f64,
        _ => rng.unit() * 1000.0,
    }
}

/// Random rank profiles for `slots` ranks: ranks of two applications, each reporting a random subset of the
/// events and counters (possibly none) with [`edge_value`]s. Slot i is rank i of its application.
pub fn random_profiles(rng: &mut Rng, spec: &DataSpec, slots: usize, round: u64) -> Vec<RankProfile> {
    (0..slots)
        .map(|slot| {
            let app = if rng.chance(0.2) { "beta" } else { "alpha" };
            let mut events = Vec::new();
            for name in &spec.events {
                if rng.chance(0.6) {
                    let calls = match rng.below(4) {
                        0 => 0,
                        1 => 1_000_000_000_000_000,
                        _ => rng.between(0, 100) as u64,
                    };
                    events.push(EventSample {
                        event_id: canopy_wire::event_id(name),
                        calls,
                        subrs: rng.between(0, 3) as u64,
                        incl_us: edge_value(rng),
                        excl_us: edge_value(rng),
                        // Not `calls + small` for huge calls: values like 1e15 + k for k up to 1000 have a
                        // spread 1e-12 of their size, beyond what a double can summarize to 1e-9 (see summary).
                        calls_total: if calls < 1_000_000 {
                            calls + rng.between(0, 1000) as u64
                        } else {
                            calls * rng.between(1, 3) as u64
                        },
                        subrs_total: 0,
                        incl_total_us: edge_value(rng),
                        excl_total_us: edge_value(rng),
                    });
                }
            }
            let mut counters = Vec::new();
            for name in &spec.counters {
                if rng.chance(0.5) {
                    counters.push(CounterSample {
                        counter_id: canopy_wire::event_id(name),
                        value: edge_value(rng),
                        total: edge_value(rng),
                    });
                }
            }
            RankProfile {
                app: app.into(),
                rank: slot as u32,
                round,
                dump_unix_ns: 0,
                events,
                counters,
                metrics: 0,
            }
        })
        .collect()
}

/// One rank's leaf input with a single event (id 1, one call) whose inclusive and exclusive time are `time_us`.
pub fn one_event_profile(rank: u32, time_us: f64) -> Vec<u8> {
    encode_one(&RankProfile {
        app: "a".into(),
        rank,
        events: vec![EventSample {
            event_id: 1,
            calls: 1,
            incl_us: time_us,
            excl_us: time_us,
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// One rank's profile as a leaf input: a `ProfileBatch` holding it alone.
pub fn encode_one(profile: &RankProfile) -> Vec<u8> {
    ProfileBatch {
        profiles: vec![profile.clone()],
    }
    .encode_to_vec()
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

    #[test]
    fn shuffle_is_a_permutation() {
        let mut rng = Rng::new(1);
        let mut v: Vec<u32> = (0..50).collect();
        rng.shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
        assert_ne!(v, s);
    }
}

/// A ready-made random case: a tree, where each rank sits, and several rounds of profiles.
#[derive(Debug, Clone)]
pub struct Case {
    pub tree: Tree,
    pub placement: Vec<usize>,
    /// Per round, per rank slot.
    pub profiles: Vec<Vec<RankProfile>>,
    /// The same, encoded as the leaves get them.
    pub inputs: Vec<Vec<Vec<u8>>>,
    pub names: Vec<(u64, String)>,
}

impl Case {
    /// A random tree (depth 1 to 4, fanout 1 to 16, uneven, at most about 200 nodes) holding `ranks` ranks
    /// at random leaves, with `rounds` rounds of [`random_profiles`] drawn from `spec`.
    pub fn random(seed: u64, ranks: usize, rounds: usize, spec: &DataSpec) -> Case {
        let mut rng = Rng::new(seed);
        let tree = Tree::random(&mut rng, 4, 16, 200);
        let placement = tree.place(&mut rng, ranks);
        let profiles: Vec<Vec<RankProfile>> = (0..rounds)
            .map(|r| random_profiles(&mut rng, spec, ranks, r as u64))
            .collect();
        Case::new(tree, placement, profiles, spec.names())
    }

    /// A case from given parts; the inputs are the profiles, one per batch.
    pub fn new(
        tree: Tree,
        placement: Vec<usize>,
        profiles: Vec<Vec<RankProfile>>,
        names: Vec<(u64, String)>,
    ) -> Case {
        let inputs = profiles
            .iter()
            .map(|round| round.iter().map(encode_one).collect())
            .collect();
        Case {
            tree,
            placement,
            profiles,
            inputs,
            names,
        }
    }

    /// Runs `F` with `params`, arrival order drawn from `seed`, rounds numbered from 0.
    pub fn run<F: Filter>(&self, params: &str, seed: u64) -> Result<Outcome, String> {
        let run = Run {
            params,
            names: &self.names,
            placement: &self.placement,
            rounds: &self.inputs,
            first_round: 0,
            seed,
        };
        simulate::<F>(&self.tree, &run).map_err(|e| format!("{e} ({})", self.tree.describe()))
    }

    /// The summed length of a round's inputs: what raw_bytes must say.
    pub fn raw_bytes(&self, round: usize) -> u64 {
        self.inputs[round].iter().map(|i| i.len() as u64).sum()
    }
}

/// Direct computations over all ranks at once, for tests to compare a tree's result with. They are written
/// from the profile fields and the documented formulas, sharing no code with the filters' merging.
pub mod reference {
    use std::collections::BTreeMap;

    use canopy_filter_proto::v1::{Histogram, Metric, Summary};
    use canopy_wire::v1::RankProfile;

    /// (id, metric as i32).
    pub type Key = (u64, i32);

    /// One sample: the value and the (app, rank) holding it.
    pub type Sample = (f64, String, u32);

    /// The samples of every (id, metric) over `profiles`, straight from the profile fields.
    pub fn samples<'a>(
        profiles: impl IntoIterator<Item = &'a RankProfile>,
        cumulative: bool,
    ) -> BTreeMap<Key, Vec<Sample>> {
        let mut m: BTreeMap<Key, Vec<Sample>> = BTreeMap::new();
        for p in profiles {
            let mut push = |key: Key, v: f64| m.entry(key).or_default().push((v, p.app.clone(), p.rank));
            for e in &p.events {
                if cumulative {
                    push((e.event_id, Metric::Calls as i32), e.calls_total as f64);
                    push((e.event_id, Metric::Inclusive as i32), e.incl_total_us);
                    push((e.event_id, Metric::Exclusive as i32), e.excl_total_us);
                } else {
                    push((e.event_id, Metric::Calls as i32), e.calls as f64);
                    push((e.event_id, Metric::Inclusive as i32), e.incl_us);
                    push((e.event_id, Metric::Exclusive as i32), e.excl_us);
                }
            }
            for c in &p.counters {
                push(
                    (c.counter_id, Metric::Counter as i32),
                    if cumulative { c.total } else { c.value },
                );
            }
        }
        m
    }

    /// Neumaier's compensated sum: accurate, and a different computation from the filters' pairwise merge.
    pub fn sum(values: impl Iterator<Item = f64>) -> f64 {
        let (mut s, mut c) = (0.0f64, 0.0f64);
        for v in values {
            let t = s + v;
            c += if s.abs() >= v.abs() {
                (s - t) + v
            } else {
                (v - t) + s
            };
            s = t;
        }
        s + c
    }

    /// The summary of all `values` at once: two-pass mean and population std; min and max with the smallest
    /// (app, rank) on a tie.
    pub struct Direct {
        pub count: u64,
        pub mean: f64,
        pub std: f64,
        pub min: Sample,
        pub max: Sample,
    }

    pub fn direct(values: &[Sample]) -> Direct {
        let n = values.len() as f64;
        let mean = sum(values.iter().map(|v| v.0)) / n;
        let std = (sum(values.iter().map(|v| (v.0 - mean) * (v.0 - mean))) / n).sqrt();
        let by_rank = |a: &Sample, b: &Sample| (&a.1, a.2).cmp(&(&b.1, b.2));
        let min = values
            .iter()
            .min_by(|a, b| a.0.total_cmp(&b.0).then(by_rank(a, b)))
            .cloned();
        let max = values
            .iter()
            .min_by(|a, b| b.0.total_cmp(&a.0).then(by_rank(a, b)))
            .cloned();
        let none = (f64::NAN, String::new(), 0);
        Direct {
            count: values.len() as u64,
            mean,
            std,
            min: min.unwrap_or_else(|| none.clone()),
            max: max.unwrap_or(none),
        }
    }

    /// Equal to 1e-9 relative, or 1e-12 absolute near zero.
    pub fn close(got: f64, want: f64) -> bool {
        let d = (got - want).abs();
        d <= 1e-9 * got.abs().max(want.abs()) || d <= 1e-12
    }

    /// Checks a filter's summary against [`direct`]: count, min, max and their ranks exactly, mean and std
    /// with [`close`].
    pub fn check_summary(what: &str, s: &Summary, values: &[Sample]) -> Result<(), String> {
        let d = direct(values);
        let rank = |r: &Option<canopy_filter_proto::v1::RankRef>| {
            r.as_ref().map(|r| (r.app.clone(), r.rank)).unwrap_or_default()
        };
        let checks = [
            (s.count == d.count, format!("count {} vs {}", s.count, d.count)),
            (close(s.mean, d.mean), format!("mean {} vs {}", s.mean, d.mean)),
            (close(s.std, d.std), format!("std {} vs {}", s.std, d.std)),
            (
                s.count > 0 && close((s.m2 / s.count as f64).sqrt(), d.std),
                format!("m2 {} vs std {}", s.m2, d.std),
            ),
            (
                (s.min.to_bits(), rank(&s.min_rank)) == (d.min.0.to_bits(), (d.min.1.clone(), d.min.2)),
                format!("min {} at {:?} vs {:?}", s.min, rank(&s.min_rank), d.min),
            ),
            (
                (s.max.to_bits(), rank(&s.max_rank)) == (d.max.0.to_bits(), (d.max.1.clone(), d.max.2)),
                format!("max {} at {:?} vs {:?}", s.max, rank(&s.max_rank), d.max),
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(format!("{what}: {why}")),
            None => Ok(()),
        }
    }

    /// Counts by brute force: each value's bin by the documented formula, lo and hi the global min and max.
    pub fn histogram(values: &[Sample], bins: usize) -> (f64, f64, Vec<u64>) {
        let lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
        let hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
        let mut counts = vec![0u64; bins];
        for v in values {
            let i = if lo == hi {
                0
            } else {
                ((v.0 - lo) / (hi - lo) * bins as f64).floor() as usize
            };
            counts[i.min(bins - 1)] += 1;
        }
        (lo, hi, counts)
    }

    /// Checks a filter's histogram against [`histogram`]: range and counts exactly.
    pub fn check_histogram(what: &str, h: &Histogram, values: &[Sample], bins: usize) -> Result<(), String> {
        let (lo, hi, counts) = histogram(values, bins);
        if (h.lo, h.hi, &h.counts) != (lo, hi, &counts) {
            return Err(format!(
                "{what}: histogram [{}, {}] {:?} vs [{lo}, {hi}] {counts:?}",
                h.lo, h.hi, h.counts
            ));
        }
        Ok(())
    }
}
