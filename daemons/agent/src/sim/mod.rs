//! Simulated ranks for the leaf agent: FLASH-, Uintah- and NAMD-like profiles, deterministic from a seed.

pub mod clock;
mod keyed;
mod plans;
pub mod plant;
mod timer;
mod variation;
pub mod workflow;

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use bytes::{Bytes, BytesMut};

use canopy_proto::event_id;
use canopy_proto::v1::{CounterSample, EventSample, RankProfile};
use canopy_wire::options::metric;
use canopy_wire::utilization::{Bins, DEFAULT_THRESHOLD};
use canopy_wire::v1::StepMark;
use canopy_wire::v1::Utilization;
use canopy_wire::write::{ProfileHeader, ProfileWriter};
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

use keyed::Keyed;
use plans::{Names, filler_base_us, flash_plan, namd_plan, uintah_envelope_us, uintah_plan};
use variation::{SPEED_MAX, SPEED_MIN, Statics, workload};

/// The application a simulator imitates.
///
/// - `Flash` (ToM paper, Fig. 5/6): a `main_loop` over hydro, AMR and MPI regions. Every rank reports every
///   event every round; `MPI_Allreduce` is unevenly spread over the ranks and many times slower on every rank
///   at round 100, and only there.
/// - `Uintah` (ToM paper, Fig. 7): `Scheduler::execute` over MPI calls and patch events. Rank 0 regrids
///   ("Regrid" over "Patch 1 -> 0".."Patch 1 -> 15"); every rank r > 0 works on "Patch 0 -> r"; ranks 1..=8
///   also work on the large level-1 patches "Patch 1 -> 0".."Patch 1 -> 7". Classifying on the `Patch 1 ->`
///   names thus gives 3 classes, on all names one class per rank, and on the `MPI_` names 13 classes (the
///   optional MPI calls a rank makes are picked by rank % 13).
/// - `Namd` (Charm++ paper): flat Charm++ entry methods plus "Idle". A few ranks are overloaded, and Idle
///   fills each rank up to the busiest rank's time, so busy + idle is about the same on every rank.
/// - `Workflow` (seed 004): a simulation and two in-situ analyses, one application each, with each round a step
///   of a workflow whose end-to-end latency three known events drive ([`workflow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Flash,
    Uintah,
    Namd,
    Workflow,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::Flash,
        Scenario::Uintah,
        Scenario::Namd,
        Scenario::Workflow,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Flash => "flash",
            Scenario::Uintah => "uintah",
            Scenario::Namd => "namd",
            Scenario::Workflow => "workflow",
        }
    }

    /// Mixed into every random key so two scenarios with the same seed do not share their noise.
    fn tag(self) -> u64 {
        match self {
            Scenario::Flash => 1,
            Scenario::Uintah => 2,
            Scenario::Namd => 3,
            Scenario::Workflow => 4,
        }
    }
}

/// A scenario name that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseScenarioError {
    given: String,
}

impl fmt::Display for ParseScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        write!(
            f,
            "unknown scenario `{}`: expected one of {}",
            self.given,
            names.join(", ")
        )
    }
}

impl std::error::Error for ParseScenarioError {}

impl FromStr for Scenario {
    type Err = ParseScenarioError;

    fn from_str(s: &str) -> Result<Scenario, ParseScenarioError> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseScenarioError { given: s.to_owned() })
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub scenario: Scenario,
    /// How many ranks this simulator serves: global ranks `rank_offset..rank_offset + ranks`.
    pub ranks: u32,
    /// Flash: exactly this many events per rank (the first of the named list, then "compute_k").
    /// Namd: this many entry methods (likewise), plus "Idle". Uintah: this many framework tasks that every
    /// rank runs (named after Uintah's ICE/MPM tasks, then "Task k"), besides the MPI and patch events that
    /// define its classes.
    /// Workflow: the simulation's events (at least its 8 named ones are listed first); the analyses have their
    /// own fixed sets.
    pub events: u32,
    pub rank_offset: u32,
    /// The number of ranks in the whole application (across all agents); some scenarios depend on it
    /// (e.g. which ranks are "the rest"). If 0, or smaller than `rank_offset + ranks`, that sum is used.
    pub total_ranks: u32,
    pub seed: u64,
    pub app: String,
    /// Ranks made slower or faster by a factor for the whole run ([`plant`]).
    pub plants: Vec<plant::Plant>,
}

