//! Canopy's application SDK: time regions and count things in a parallel application, and offload a profile
//! to the node's leaf agent at every dump (ToM's `TAU_DB_DUMP`), while the application runs.
//!
//! ```no_run
//! canopy_sdk::init("stencil", None, None).unwrap(); // rank and size from PMI, Open MPI or Slurm
//! let step = canopy_sdk::timer("step").unwrap();
//! for _ in 0..100 {
//!     step.start();
//!     // ... compute ...
//!     step.stop();
//!     canopy_sdk::counter("bytes sent", 4096.0);
//!     let _ = canopy_sdk::dump(); // never blocks: the profile is queued and shipped by a background thread
//! }
//! canopy_sdk::finalize().unwrap();
//! ```
//!
//! Every call is an event of the event interface (events.rs): activities begin and end (timers are
//! activities), messages are sent, threads go idle and busy, counters move. The measurement modules in force
//! receive them: the profile module (the rank's profile at each dump), the trace module (a bounded event trace,
//! shipped by the ranks the options name) and the null module; CANOPY_MODULES chooses them at start and the
//! tree's options switch them at a dump.
//!
//! Inclusive and exclusive times come from a per-thread stack of running timers; the timers of several
//! threads add up into the rank's profile. No call blocks on I/O or aborts: a dump copies a snapshot into a
//! bounded queue and returns; when the agent is absent, dead or slow, the SDK counts the dumps it drops,
//! reconnects when the agent is back, and reports the count in the next profile that gets through. Control
//! from the tree (start, stop, events to include or exclude, a metric subset, the dump period, rank sampling)
//! takes effect at the next dump.

// One audited exception, in perf.rs: owning a perf group's descriptor as a file.
#![deny(unsafe_code)]
// The SDK runs in the application's threads and its own, never on tokio: std's monotonic clock is its clock.
#![allow(
    clippy::disallowed_types,
    reason = "std::time::Instant is banned for the daemons, which run on tokio's pausable clock"
)]

mod clock;
mod config;
mod error;
mod events;
mod measure;
mod perf;
mod rings;
mod ship;
mod snapshot;
mod steps;
mod trace;
mod utilization;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use canopy_wire::event_id;
use canopy_wire::options::Measure;
use canopy_wire::v1::RankControl;
use clock::Clock;
pub use config::Config;
pub use error::Error;
pub use events::{Activity, Counter, activity, counter_id, idle_begin, idle_end, modules, send};
pub use measure::{MAX_NAMES, Scope, Timer};
use measure::{Totals, registry};
use snapshot::{Kind, Snapshot};
pub use steps::MAX_MARKS;

/// The handle of the timer `name`, made on first use; the same name always gives the same handle. Timers
/// work before `init` (their values are in the first dump).
pub fn timer(name: &str) -> Result<&'static Timer, Error> {
    if name.is_empty() {
        return Err(Error::Invalid("a timer needs a name".into()));
    }
    registry().timer(name)
}

/// Marks the start of step `step` of the workflow key `key` (say "exchange") now, on this rank. Any rank of
/// any application may start or stop a step, in any round: the latency filter pairs the earliest start with
/// the latest stop of each (key, step) over the tree and gives the step's end-to-end latency. The mark ships
/// with the next dump (at most [`MAX_MARKS`] per dump; more are counted as lost). Works before `init`.
pub fn step_start(key: &str, step: u64) -> Result<(), Error> {
    steps::mark(key, step, false)
}

/// Marks the end of step `step` of `key` now, on this rank (see [`step_start`]).
pub fn step_stop(key: &str, step: u64) -> Result<(), Error> {
    steps::mark(key, step, true)
}

/// Adds `value` to the counter `name` (bytes sent, cache misses...) on the calling thread.
pub fn counter(name: &str, value: f64) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Invalid("a counter needs a name".into()));
    }
    if !value.is_finite() {
        return Err(Error::Invalid(format!(
            "counter {name:?}: {value} is not a finite number"
        )));
    }
    measure::counter(name, value)
}

