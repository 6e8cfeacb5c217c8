//! The workflow scenario (seed 004's LAMMPS workflow): a parallel simulation feeds two small in-situ analyses,
//! `bonds` and `csym`, the latter the bottleneck. Each round is one step of the workflow key [`KEY`]: the
//! simulation's ranks mark its start when they hand the step's output over, and `csym`'s ranks mark its stop when
//! they have sent their result. Three events drive the step's end-to-end latency and are known:
//! `bonds_read_input`, `csym_read_input` and `csym_compute_send` ([`DRIVERS`]); their time changes from step to
//! step, the same at every rank of their component, and the latency is their sum plus a transfer that no event
//! shows (the hand-over itself: [`TRANSFER_US`] give or take 20%, also drawn anew every step), exactly
//! ([`latency_ns`]). Every other event varies from rank to rank and round to round with nothing to do with it.
//! Rank 0 of the simulation marks each start and rank 0 of `csym` each stop, at the instant the round's window
//! begins on the tree's clock (plus the latency for a stop), so agents that heard the same Start agree.
//!
//! A simulator's component is its application's name: `bonds` and `csym` are the analyses, any other name the
//! simulation (`canopy up --scenario workflow` names its agents so).

use super::{Keyed, Kind, Names, Slot, filler_base_us};

/// The workflow key every step is marked under.
pub const KEY: &str = "workflow";
/// The mean of the part of a step's latency that no event of the ranks accounts for (the hand-over itself), in
/// µs; each step's is drawn uniformly within 20% of it ([`transfer_us`]).
pub const TRANSFER_US: f64 = 2000.0;
/// The events that drive the end-to-end latency, with their application and base time in µs: each step's time is
/// its base times a factor drawn uniformly in [0.5, 1.5), the same at every rank of the application.
/// Their bases are alike, so each explains about a third of the latency's variance.
pub const DRIVERS: [(&str, &str, f64); 3] = [
    ("bonds", "bonds_read_input", 4000.0),
    ("csym", "csym_read_input", 4000.0),
    ("csym", "csym_compute_send", 5000.0),
];

/// The parts a simulator may play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The parallel producer: it marks each step's start.
    Simulation,
    /// The analysis that reads the simulation's output first.
    Bonds,
    /// The bottleneck analysis: it marks each step's stop.
    Csym,
}

impl Component {
    /// The component an application of the scenario plays, by its name.
    pub fn of(app: &str) -> Component {
        match app {
            "bonds" => Component::Bonds,
            "csym" => Component::Csym,
            _ => Component::Simulation,
        }
    }
}

/// Driver `i`'s exclusive time in step `step`, µs.
pub fn driver_us(seed: u64, step: u64, i: usize) -> f64 {
    let (_, _, base) = DRIVERS[i];
    base * Keyed::of(&[seed, TAG, step, i as u64]).range(0.5, 1.5)
}

/// The hand-over's time in step `step`, µs: what no metric can explain.
pub fn transfer_us(seed: u64, step: u64) -> f64 {
    TRANSFER_US * Keyed::of(&[seed, TAG, step, DRIVERS.len() as u64]).range(0.8, 1.2)
}

/// The end-to-end latency of step `step`, ns: the transfer and every driver's time.
pub fn latency_ns(seed: u64, step: u64) -> u64 {
    let us: f64 = transfer_us(seed, step) + (0..DRIVERS.len()).map(|i| driver_us(seed, step, i)).sum::<f64>();
    (us * 1000.0).round() as u64
}

/// Mixed into the drivers' and the transfer's keys, apart from every other draw of the simulator.
const TAG: u64 = 0x776f_726b_666c_6f77;

/// The simulation's regions: name, parent, kind, base time (µs), calls per round.
const SIMULATION: [(&str, Option<usize>, Kind, f64, u64); 8] = [
    ("Verlet::run", None, Kind::Root, 300.0, 1),
    ("Pair::compute", Some(0), Kind::Compute, 5000.0, 1),
    ("Neighbor::build", Some(0), Kind::Compute, 900.0, 1),
    ("Comm::exchange", Some(0), Kind::Comm, 400.0, 2),
    ("MPI_Sendrecv", Some(3), Kind::Comm, 300.0, 12),
    ("MPI_Allreduce", Some(0), Kind::Wait { spike: false }, 120.0, 2),
    ("Output::write", Some(0), Kind::Comm, 700.0, 1),
    ("Modify::post_force", Some(0), Kind::Compute, 250.0, 1),
];

/// The analyses' own regions besides their drivers: each analysis's step runs these and its drivers one after the
/// other, none inside another.
const BONDS: [(&str, Kind, f64, u64); 3] = [
    ("bonds_compute", Kind::Compute, 2500.0, 1),
    ("bonds_write", Kind::Comm, 600.0, 1),
    ("MPI_Barrier", Kind::Wait { spike: false }, 150.0, 1),
];
const CSYM: [(&str, Kind, f64, u64); 2] = [
    ("csym_setup", Kind::Compute, 800.0, 1),
    ("MPI_Bcast", Kind::Comm, 200.0, 1),
];

/// A component's events; the simulation fills up to `events` with generated compute regions.
pub(super) fn plan(component: Component, events: u32, names: &mut Names) -> Vec<Slot> {
    match component {
        Component::Simulation => (0..(events as usize).max(1))
            .map(|i| match SIMULATION.get(i) {
                Some(&(name, parent, kind, base, calls)) => names.slot(name, kind, base, calls, parent),
                None => {
                    let name = format!("compute_{}", i - SIMULATION.len());
                    let base = filler_base_us(canopy_proto::event_id(&name));
                    names.slot(&name, Kind::Compute, base, 1, Some(0))
                }
            })
            .collect(),
        Component::Bonds => analysis("bonds", &BONDS, names),
        Component::Csym => analysis("csym", &CSYM, names),
    }
}

fn analysis(app: &str, own: &[(&str, Kind, f64, u64)], names: &mut Names) -> Vec<Slot> {
    let mut plan = Vec::new();
    for (i, &(driver_app, name, base)) in DRIVERS.iter().enumerate() {
        if driver_app == app {
            plan.push(names.slot(name, Kind::Driver(i), base, 1, None));
        }
    }
    for &(name, kind, base, calls) in own {
        plan.push(names.slot(name, kind, base, calls, None));
    }
    plan
}