/// Produces the profiles of a set of simulated ranks, round after round.
#[derive(Debug)]
pub struct Simulator {
    cfg: SimConfig,
    names: Vec<(u64, String)>,
    /// Event layouts; flash and namd ranks share one, each uintah rank has its own.
    plans: Vec<Vec<Slot>>,
    ranks: Vec<RankState>,
    counter_ids: Vec<u64>,
    /// Namd: busy time of the busiest possible rank at workload 1, the level Idle fills up to.
    envelope_us: f64,
    /// Rounds `0..next_round` are in the ranks' totals.
    next_round: u64,
    scratch: Scratch,
    writer: ProfileWriter,
    /// The length of the last rank's batch: the room a chunk must have left for the next.
    last_batch: usize,
    /// The ranks' batches of a round, one after another: each rank's is a slice of a shared allocation, so a
    /// round costs an allocation per [`CHUNK_BYTES`] rather than one per rank.
    chunk: BytesMut,
    /// Time rounds: each rank's utilization profile is laid out here, then compressed.
    bins: Bins,
    utilization: Utilization,
}

/// The size of the allocations ranks' batches share.
const CHUNK_BYTES: usize = 64 * 1024;

impl Simulator {
    pub fn new(cfg: SimConfig) -> Simulator {
        let end = cfg.rank_offset.saturating_add(cfg.ranks);
        let total = cfg.total_ranks.max(end);
        let mut names = Names::default();
        let mut plans = Vec::new();
        let mut ranks = Vec::new();
        let mut envelope_us = 0.0;
        match cfg.scenario {
            Scenario::Flash => plans.push(flash_plan(cfg.events, &mut names)),
            Scenario::Namd => {
                let plan = namd_plan(cfg.events, &mut names);
                // Every agent must see the same busiest rank, so scan the whole application, not our share.
                let max_load = (0..total)
                    .map(|r| Statics::of(&cfg, r, total).load)
                    .fold(1.0, f64::max);
                envelope_us = plan
                    .iter()
                    .map(|s| match s.kind {
                        Kind::Entry { load } => {
                            s.base_us * (1.0 + (max_load - 1.0) * load) * (1.0 + NAMD_JITTER)
                        }
                        _ => 0.0,
                    })
                    .sum();
                plans.push(plan);
            }
            Scenario::Workflow => {
                let component = workflow::Component::of(&cfg.app);
                plans.push(workflow::plan(component, cfg.events, &mut names));
                // The step key is a name of the ranks that mark steps (rank 0 of the simulation and of csym).
                if cfg.rank_offset == 0 && cfg.ranks > 0 && component != workflow::Component::Bonds {
                    names.add(workflow::KEY);
                }
            }
            Scenario::Uintah => {}
        }
        for rank in cfg.rank_offset..end {
            let statics = Statics::of(&cfg, rank, total);
            let (plan, wait_us) = match cfg.scenario {
                Scenario::Flash => {
                    // Ranks that finish their compute early wait longest in the Allreduce.
                    (
                        0,
                        FLASH_WAIT_SPREAD_US * (SPEED_MAX - statics.speed) / (SPEED_MAX - SPEED_MIN),
                    )
                }
                Scenario::Namd | Scenario::Workflow => (0, 0.0),
                Scenario::Uintah => {
                    let plan = uintah_plan(rank, total, cfg.events, &mut names);
                    let busy: f64 = plan
                        .iter()
                        .filter(|s| matches!(s.kind, Kind::Compute))
                        .map(|s| s.base_us)
                        .sum();
                    plans.push(plan);
                    (
                        plans.len() - 1,
                        (uintah_envelope_us(cfg.events) - busy * statics.speed).max(0.0),
                    )
                }
            };
            let slots = plans[plan].len();
            ranks.push(RankState {
                rank,
                plan,
                statics,
                wait_us,
                totals: vec![Sample::default(); slots],
                counter_totals: vec![0.0; COUNTERS.len()],
            });
        }
        let counter_ids = COUNTERS.iter().map(|c| names.add(c)).collect();
        Simulator {
            cfg,
            names: names.list,
            plans,
            ranks,
            counter_ids,
            envelope_us,
            next_round: 0,
            scratch: Scratch::default(),
            writer: ProfileWriter::default(),
            last_batch: 0,
            chunk: BytesMut::new(),
            bins: Bins::default(),
            utilization: Utilization::default(),
        }
    }