/// Puts these measurement modules in force from now on ("profile", "trace", "utilization", "null"), until the
/// tree's options name others. The error names an unknown module. With "utilization" the rounds become time
/// rounds, dumped by the SDK's period thread.
pub fn set_modules(names: &[&str]) -> Result<(), Error> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let bits = events::modules_named(&names).map_err(Error::Invalid)?;
    events::set_modules(bits);
    // The utilization module's rounds are time rounds, dumped by the period thread.
    if time_rounds()
        && let Some(sdk) = SDK.get()
    {
        sdk.start_period_thread()?;
    }
    Ok(())
}

/// The period of time rounds when no period is set.
const TIME_ROUND_PERIOD: Duration = Duration::from_secs(1);
/// How often a rank in time rounds looks for the tree's clock before it has one.
const CLOCK_POLL: Duration = Duration::from_millis(20);
/// The longest a period thread sleeps at once, so a change of options or a finalize is seen soon.
const LONGEST_SLEEP: Duration = Duration::from_millis(100);

/// The tree's options set `time_rounds` (as of the last control applied).
static TIME_ROUNDS: AtomicBool = AtomicBool::new(false);

/// Whether the rounds are time rounds: the tree's options set `time_rounds`, or the utilization module is in
/// force.
fn time_rounds() -> bool {
    TIME_ROUNDS.load(Ordering::Acquire) || events::in_force("utilization")
}

#[allow(
    clippy::disallowed_methods,
    reason = "the SDK's own period thread, not a runtime worker: it sleeps until the next dump"
)]
fn sleep(d: Duration) {
    std::thread::sleep(d);
}

/// Counts a process can read about its SDK.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Dumps taken (the next round's number).
    pub dumps: u64,
    /// Dumps that were never delivered (queue full while the agent was absent or slow).
    pub dropped: u64,
    /// Dumps written to an agent.
    pub delivered: u64,
    /// Whether a connection to an agent is up.
    pub connected: bool,
    /// Whether collection is on (false after a Stop from the tree).
    pub collecting: bool,
    /// Stops that did not match the timer running last on their thread (ignored).
    pub mismatched_stops: u64,
}

struct State {
    next_round: u64,
    totals: Totals,
    prev: Totals,
    collecting: bool,
    /// The window of rounds in force (from, to): the rank reports those rounds only.
    window: Option<(u64, u64)>,
    stop_sent: bool,
    measure: Arc<Measure>,
    measure_gen: u64,
    sampled_out: bool,
    /// Whether the options name this rank in `trace_ranks`.
    traced: bool,
    period: Option<Duration>,
    /// The clock of time rounds: the tree's, from the latest Start, moved on when the period changes.
    clock: Option<Clock>,
    /// The tree's clock as the agent last gave it, (start_unix_ns, first_round).
    tree_clock: (u64, u64),
    /// The utilization module's replay, kept between periods.
    binner: utilization::Binner,
    control_seen: u64,
    ready: VecDeque<Snapshot>,
    free: Vec<Snapshot>,
    dropped: u64,
    finalized: bool,
}

/// What the application threads and the background thread share.
struct Sdk {
    config: Config,
    state: Mutex<State>,
    /// The latest control from the agent and its generation; a dump applies it when the generation moved.
    control: Mutex<Option<RankControl>>,
    control_gen: AtomicU64,
    shipper: OnceLock<std::thread::Thread>,
    link: ship::Link,
    period_thread: AtomicBool,
}

