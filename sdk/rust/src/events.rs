//! The event interface: what an application (or the MPI wrapper) tells the SDK as it runs, and the measurement
//! modules that receive it.
//!
//! Five events: an activity begins, an activity ends (an activity is a timed region, registered once by
//! name), a message is sent (destination and bytes), the thread becomes idle, the thread is busy again; and a
//! counter moves. Timers and counters are this interface too: `Timer::start` is an activity's begin.
//!
//! Modules plug in at once, each receiving the events it asks for: the profile module (inclusive and exclusive
//! time, calls, subroutine calls, counters, the rank's profile at each dump), the trace module (a bounded
//! per-thread event trace, shipped only by the ranks that options name), and the null module (it takes every
//! event and does nothing, to measure the interface's own cost). The modules in force are chosen at start
//! (CANOPY_MODULES) and switched from the root through the measurement options, at a dump.
//!
//! An event reads the clock once, whatever the number of modules, and costs one relaxed load when no module
//! wants it. No event takes a lock that another thread holds for long, blocks, or allocates once its thread
//! has seen the names it uses.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use crate::Error;
use crate::measure::{self, registry};
use crate::trace;
use crate::utilization::UtilizationModule;

/// A measurement module: it receives the events it asks for, on the thread where they happen.
pub(crate) trait Module: Sync {
    /// The module's name, as CANOPY_MODULES and the options give it.
    fn name(&self) -> &'static str;
    /// The events it wants (bits of `Kind`).
    fn wants(&self) -> u32;
    fn begin(&self, _activity: u32, _now: Instant) {}
    fn end(&self, _activity: u32, _now: Instant) {}
    fn send(&self, _dest: u32, _bytes: u64, _now: Instant) {}
    fn idle_begin(&self, _now: Instant) {}
    fn idle_end(&self, _now: Instant) {}
    fn count(&self, _counter: u32, _value: f64) {}
    /// The module was switched on (it was off).
    fn enabled(&self) {}
}

/// The kinds of events, as bits of `Module::wants`.
pub(crate) mod kind {
    pub const BEGIN: u32 = 1;
    pub const END: u32 = 2;
    pub const SEND: u32 = 4;
    pub const IDLE_BEGIN: u32 = 8;
    pub const IDLE_END: u32 = 16;
    pub const COUNT: u32 = 32;
    pub const ALL: u32 = 63;
    pub const KINDS: usize = 6;
}

/// Every module the SDK has, in the order they receive an event. A module's index is its bit in `WANTS`.
static MODULES: [&dyn Module; 4] = [&Profile, &trace::Trace, &UtilizationModule, &Null];

/// For each kind of event, the modules in force that want it (bits: indices in `MODULES`).
static WANTS: [AtomicU32; kind::KINDS] = [const { AtomicU32::new(PROFILE_BIT) }; kind::KINDS];
/// The modules in force (bits: indices in `MODULES`); before `init`, the profile module alone.
static IN_FORCE: AtomicU32 = AtomicU32::new(PROFILE_BIT);
const PROFILE_BIT: u32 = 1;

/// The modules of these names, as a bit set; the error names an unknown one.
pub(crate) fn modules_named(names: &[String]) -> Result<u32, String> {
    let mut bits = 0;
    for n in names {
        let i = MODULES.iter().position(|m| m.name() == n.trim()).ok_or_else(|| {
            format!(
                "unknown measurement module {n:?} ({})",
                canopy_wire::options::MODULES.join(", ")
            )
        })?;
        bits |= 1 << i;
    }
    Ok(bits)
}

/// Puts the modules in `bits` in force: those newly on are told first, then every kind of event goes to the
/// modules that want it.
pub(crate) fn set_modules(bits: u32) {
    let before = IN_FORCE.swap(bits, Ordering::AcqRel);
    for (i, m) in MODULES.iter().enumerate() {
        if bits & (1 << i) != 0 && before & (1 << i) == 0 {
            m.enabled();
        }
    }
    for (k, wants) in WANTS.iter().enumerate() {
        let mut mask = 0;
        for (i, m) in MODULES.iter().enumerate() {
            if bits & (1 << i) != 0 && m.wants() & (1 << k) != 0 {
                mask |= 1 << i;
            }
        }
        wants.store(mask, Ordering::Release);
    }
}

/// The names of the modules in force.
pub fn modules() -> Vec<&'static str> {
    let bits = IN_FORCE.load(Ordering::Acquire);
    MODULES
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, m)| m.name())
        .collect()
}