    /// Names of every event and counter any of this simulator's ranks may report, with their ids.
    /// The global numbers of the ranks this simulator serves.
    pub fn ranks(&self) -> std::ops::Range<u32> {
        self.cfg.rank_offset..self.cfg.rank_offset.saturating_add(self.cfg.ranks)
    }

    /// The application id the ranks report.
    pub fn app(&self) -> &str {
        &self.cfg.app
    }

    pub fn names(&self) -> Vec<(u64, String)> {
        self.names.clone()
    }

    /// The profiles of all this simulator's ranks (global rank numbers rank_offset..rank_offset+ranks) for
    /// round `round` (0-based), with per-round values and cumulative totals. Rounds are meant to be asked in
    /// order; skipped rounds are still accumulated, and asking for an earlier round than the last one
    /// restarts the accumulation from round 0. dump_unix_ns = 0 (the caller stamps it).
    pub fn round(&mut self, round: u64) -> Vec<RankProfile> {
        let mut profiles = Vec::with_capacity(self.ranks.len());
        let app = self.cfg.app.clone();
        let cfg = self.cfg.clone();
        self.each_rank(round, |st, plan, samples, counter_ids, counters| {
            profiles.push(RankProfile {
                metrics: 0,
                // Simulated ranks run no trace module.
                trace: Vec::new(),
                trace_lost: 0,
                utilization: None,
                // Nor do they read perf counters.
                event_metrics: Vec::new(),
                marks: step_marks(&cfg, st.rank, round, 0),
                marks_lost: 0,
                app: app.clone(),
                rank: st.rank,
                round,
                dump_unix_ns: 0,
                events: plan
                    .iter()
                    .zip(samples.iter().zip(&st.totals))
                    .map(|(slot, (s, t))| event(slot.id, s, t))
                    .collect(),
                counters: counter_ids
                    .iter()
                    .zip(counters.iter().zip(&st.counter_totals))
                    .map(|(&counter_id, (&value, &total))| CounterSample {
                        counter_id,
                        value,
                        total,
                    })
                    .collect(),
            });
        });
        profiles
    }