static SDK: OnceLock<Sdk> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Starts the SDK for this process: `app` names the application (empty: the program's name); `rank` and
/// `nranks` default to the launcher's environment (CANOPY_RANK, PMI_RANK, PMIX_RANK, OMPI_COMM_WORLD_RANK,
/// MV2_COMM_WORLD_RANK, SLURM_PROCID, and the matching sizes). It returns at once: the agent is reached from a
/// background thread.
pub fn init(app: &str, rank: Option<u32>, nranks: Option<u32>) -> Result<(), Error> {
    init_with(Config::from_env(app, rank, nranks)?)
}

/// Why no agent can be listening at `socket`, if that can be told without connecting (a connection would be a
/// rank the agent sees hang up): no such file, not a socket, or a directory this process may not enter.
fn agent_socket_problem(socket: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(socket) {
        Ok(m) if m.file_type().is_socket() => None,
        Ok(_) => Some(format!("{} is not a socket", socket.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("no agent is listening at {}", socket.display()))
        }
        Err(e) => Some(format!(
            "cannot reach the agent's socket {}: {e}",
            socket.display()
        )),
    }
}

/// Starts the SDK with an explicit configuration.
pub fn init_with(config: Config) -> Result<(), Error> {
    if SDK.get().is_some() {
        return Err(Error::AlreadyInitialized);
    }
    let state = State {
        next_round: 0,
        totals: Totals::default(),
        prev: Totals::default(),
        collecting: true,
        window: None,
        stop_sent: false,
        measure: Arc::new(Measure::default()),
        measure_gen: 0,
        sampled_out: false,
        traced: false,
        period: config.period,
        clock: None,
        tree_clock: (0, 0),
        binner: utilization::Binner::default(),
        control_seen: 0,
        ready: VecDeque::with_capacity(config.queue_dumps),
        free: (0..config.queue_dumps).map(|_| Snapshot::new()).collect(),
        dropped: 0,
        finalized: false,
    };
    let sdk = Sdk {
        config,
        state: Mutex::new(state),
        control: Mutex::new(None),
        control_gen: AtomicU64::new(0),
        shipper: OnceLock::new(),
        link: ship::Link::default(),
        period_thread: AtomicBool::new(false),
    };
    if SDK.set(sdk).is_err() {
        return Err(Error::AlreadyInitialized);
    }
    let sdk = SDK.get().expect("set above");
    if let Some(problem) = agent_socket_problem(&sdk.config.socket) {
        // Said at the start, not after an eight-hour run at its finalize.
        eprintln!(
            "canopy: rank {}: {problem}: its dumps wait here (up to {}, then the oldest are dropped and counted) \
             and go once an agent listens there; start one (canopy-agent --socket PATH, or run the program under \
             `canopy run`), or set CANOPY_AGENT_SOCKET to its socket",
            sdk.config.rank, sdk.config.queue_dumps
        );
    }
    trace::set_capacity(sdk.config.trace_events);
    utilization::set_capacity(sdk.config.utilization_events);
    events::set_modules(sdk.config.modules);
    perf::set(sdk.config.counters);
    let handle = std::thread::Builder::new()
        .name("canopy-ship".into())
        .spawn(move || ship::run(sdk))
        .map_err(|e| Error::Thread(e.to_string()))?;
    let _ = sdk.shipper.set(handle.thread().clone());
    if sdk.config.period.is_some() || time_rounds() {
        sdk.start_period_thread()?;
    }
    Ok(())
}

/// Offloads this round's profile: copies every timer's and counter's values into the queue and returns; the
/// background thread ships it. Control that arrived since the last dump applies from this one. While a dump
/// period is in force the SDK dumps on its own and this call does nothing.
pub fn dump() -> Result<(), Error> {
    let sdk = SDK.get().ok_or(Error::NotInitialized)?;
    sdk.dump(false, None)
}

/// Finishes: takes a last dump when the SDK dumps by period (what ran since the last tick), ships what is
/// queued, sends FIN and waits for the agent's FINACK, up to the configured time-out
/// (CANOPY_FINALIZE_TIMEOUT_MS, default 5000). Without an agent it returns at once with the count of dumps
/// that were not delivered.
pub fn finalize() -> Result<(), Error> {
    let sdk = SDK.get().ok_or(Error::NotInitialized)?;
    {
        let mut st = lock(&sdk.state);
        if st.finalized {
            return Err(Error::Finalized);
        }
        if time_rounds() {
            // The last, partial time round: its window ends now.
            if let Some(c) = st.clock {
                let now = rings::now_unix_ns();
                let (round, from, _) = c.current(now, st.next_round);
                if from < now {
                    let _ = sdk.dump_locked(&mut st, true, Some((round, from, now)));
                }
            }
        } else if st.period.is_some() {
            // The last, partial period is a round too: what ran since the last tick is delivered. A full queue
            // drops and counts it like any dump.
            let _ = sdk.dump_locked(&mut st, true, None);
        }
        st.finalized = true;
    }
    sdk.link.finish(sdk, sdk.config.finalize_timeout)
}

/// The SDK's counts (all zero before `init`).
pub fn stats() -> Stats {
    let Some(sdk) = SDK.get() else {
        return Stats {
            mismatched_stops: registry().mismatched_stops(),
            ..Stats::default()
        };
    };
    let st = lock(&sdk.state);
    Stats {
        dumps: st.next_round,
        dropped: st.dropped,
        delivered: sdk.link.delivered(),
        connected: sdk.link.connected(),
        collecting: st.collecting,
        mismatched_stops: registry().mismatched_stops(),
    }
}

/// Puts these per-event metrics in force for every thread, from each thread's next event: perf counters
/// ("task-clock", "page-faults", "context-switches", "cpu-migrations", "minor-faults", "major-faults", "cycles",
/// "instructions", "cache-references", "cache-misses", "branch-instructions", "branch-misses"), "heap" and
/// "depth"; none: no per-event metrics. CANOPY_COUNTERS does the same at `init`; options from the tree that
/// name counters replace them at a later dump. The error names an unknown metric.
pub fn set_counters(names: &[&str]) -> Result<(), Error> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    perf::set(canopy_wire::event_metrics::parse(&names).map_err(Error::Invalid)?);
    Ok(())
}

