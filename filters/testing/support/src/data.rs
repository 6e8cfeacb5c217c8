//! Random test data: rank profiles with values of the kinds that break naive code, and ready-made cases.

use canopy_filter_sdk::Filter;
use canopy_wire::v1::{CounterSample, EventSample, ProfileBatch, RankProfile};
use prost::Message;

use crate::{Outcome, Rng, Run, Tree, simulate};

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
            // Half the ranks measure per-event metrics: page faults (inclusive and exclusive) and the heap at
            // entry, or context switches alone (exclusive).
            let event_metrics: Vec<u32> = match rng.below(4) {
                0 => vec![18, 19, 40],
                1 => vec![21],
                _ => Vec::new(),
            };
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
                        metrics: event_metrics.iter().map(|_| edge_value(rng)).collect(),
                        metrics_total: event_metrics.iter().map(|_| edge_value(rng)).collect(),
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
                event_metrics,
                ..RankProfile::default()
            }
        })
        .collect()
}

/// One rank's leaf input with a single event (id 1, one call) whose inclusive and exclusive time are `time_us`.
pub fn one_event_profile(rank: u32, time_us: f64) -> Vec<u8> {
    one_event_profile_in("a", rank, time_us)
}

/// [`one_event_profile`] of a rank of application `app`.
pub fn one_event_profile_in(app: &str, rank: u32, time_us: f64) -> Vec<u8> {
    encode_one(&RankProfile {
        app: app.into(),
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

    /// [`Case::random`] with its ranks in `apps` applications (1 to 3: `viz`, `analysis`, `simulation`), each
    /// rank in the same one every round.
    pub fn with_apps(seed: u64, ranks: usize, rounds: usize, apps: usize) -> Case {
        let c = Case::random(seed, ranks, rounds, &DataSpec::default());
        let names = ["viz", "analysis", "simulation"];
        let mut rng = Rng::new(seed ^ 0xa995);
        let of_slot: Vec<&str> = (0..ranks).map(|_| names[rng.below(apps.clamp(1, 3))]).collect();
        let mut profiles = c.profiles.clone();
        for round in &mut profiles {
            for (slot, p) in round.iter_mut().enumerate() {
                p.app = of_slot[slot].into();
            }
        }
        Case::new(c.tree, c.placement, profiles, c.names)
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