    /// Round `round` of every rank, as [`Simulator::round`] computes it, written straight to each rank's
    /// encoded one-profile `ProfileBatch` under measurement options: only the events `reported` keeps, the
    /// counters only if `metrics` reports them. `each` gets every rank's number and its batch, or `None`
    /// for a rank `sampled_out` leaves out (its totals still grow).
    pub fn encode_round(
        &mut self,
        round: u64,
        dump_unix_ns: u64,
        selection: &Selection<'_>,
        mut each: impl FnMut(u32, Option<Bytes>),
    ) {
        let mut writer = std::mem::take(&mut self.writer);
        let mut last_batch = self.last_batch;
        let mut chunk = std::mem::take(&mut self.chunk);
        let mut bins = std::mem::take(&mut self.bins);
        let mut utilization = std::mem::take(&mut self.utilization);
        let cfg = self.cfg.clone();
        let app = std::mem::take(&mut self.cfg.app);
        let with_counters = metric::reports(selection.metrics, metric::COUNTERS);
        self.each_rank(round, |st, plan, samples, counter_ids, counters| {
            if (selection.sampled_out)(st.rank) {
                each(st.rank, None);
                return;
            }
            writer.begin(&ProfileHeader {
                app: &app,
                rank: st.rank,
                round,
                dump_unix_ns,
            });
            for (slot, (s, t)) in plan.iter().zip(samples.iter().zip(&st.totals)) {
                if (selection.reported)(slot.id) {
                    writer.event(&event(slot.id, s, t));
                }
            }
            if with_counters {
                for (&counter_id, (&value, &total)) in
                    counter_ids.iter().zip(counters.iter().zip(&st.counter_totals))
                {
                    if (selection.reported)(counter_id) {
                        writer.counter(&CounterSample {
                            counter_id,
                            value,
                            total,
                        });
                    }
                }
            }
            let with = selection.utilization.map(|w| {
                lay_out(&mut bins, w, st.rank, plan, samples);
                bins.compress(1, DEFAULT_THRESHOLD, 0, &mut utilization);
                &utilization
            });
            let marks = step_marks(&cfg, st.rank, round, selection.step_unix_ns);
            // Ranks' batches are about the same size: one that outgrows what is left still comes out whole
            // (the chunk grows), only in an allocation of its own.
            if chunk.capacity() - chunk.len() < last_batch + 64 {
                chunk = BytesMut::with_capacity(CHUNK_BYTES.max(2 * last_batch));
            }
            writer.finish_batch_with(selection.metrics, with, &marks, &mut chunk);
            last_batch = chunk.len();
            each(st.rank, Some(chunk.split().freeze()));
        });
        self.cfg.app = app;
        self.writer = writer;
        self.last_batch = last_batch;
        self.chunk = chunk;
        self.bins = bins;
        self.utilization = utilization;
    }

    /// Computes every rank's values of `round`, adds them to its totals, and hands them to `each` with the
    /// rank's state (its totals include this round), its plan, and the counters.
    fn each_rank(
        &mut self,
        round: u64,
        mut each: impl FnMut(&RankState, &[Slot], &[Sample], &[u64], &[f64]),
    ) {
        if round < self.next_round {
            for st in &mut self.ranks {
                st.totals.fill(Sample::default());
                st.counter_totals.fill(0.0);
            }
            self.next_round = 0;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        while self.next_round < round {
            for i in 0..self.ranks.len() {
                self.accumulate(i, self.next_round, &mut scratch);
            }
            self.next_round += 1;
        }
        for i in 0..self.ranks.len() {
            self.accumulate(i, round, &mut scratch);
            let st = &self.ranks[i];
            each(
                st,
                &self.plans[st.plan],
                &scratch.samples,
                &self.counter_ids,
                &scratch.counters,
            );
        }
        self.scratch = scratch;
        self.next_round = round.saturating_add(1);
    }

    /// Computes rank `i`'s values for `round` into `out` and adds them to its totals.
    fn accumulate(&mut self, i: usize, round: u64, out: &mut Scratch) {
        self.sample(&self.ranks[i], round, out);
        let st = &mut self.ranks[i];
        for (t, s) in st.totals.iter_mut().zip(&out.samples) {
            t.calls += s.calls;
            t.subrs += s.subrs;
            t.incl += s.incl;
            t.excl += s.excl;
        }
        for (t, c) in st.counter_totals.iter_mut().zip(&out.counters) {
            *t += c;
        }
    }

    /// One rank's values for one round, into `out`; a pure function of (seed, scenario, rank, round, event)
    /// and the application size, so any agent simulating this rank computes the same.
    fn sample(&self, st: &RankState, round: u64, out: &mut Scratch) {
        let sc = self.cfg.scenario;
        let plan = &self.plans[st.plan];
        let w = workload(sc, round);
        let prefix = Keyed::prefix(&[self.cfg.seed, sc.tag(), u64::from(st.rank), round]);
        let key = |id: u64| Keyed::with(prefix, id);
        out.samples.clear();
        out.samples.extend(plan.iter().map(|slot| {
            let mut g = key(slot.id);
            let (calls, us) = match slot.kind {
                Kind::Root => (slot.calls, slot.base_us * g.range(0.9, 1.1)),
                Kind::Compute => (
                    slot.calls,
                    slot.base_us * st.statics.speed * w * g.range(0.95, 1.05),
                ),
                Kind::Comm => (slot.calls, slot.base_us * st.statics.comm * w * g.range(0.8, 1.2)),
                Kind::Wait { spike } => {
                    let base = (slot.base_us + st.wait_us) * w * g.range(0.85, 1.15);
                    // The range keeps the spike >= 5x the neighbouring rounds even at opposite noise extremes.
                    let factor = if spike && round == FLASH_SPIKE_ROUND {
                        g.range(8.0, 12.0)
                    } else {
                        1.0
                    };
                    (slot.calls, base * factor)
                }
                Kind::Entry { load } => {
                    let f = 1.0 + (st.statics.load - 1.0) * load;
                    let calls = (slot.calls as f64 * f).round() as u64;
                    (
                        calls,
                        slot.base_us * f * w * g.range(1.0 - NAMD_JITTER, 1.0 + NAMD_JITTER),
                    )
                }
                // Busy + idle for now: the busy part is taken off below, once it is known.
                Kind::Idle => (8 + g.next_u64() % 17, self.envelope_us * w * g.range(1.01, 1.015)),
                Kind::Driver(i) => (slot.calls, workflow::driver_us(self.cfg.seed, round, i)),
            };
            Sample {
                calls,
                subrs: 0,
                incl: us,
                excl: us,
            }
        }));
        let samples = &mut out.samples;
        if let Some(idle) = plan.iter().position(|s| matches!(s.kind, Kind::Idle)) {
            let busy: f64 = samples
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != idle)
                .map(|(_, s)| s.excl)
                .sum();
            let us = (samples[idle].excl - busy).max(0.0);
            samples[idle].excl = us;
            samples[idle].incl = us;
        }
        // Parents precede their children, so a backward walk completes each child before adding it up.
        for j in (0..plan.len()).rev() {
            if let Some(p) = plan[j].parent {
                let (incl, calls) = (samples[j].incl, samples[j].calls);
                samples[p].incl += incl;
                samples[p].subrs += calls;
            }
        }
        out.counters.clear();
        out.counters.extend(
            self.counter_ids
                .iter()
                .map(|&id| (st.statics.bytes * w * key(id).range(0.9, 1.1)).round()),
        );
    }
}