/// The per-event counters (CANOPY_COUNTERS, the tree's options) this process could not open, by name and
/// reason; each was also reported once on standard error when it was first refused.
pub fn unavailable_counters() -> Vec<(String, String)> {
    perf::unavailable()
}

impl Sdk {
    fn wake_shipper(&self) {
        if let Some(t) = self.shipper.get() {
            t.unpark();
        }
    }

    /// A dump: an explicit one, a period's tick, or a time round (round, window start and end in Unix ns).
    fn dump(&'static self, from_period: bool, time: Option<(u64, u64, u64)>) -> Result<(), Error> {
        let backlog = {
            let mut st = lock(&self.state);
            if !self.dump_locked(&mut st, from_period, time)? {
                return Ok(());
            }
            st.ready.len()
        };
        // The shipper polls the queue at about half the interval between dumps, so a dump makes no system
        // call (a wake-up would also let the shipper preempt the application on a busy node); only a queue
        // filling up wakes it at once.
        if backlog * 2 >= self.config.queue_dumps {
            self.wake_shipper();
        }
        Ok(())
    }

    /// Applies the control that came since the last look.
    fn refresh(&'static self, st: &mut State) {
        let generation = self.control_gen.load(Ordering::Acquire);
        if generation != st.control_seen {
            st.control_seen = generation;
            let control = lock(&self.control).clone();
            if let Some(c) = control {
                self.apply(st, c);
            }
        }
    }