/// Whether a module of this name is in force.
pub(crate) fn in_force(name: &str) -> bool {
    let bits = IN_FORCE.load(Ordering::Acquire);
    MODULES
        .iter()
        .enumerate()
        .any(|(i, m)| bits & (1 << i) != 0 && m.name() == name)
}

/// Calls `f` on each module in `mask`.
#[inline]
fn each(mut mask: u32, mut f: impl FnMut(&dyn Module)) {
    while mask != 0 {
        let i = mask.trailing_zeros();
        f(MODULES[i as usize]);
        mask &= mask - 1;
    }
}

#[inline]
fn wanting(k: u32) -> u32 {
    WANTS[k.trailing_zeros() as usize].load(Ordering::Relaxed)
}

/// An activity (a timed region): its id is the index of the timer of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Activity(pub(crate) u32);

impl Activity {
    /// The activity's index, the id the C interface hands out.
    pub fn index(self) -> u32 {
        self.0
    }

    /// The activity of this index, if one was registered.
    pub fn from_index(index: u32) -> Option<Activity> {
        (index < registry().timer_count() as u32).then_some(Activity(index))
    }

    /// The activity begins on the calling thread.
    #[inline]
    pub fn begin(self) {
        let mask = wanting(kind::BEGIN);
        if mask != 0 {
            let now = Instant::now();
            each(mask, |m| m.begin(self.0, now));
        }
    }

    /// The activity ends on the calling thread: it must be the one begun last there (another end is ignored
    /// and counted by the profile module).
    #[inline]
    pub fn end(self) {
        let mask = wanting(kind::END);
        if mask != 0 {
            let now = Instant::now();
            each(mask, |m| m.end(self.0, now));
        }
    }
}

/// The activity of this name, made on first use; the same name always gives the same activity (and the timer
/// of that name is the same activity).
pub fn activity(name: &str) -> Result<Activity, Error> {
    crate::timer(name).map(|t| Activity(t.index()))
}

/// A message of `bytes` bytes was sent to rank `dest`.
#[inline]
pub fn send(dest: u32, bytes: u64) {
    let mask = wanting(kind::SEND);
    if mask != 0 {
        let now = Instant::now();
        each(mask, |m| m.send(dest, bytes, now));
    }
}

/// The calling thread becomes idle (waits for work or for a message).
#[inline]
pub fn idle_begin() {
    let mask = wanting(kind::IDLE_BEGIN);
    if mask != 0 {
        let now = Instant::now();
        each(mask, |m| m.idle_begin(now));
    }
}

/// The calling thread is busy again.
#[inline]
pub fn idle_end() {
    let mask = wanting(kind::IDLE_END);
    if mask != 0 {
        let now = Instant::now();
        each(mask, |m| m.idle_end(now));
    }
}

/// A counter, by its id: the index of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Counter(pub(crate) u32);

impl Counter {
    pub fn index(self) -> u32 {
        self.0
    }

    /// The counter of this index, if one was registered.
    pub fn from_index(index: u32) -> Option<Counter> {
        (index < registry().counter_count() as u32).then_some(Counter(index))
    }

    /// Adds `value` to the counter on the calling thread (a value that is not finite is ignored).
    #[inline]
    pub fn add(self, value: f64) {
        if !value.is_finite() {
            return;
        }
        let mask = wanting(kind::COUNT);
        if mask != 0 {
            each(mask, |m| m.count(self.0, value));
        }
    }
}

/// The counter of this name, made on first use.
pub fn counter_id(name: &str) -> Result<Counter, Error> {
    if name.is_empty() {
        return Err(Error::Invalid("a counter needs a name".into()));
    }
    registry().counter_index(name).map(Counter)
}

/// The profile module: per-thread stacks of running activities give inclusive and exclusive time, calls and
/// subroutine calls; idle time is the activity "Idle"; a send adds to the counters "messages_sent" and
/// "bytes_sent".
struct Profile;

/// Which switch-on of the profile module a thread's stack belongs to: a stack begun before the module was
/// last switched off is dropped, since the ends it waits for were never seen.
static PROFILE_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Names registered on the first event that needs them (once per process, not per event).
struct Names {
    idle: OnceLock<Option<u32>>,
    sent: OnceLock<Option<(u32, u32)>>,
}