/// Which of a round's profiles and values the simulated ranks report (measurement options).
pub struct Selection<'a> {
    /// Whether an event or counter id is reported.
    pub reported: &'a dyn Fn(u64) -> bool,
    /// `RankProfile.metrics`: 0 reports all; without the counters bit no counter is written.
    pub metrics: u32,
    /// Whether rank sampling leaves a rank out.
    pub sampled_out: &'a dyn Fn(u32) -> bool,
    /// Time rounds (the utilization module in force): the round's window of wall time, and every rank's
    /// profile carries its utilization profile.
    pub utilization: Option<TimeWindow>,
    /// When the round's step begins on the tree's clock, in nanoseconds since the Unix epoch: the time of the
    /// workflow scenario's step marks.
    pub step_unix_ns: u64,
}

impl Selection<'static> {
    /// Every event and counter of every rank, no time rounds: what a benchmark folds.
    pub fn everything() -> Selection<'static> {
        Selection {
            reported: &|_| true,
            metrics: 0,
            sampled_out: &|_| false,
            utilization: None,
            step_unix_ns: 0,
        }
    }
}

/// The workflow scenario's step marks of one rank's round: rank 0 of the simulation marks the start of step
/// `round` at `at`, and rank 0 of `csym` its stop at `at` plus the step's latency.
fn step_marks(cfg: &SimConfig, rank: u32, round: u64, at: u64) -> Vec<StepMark> {
    if cfg.scenario != Scenario::Workflow || rank != 0 {
        return Vec::new();
    }
    let key_id = event_id(workflow::KEY);
    match workflow::Component::of(&cfg.app) {
        workflow::Component::Simulation => vec![StepMark {
            key_id,
            step: round,
            stop: false,
            unix_ns: at,
        }],
        workflow::Component::Csym => vec![StepMark {
            key_id,
            step: round,
            stop: true,
            unix_ns: at + workflow::latency_ns(cfg.seed, round),
        }],
        workflow::Component::Bonds => Vec::new(),
    }
}