    /// Takes a dump under the state's lock; true if a snapshot was queued. `time` is a time round's number
    /// and window (from the period thread, in time rounds).
    fn dump_locked(
        &'static self,
        st: &mut State,
        from_period: bool,
        time: Option<(u64, u64, u64)>,
    ) -> Result<bool, Error> {
        if st.finalized {
            return Err(Error::Finalized);
        }
        self.refresh(st);
        let by_period = st.period.is_some() || time_rounds();
        if by_period != from_period || time_rounds() != time.is_some() {
            // An explicit dump while the SDK dumps by period (or a tick of a mode that just ended).
            return Ok(false);
        }
        let round = time.map_or(st.next_round, |(r, _, _)| r.max(st.next_round));
        st.next_round = round + 1;
        // Every round moves the values on, reported or not, so the next profile's share is its own round's.
        registry().totals(&mut st.totals);
        let in_window = st.window.is_none_or(|(from, to)| (from..=to).contains(&round));
        let kind = if !st.collecting || !in_window {
            if st.stop_sent {
                std::mem::swap(&mut st.prev, &mut st.totals);
                steps::let_go();
                return Ok(false);
            }
            Kind::Stopped
        } else if st.sampled_out {
            Kind::SampledOut
        } else {
            Kind::Profile
        };
        let Some(mut snap) = st.free.pop() else {
            // Full. A stop notice not queued is tried again at the next dump.
            std::mem::swap(&mut st.prev, &mut st.totals);
            st.dropped += 1;
            return Err(Error::Dropped {
                round,
                queue: self.config.queue_dumps,
                agent: self.link.describe(&self.config.socket),
            });
        };
        st.stop_sent = kind == Kind::Stopped;
        snap.round = round;
        snap.dump_unix_ns = unix_ns();
        snap.kind = kind;
        snap.timers.clear();
        snap.counters.clear();
        snap.metric_values.clear();
        canopy_wire::event_metrics::metric_numbers(perf::reported(), &mut snap.event_metrics);
        snap.trace.clear();
        snap.trace_lost = 0;
        snap.has_utilization = false;
        // The marks since the previous dump: shipped by a profile, else let go and counted as lost in the next
        // profile.
        if kind == Kind::Profile {
            snap.marks_lost = steps::take(&mut snap.marks);
        } else {
            steps::let_go();
            snap.marks.clear();
            snap.marks_lost = 0;
        }
        if let Some((_, from, to)) = time {
            // Every period is replayed, reported or not, so the next one starts where this one ends.
            st.binner
                .period(from, to, self.config.utilization_threshold, &mut snap.utilization);
            snap.has_utilization = kind == Kind::Profile;
        }
        if st.traced || events::in_force("trace") {
            // The trace since the previous dump: shipped by a traced rank's profile, else let go.
            let keep = st.traced && kind == Kind::Profile;
            snap.trace_lost = trace::take(keep, &mut snap.trace);
        }
        if kind == Kind::Profile {
            snap.measure = st.measure.clone();
            snap.measure_gen = st.measure_gen;
            for (i, t) in st.totals.timers.iter().enumerate() {
                if t.calls == 0 {
                    continue;
                }
                let p = st.prev.timers.get(i).copied().unwrap_or_default();
                let share = measure::TimerTotals {
                    calls: t.calls.saturating_sub(p.calls),
                    subrs: t.subrs.saturating_sub(p.subrs),
                    incl_ns: t.incl_ns.saturating_sub(p.incl_ns),
                    excl_ns: t.excl_ns.saturating_sub(p.excl_ns),
                };
                snap.timers.push((i as u32, share, *t));
                if !snap.event_metrics.is_empty() {
                    let now = st.totals.metrics.get(i).copied().unwrap_or_default();
                    let before = st.prev.metrics.get(i).copied().unwrap_or_default();
                    for m in &snap.event_metrics {
                        let total = now.value(*m);
                        let share = if canopy_wire::event_metrics::of_metric(*m as i32)
                            .is_some_and(|(_, side)| side == canopy_wire::event_metrics::Side::AtEntry)
                        {
                            total
                        } else {
                            total - before.value(*m)
                        };
                        snap.metric_values.push(share.max(0.0));
                    }
                    for m in &snap.event_metrics {
                        snap.metric_values.push(now.value(*m));
                    }
                }
            }
            for (i, c) in st.totals.counters.iter().enumerate() {
                let p = st.prev.counters.get(i).copied().unwrap_or_default();
                // A counter never added to (the MPI wrapper registers one per call that moves bytes, most
                // unused by a given program) says nothing: it is not shipped until it is.
                if *c == 0.0 && p == 0.0 {
                    continue;
                }
                snap.counters.push((i as u32, c - p, *c));
            }
        }
        std::mem::swap(&mut st.prev, &mut st.totals);
        st.ready.push_back(snap);
        Ok(true)
    }