static NAMES: Names = Names {
    idle: OnceLock::new(),
    sent: OnceLock::new(),
};

impl Names {
    fn idle(&self) -> Option<u32> {
        *self
            .idle
            .get_or_init(|| registry().timer("Idle").ok().map(|t| t.index()))
    }

    fn sent(&self) -> Option<(u32, u32)> {
        *self.sent.get_or_init(|| {
            let r = registry();
            Some((
                r.counter_index("messages_sent").ok()?,
                r.counter_index("bytes_sent").ok()?,
            ))
        })
    }
}

impl Module for Profile {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn wants(&self) -> u32 {
        kind::ALL
    }

    #[inline]
    fn begin(&self, activity: u32, now: Instant) {
        measure::start(activity, now, PROFILE_EPOCH.load(Ordering::Relaxed));
    }

    #[inline]
    fn end(&self, activity: u32, now: Instant) {
        measure::stop(activity, now, PROFILE_EPOCH.load(Ordering::Relaxed));
    }

    fn send(&self, _dest: u32, bytes: u64, _now: Instant) {
        if let Some((messages, total)) = NAMES.sent() {
            measure::count(messages, 1.0);
            measure::count(total, bytes as f64);
        }
    }

    fn idle_begin(&self, now: Instant) {
        if let Some(idle) = NAMES.idle() {
            self.begin(idle, now);
        }
    }

    fn idle_end(&self, now: Instant) {
        if let Some(idle) = NAMES.idle() {
            self.end(idle, now);
        }
    }

    #[inline]
    fn count(&self, counter: u32, value: f64) {
        measure::count(counter, value);
    }

    fn enabled(&self) {
        PROFILE_EPOCH.fetch_add(1, Ordering::AcqRel);
    }
}

/// The null module: it receives every event and does nothing with it.
struct Null;

impl Module for Null {
    fn name(&self) -> &'static str {
        "null"
    }

    fn wants(&self) -> u32 {
        kind::ALL
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests that switch modules take turns: the modules in force are the process's.
    pub(crate) static SWITCHING: Mutex<()> = Mutex::new(());

    #[test]
    fn unknown_modules_are_named() {
        assert_eq!(modules_named(&["profile".into(), "trace".into()]).unwrap(), 0b11);
        assert_eq!(
            modules_named(&["profiler".into()]).unwrap_err(),
            "unknown measurement module \"profiler\" (profile, trace, utilization, null)"
        );
    }

    #[test]
    fn two_modules_in_force_see_the_same_events() {
        let _turn = SWITCHING.lock().unwrap_or_else(|e| e.into_inner());
        set_modules(modules_named(&["profile".into(), "trace".into(), "null".into()]).unwrap());
        let work = activity("two modules work").unwrap();
        let step = activity("two modules step").unwrap();
        // On a thread of its own, so no other test's events mix in.
        std::thread::spawn(move || {
            for _ in 0..100 {
                work.begin();
                for _ in 0..3 {
                    step.begin();
                    send(1, 64);
                    step.end();
                }
                idle_begin();
                idle_end();
                work.end();
            }
        })
        .join()
        .unwrap();
        let mut records = Vec::new();
        let lost = trace::take(true, &mut records);
        set_modules(PROFILE_BIT);
        assert_eq!(lost, 0);
        let mut all = measure::Totals::default();
        registry().totals(&mut all);
        let traced = |kind: canopy_wire::v1::TraceKind, a: u32| {
            records
                .iter()
                .filter(|(_, r)| r.kind == kind as u8 && r.a == a)
                .count() as u64
        };
        use canopy_wire::v1::TraceKind::{Begin, End, Send};
        for a in [work, step] {
            let calls = all.timers[a.0 as usize].calls;
            assert_eq!(calls, if a == work { 100 } else { 300 });
            assert_eq!((traced(Begin, a.0), traced(End, a.0)), (calls, calls));
        }
        let sends = records
            .iter()
            .filter(|(_, r)| r.kind == Send as u8 && r.a == 1 && r.bytes == 64)
            .count();
        assert_eq!(sends, 300);
        // The trace of one thread is in time order, and its sends sit inside their step.
        let thread = records.iter().find(|(_, r)| r.a == work.0).unwrap().0;
        let mine: Vec<_> = records.iter().filter(|(t, _)| *t == thread).collect();
        assert!(mine.windows(2).all(|w| w[0].1.at_ns <= w[1].1.at_ns));
    }
}