/// A time round's window of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    /// When it begins, in nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub period_ns: u64,
}

/// How many times a simulated rank runs through its events in one time round, at most: one pass per 25 ms.
const PASSES_PER_PERIOD_NS: u64 = 25_000_000;

/// Lays one simulated rank's round out in wall time for the utilization module: the window is cut into passes
/// (one per 25 ms), and each pass runs every event for its share of the round's exclusive time, in plan order,
/// from a point that differs by rank and round, so each rank's bins differ and its shares over the window are
/// its profile's.
fn lay_out(bins: &mut Bins, w: TimeWindow, rank: u32, plan: &[Slot], samples: &[Sample]) {
    let bin_ns = u64::from(canopy_wire::utilization::BIN_US) * 1000;
    bins.reset(w.start_unix_ns, bin_ns, w.period_ns.div_ceil(bin_ns) as usize);
    let total: f64 = samples.iter().map(|s| s.excl.max(0.0)).sum();
    if total <= 0.0 || plan.is_empty() {
        return;
    }
    let passes = (w.period_ns / PASSES_PER_PERIOD_NS).max(1);
    let pass_ns = w.period_ns as f64 / passes as f64;
    let first = (rank as usize).wrapping_mul(7) % plan.len();
    let mut t = w.start_unix_ns as f64;
    for _ in 0..passes {
        for k in 0..plan.len() {
            let i = (first + k) % plan.len();
            let span = pass_ns * samples[i].excl.max(0.0) / total;
            let end = t + span;
            bins.add(t as u64, end as u64, plan[i].id);
            t = end;
        }
    }
}

fn event(id: u64, s: &Sample, t: &Sample) -> EventSample {
    EventSample {
        event_id: id,
        calls: s.calls,
        subrs: s.subrs,
        incl_us: s.incl,
        excl_us: s.excl,
        calls_total: t.calls,
        subrs_total: t.subrs,
        incl_total_us: t.incl,
        excl_total_us: t.excl,
        metrics: Vec::new(),
        metrics_total: Vec::new(),
    }
}

/// A rank's values of one round, kept between ranks and rounds so they cost no allocation.
#[derive(Debug, Default)]
struct Scratch {
    samples: Vec<Sample>,
    counters: Vec<f64>,
}

/// How a region's time is made.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// The top region; its own time is loop overhead.
    Root,
    /// Computation: follows the rank's speed and the round's workload.
    Compute,
    /// Communication paid in traffic rather than waiting.
    Comm,
    /// Mostly waiting for slower ranks; `spike` marks FLASH's Allreduce anomaly.
    Wait { spike: bool },
    /// A Charm++ entry method; `load` is the share of its work that follows the rank's overload.
    Entry { load: f64 },
    /// Charm++ scheduler idle time.
    Idle,
    /// One of the workflow scenario's latency drivers (its index in [`workflow::DRIVERS`]): the same time at
    /// every rank of its application, drawn anew for every step.
    Driver(usize),
}

#[derive(Debug, Clone)]
struct Slot {
    id: u64,
    kind: Kind,
    /// Exclusive time per round at workload 1 (for `Wait`, the part that is not waiting).
    base_us: f64,
    calls: u64,
    /// Index of the enclosing region in the same plan; always lower than the slot's own.
    parent: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    calls: u64,
    subrs: u64,
    incl: f64,
    excl: f64,
}

#[derive(Debug)]
struct RankState {
    rank: u32,
    plan: usize,
    statics: Statics,
    /// Scenario-specific waiting time per round at workload 1 (Allreduce for flash, Waitall for uintah).
    wait_us: f64,
    totals: Vec<Sample>,
    counter_totals: Vec<f64>,
}

const FLASH_WAIT_SPREAD_US: f64 = 600.0;
const FLASH_SPIKE_ROUND: u64 = 100;
const NAMD_JITTER: f64 = 0.02;
const COUNTERS: [&str; 1] = ["bytes_sent"];

#[cfg(test)]
mod tests;