    /// Applies the agent's control at a dump.
    fn apply(&'static self, st: &mut State, c: RankControl) {
        st.collecting = c.collecting;
        st.window = c.windowed.then_some((c.window_from, c.window_to));
        let options = c.options.unwrap_or_default();
        TIME_ROUNDS.store(options.time_rounds == Some(true), Ordering::Release);
        // The rank runs its own application's options: the global ones with its application's entry laid over.
        match Measure::from_options(&options).map(|m| m.for_app(&self.config.app)) {
            Ok(m) => {
                st.sampled_out = m.samples_out(self.config.rank);
                st.traced = m.traces(self.config.rank);
                let modules = if m.modules().is_empty() {
                    Ok(self.config.modules)
                } else {
                    events::modules_named(m.modules())
                };
                match modules {
                    Ok(bits) => events::set_modules(bits),
                    Err(e) => self.link.note(format!("measurement modules ignored: {e}")),
                }
                perf::set(m.counters().unwrap_or(self.config.counters));
                st.measure = Arc::new(m);
                st.measure_gen += 1;
            }
            // The tree checks options before it sends them; an SDK that disagrees keeps the ones in force.
            Err(e) => self.link.note(format!("measurement options ignored: {e}")),
        }
        if options.period_ms > 0 {
            let period = Duration::from_millis(options.period_ms);
            if let Some(c) = st.clock
                && c.period_ns != period.as_nanos() as u64
            {
                // The new period counts from the end of the round under way, from the next round on.
                let (round, _, end) = c.current(rings::now_unix_ns(), st.next_round);
                st.clock = Some(Clock {
                    start: end,
                    first: round + 1,
                    period_ns: period.as_nanos().max(1) as u64,
                });
            }
            st.period = Some(period);
        }
        // A new Start's clock counts in the period in force with it: a rank that gets both at once (one that
        // attaches mid-run) counts the windows from the start as every rank attaching then does, and as its agent
        // expects it to.
        if c.start_unix_ns > 0 && (c.start_unix_ns, c.first_round) != st.tree_clock {
            st.tree_clock = (c.start_unix_ns, c.first_round);
            st.clock = Some(Clock {
                start: c.start_unix_ns,
                first: c.first_round,
                period_ns: st.period.unwrap_or(TIME_ROUND_PERIOD).as_nanos().max(1) as u64,
            });
            // In time rounds a rank that gets a clock begins at the window under way: the windows that ended
            // before it had one are not its own (it joined mid-run, or collection started again), not rounds it
            // fell behind on.
            if time_rounds()
                && let Some(clock) = st.clock
            {
                let (round, _, _) = clock.current(rings::now_unix_ns(), st.next_round);
                st.next_round = round;
            }
        }
        if (options.period_ms > 0 || time_rounds())
            && let Err(e) = self.start_period_thread()
        {
            self.link.note(e.to_string());
        }
    }

    fn start_period_thread(&'static self) -> Result<(), Error> {
        if self.period_thread.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        std::thread::Builder::new()
            .name("canopy-period".into())
            .spawn(move || self.run_period())
            .map(|_| ())
            .map_err(|e| {
                self.period_thread.store(false, Ordering::Release);
                Error::Thread(e.to_string())
            })
    }

    /// The period thread: a dump at every tick of the period, or, in time rounds, a
    /// time round at the end of each window of the tree's clock (none before the rank has that clock).
    fn run_period(&'static self) {
        let mut next = Instant::now();
        loop {
            let (time, period) = {
                let mut st = lock(&self.state);
                if st.finalized {
                    return;
                }
                self.refresh(&mut st);
                let time = time_rounds().then(|| st.clock.map(|c| (c, st.next_round)));
                (time, st.period.unwrap_or(Duration::from_millis(100)))
            };
            let dumped = match time {
                Some(None) => {
                    sleep(CLOCK_POLL);
                    next = Instant::now();
                    continue;
                }
                Some(Some((clock, next_round))) => {
                    let now = rings::now_unix_ns();
                    let (round, from, end) = clock.due(now, next_round);
                    if now < end {
                        sleep(Duration::from_nanos(end - now).min(LONGEST_SLEEP));
                        continue;
                    }
                    next = Instant::now();
                    self.dump(true, Some((round, from, end)))
                }
                None => {
                    next += period;
                    let now = Instant::now();
                    if next > now {
                        sleep(next - now);
                    } else {
                        next = now;
                    }
                    self.dump(true, None)
                }
            };
            if let Err(Error::Finalized) = dumped {
                return;
            }
        }
    }

    /// Called by the link when the agent sends control. Options that make the rounds time rounds (`time_rounds`,
    /// or the utilization module in force) start the period thread, which applies them: a rank that never dumps is monitored too.
    fn set_control(&'static self, c: RankControl) {
        let time = c.options.as_ref().is_some_and(canopy_wire::options::time_rounds);
        *lock(&self.control) = Some(c);
        self.control_gen.fetch_add(1, Ordering::AcqRel);
        if time && let Err(e) = self.start_period_thread() {
            self.link.note(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests;
