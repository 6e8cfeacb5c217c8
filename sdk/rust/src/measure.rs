//! Where timers and counters keep their values: a process-wide registry of names and, per thread, a table of
//! accumulators that only its own thread writes and any dump reads.
//!
//! This is the profile module's state (see events.rs): begin and end touch only the calling thread's table
//! and stack: no lock, no allocation once the thread has used the timer, two clock reads. A dump sums every thread's table, so timers from several threads of one
//! rank add up into the rank's profile; the tables of threads that ended still count.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::perf;

/// Accumulators per table chunk, and chunks per table: up to 65,536 timers and as many counters.
const CHUNK: usize = 256;
const CHUNKS: usize = 256;
/// The most timers (and, apart, counters) a process can name.
pub const MAX_NAMES: usize = CHUNK * CHUNKS;
/// Nesting depth the stack of running timers holds without growing.
const STACK_DEPTH: usize = 256;

/// A named timer. Handles live as long as the process; the same name always gives the same handle.
#[derive(Debug)]
pub struct Timer {
    index: u32,
    id: u64,
    name: String,
}

impl Timer {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The timer's index: the id of the activity of the same name.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Starts the timer on the calling thread: the begin event of its activity.
    #[inline]
    pub fn start(&'static self) {
        crate::events::Activity(self.index).begin();
    }

    /// Stops the timer on the calling thread; it must be the one that started last and is still running
    /// there. Any other stop is ignored and counted (see `mismatched_stops`).
    #[inline]
    pub fn stop(&'static self) {
        crate::events::Activity(self.index).end();
    }

    /// Starts the timer and stops it when the guard is dropped.
    pub fn scope(&'static self) -> Scope {
        self.start();
        Scope { timer: self }
    }
}

/// Stops its timer when dropped.
#[derive(Debug)]
pub struct Scope {
    timer: &'static Timer,
}

impl Drop for Scope {
    fn drop(&mut self) {
        self.timer.stop();
    }
}

/// One timer's values in one thread. Only the owning thread writes (a load and a store, not a locked
/// read-modify-write); the inclusive time is stored before the exclusive one, with release order, so a reader
/// that loads the exclusive time first (acquire) never sees more exclusive than inclusive time.
#[derive(Debug, Default)]
struct TimerSlot {
    calls: AtomicU64,
    subrs: AtomicU64,
    incl_ns: AtomicU64,
    excl_ns: AtomicU64,
    /// Instances running on this thread: inclusive time counts once, for the outermost (recursion).
    active: AtomicU32,
    /// Exclusive time of inner recursive instances, added with the outermost one's inclusive time so a reader
    /// never sees more exclusive than inclusive time.
    pending_excl_ns: AtomicU64,
}

/// One timer's per-event metrics in one thread (see perf.rs): each perf counter's inclusive and exclusive
/// counts, as `TimerSlot` keeps time, and the values read at the latest entry.
#[derive(Debug, Default)]
struct MetricSlot {
    incl: [AtomicU64; perf::COUNTERS],
    excl: [AtomicU64; perf::COUNTERS],
    pending_excl: [AtomicU64; perf::COUNTERS],
    heap: AtomicU64,
    depth: AtomicU64,
}

/// A counter's sum in one thread (f64 bits).
#[derive(Debug, Default)]
struct CounterSlot {
    sum: AtomicU64,
}

/// A table that grows by whole chunks, so a slot never moves while a reader holds it.
#[derive(Debug)]
struct Table<T> {
    chunks: [OnceLock<Box<[T]>>; CHUNKS],
}

impl<T: Default> Table<T> {
    fn new() -> Self {
        Table {
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The slot, made on first use (one allocation per chunk, by the owning thread).
    #[inline]
    fn slot(&self, index: u32) -> &T {
        let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
        &self.chunks[c].get_or_init(|| (0..CHUNK).map(|_| T::default()).collect())[i]
    }

    /// The slot if its chunk exists (readers never allocate).
    #[inline]
    fn get(&self, index: u32) -> Option<&T> {
        let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
        self.chunks[c].get().map(|chunk| &chunk[i])
    }
}

/// One thread's accumulators.
#[derive(Debug)]
pub(crate) struct ThreadTable {
    timers: Table<TimerSlot>,
    counters: Table<CounterSlot>,
    /// Made only for the timers that run while per-event metrics are in force.
    metrics: Table<MetricSlot>,
}

/// A running timer on a thread's stack.
#[derive(Debug, Clone, Copy)]
struct Frame {
    timer: u32,
    started: Instant,
    /// Inclusive time of the timers that ran inside this one (their stop already counted it).
    children_ns: u64,
}

/// Where a running timer's perf counters started, and what the timers inside it counted.
#[derive(Debug, Clone, Copy)]
struct MetricFrame {
    /// The depth of the time stack with this timer on it: the frame of the timer at that depth.
    depth: usize,
    start: [u64; perf::COUNTERS],
    children: [u64; perf::COUNTERS],
}

/// A thread's per-event metrics: its counters, opened for one generation of the set in force, and the frames of
/// the timers running since.
#[derive(Debug, Default)]
struct Metrics {
    generation: u64,
    /// The metrics in force for this generation (bits over `event_metrics::ALL`).
    bits: u32,
    counters: perf::ThreadCounters,
    frames: Vec<MetricFrame>,
}

struct Local {
    table: Arc<ThreadTable>,
    metrics: RefCell<Metrics>,
    stack: RefCell<Vec<Frame>>,
    /// The profile module's switch-on the stack belongs to (see `events::PROFILE_EPOCH`).
    epoch: Cell<u64>,
    /// Counter name hash to index, so a counter update takes no lock once the thread has seen the name.
    counters: RefCell<HashMap<u64, u32, IdHash>>,
}

thread_local! {
    static LOCAL: Local = Local::new();
}

impl Drop for Local {
    /// A thread that ends folds its values into the registry's retired totals and leaves the list of tables,
    /// so threads that come and go cost neither memory nor dump time.
    fn drop(&mut self) {
        let reg = registry();
        let mut threads = lock(&reg.threads);
        let mut retired = lock(&reg.retired);
        let (timers, counters) = (
            reg.timer_count.load(Ordering::Acquire),
            reg.counter_count.load(Ordering::Acquire),
        );
        add_table(&self.table, timers, counters, &mut retired);
        threads.retain(|t| !Arc::ptr_eq(t, &self.table));
    }
}

/// Adds one thread's values into `out`, growing it to `timers` and `counters` entries.
fn add_table(t: &ThreadTable, timers: usize, counters: usize, out: &mut Totals) {
    if out.timers.len() < timers {
        out.timers.resize(timers, TimerTotals::default());
    }
    if out.counters.len() < counters {
        out.counters.resize(counters, 0.0);
    }
    for (i, total) in out.timers.iter_mut().enumerate().take(timers) {
        let Some(s) = t.timers.get(i as u32) else {
            continue;
        };
        // Exclusive first (acquire): the inclusive time it was stored after is then visible too.
        total.excl_ns += s.excl_ns.load(Ordering::Acquire);
        total.incl_ns += s.incl_ns.load(Ordering::Relaxed);
        total.calls += s.calls.load(Ordering::Relaxed);
        total.subrs += s.subrs.load(Ordering::Relaxed);
    }
    for (i, total) in out.counters.iter_mut().enumerate().take(counters) {
        if let Some(s) = t.counters.get(i as u32) {
            *total += f64::from_bits(s.sum.load(Ordering::Relaxed));
        }
    }
    if !out.metrics.is_empty() || t.metrics.chunks.iter().any(|c| c.get().is_some()) {
        if out.metrics.len() < timers {
            out.metrics.resize(timers, MetricTotals::default());
        }
        for (i, total) in out.metrics.iter_mut().enumerate().take(timers) {
            if let Some(s) = t.metrics.get(i as u32) {
                total.add(s);
            }
        }
    }
}

impl Local {
    fn new() -> Self {
        let table = Arc::new(ThreadTable {
            timers: Table::new(),
            counters: Table::new(),
            metrics: Table::new(),
        });
        registry()
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(table.clone());
        Local {
            table,
            metrics: RefCell::new(Metrics::default()),
            stack: RefCell::new(Vec::with_capacity(STACK_DEPTH)),
            epoch: Cell::new(0),
            counters: RefCell::new(HashMap::default()),
        }
    }

    /// Drops a stack begun before the profile module was last switched on: its ends were not seen.
    #[inline]
    fn resync(&self, epoch: u64) {
        if self.epoch.get() == epoch {
            return;
        }
        self.epoch.set(epoch);
        self.metrics.borrow_mut().frames.clear();
        for frame in self.stack.borrow_mut().drain(..) {
            let slot = self.table.timers.slot(frame.timer);
            let active = slot.active.load(Ordering::Relaxed).saturating_sub(1);
            slot.active.store(active, Ordering::Relaxed);
            if active == 0 {
                // Exclusive time of inner recursive calls that finished: keep it, so exclusive stays below
                // inclusive for the calls that were counted.
                let pending = slot.pending_excl_ns.swap(0, Ordering::Relaxed);
                add(&slot.incl_ns, pending, Ordering::Relaxed);
                add(&slot.excl_ns, pending, Ordering::Release);
            }
        }
    }

    #[inline]
    fn start(&self, timer: u32, now: Instant) {
        let slot = self.table.timers.slot(timer);
        slot.active
            .store(slot.active.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let mut stack = self.stack.borrow_mut();
        stack.push(Frame {
            timer,
            started: now,
            children_ns: 0,
        });
        if perf::wanted() != 0 {
            self.metrics_begin(timer, stack.len());
        }
    }

    /// At a timer's start: reads its thread's counters (opening them first for a new set) and the values read
    /// at entry.
    #[cold]
    fn metrics_begin(&self, timer: u32, depth: usize) {
        let mut m = self.metrics.borrow_mut();
        let generation = perf::generation();
        if m.generation != generation {
            let bits = perf::wanted();
            *m = Metrics {
                generation,
                bits,
                counters: perf::ThreadCounters::open(bits),
                frames: Vec::with_capacity(STACK_DEPTH),
            };
        }
        let mut start = [0; perf::COUNTERS];
        if !m.counters.read(&mut start) {
            return;
        }
        m.frames.push(MetricFrame {
            depth,
            start,
            children: [0; perf::COUNTERS],
        });
        if m.bits & (1 << perf::HEAP | 1 << perf::DEPTH) != 0 {
            let slot = self.table.metrics.slot(timer);
            if m.bits & 1 << perf::HEAP != 0 {
                slot.heap.store(perf::heap_bytes(), Ordering::Relaxed);
            }
            if m.bits & 1 << perf::DEPTH != 0 {
                slot.depth.store(depth as u64, Ordering::Relaxed);
            }
        }
    }

    /// At a timer's stop (`depth`: the time stack's depth with it still on): adds what its counters counted,
    /// inclusive once for the outermost of recursive calls (`outermost`) and exclusive of the timers inside.
    #[cold]
    fn metrics_end(&self, timer: u32, depth: usize, outermost: bool) {
        let mut m = self.metrics.borrow_mut();
        if m.generation != perf::generation() {
            // The set changed while the timer ran: its start values belong to counters since closed.
            m.frames.clear();
            return;
        }
        if m.frames.last().is_none_or(|f| f.depth != depth) {
            return;
        }
        let frame = m.frames.pop().expect("checked above");
        let mut now = [0; perf::COUNTERS];
        if !m.counters.read(&mut now) {
            return;
        }
        let slot = self.table.metrics.slot(timer);
        let mut incl = [0; perf::COUNTERS];
        for k in (0..perf::COUNTERS).filter(|k| m.bits & (1 << k) != 0) {
            incl[k] = now[k].wrapping_sub(frame.start[k]);
            let excl = incl[k].saturating_sub(frame.children[k]);
            if outermost {
                let pending = slot.pending_excl[k].swap(0, Ordering::Relaxed);
                add(&slot.incl[k], incl[k], Ordering::Relaxed);
                add(&slot.excl[k], excl + pending, Ordering::Release);
            } else {
                add(&slot.pending_excl[k], excl, Ordering::Relaxed);
            }
        }
        if let Some(parent) = m.frames.last_mut()
            && parent.depth + 1 == depth
        {
            for (c, i) in parent.children.iter_mut().zip(incl) {
                *c += i;
            }
        }
    }

    #[inline]
    fn stop(&self, timer: u32, now: Instant) {
        let mut stack = self.stack.borrow_mut();
        if stack.last().is_none_or(|f| f.timer != timer) {
            registry().mismatched.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let depth = stack.len();
        let frame = stack.pop().expect("checked above");
        let incl = now.saturating_duration_since(frame.started).as_nanos() as u64;
        let excl = incl.saturating_sub(frame.children_ns);
        let slot = self.table.timers.slot(timer);
        let active = slot.active.load(Ordering::Relaxed).saturating_sub(1);
        slot.active.store(active, Ordering::Relaxed);
        add(&slot.calls, 1, Ordering::Relaxed);
        if active == 0 {
            let pending = slot.pending_excl_ns.load(Ordering::Relaxed);
            slot.pending_excl_ns.store(0, Ordering::Relaxed);
            add(&slot.incl_ns, incl, Ordering::Relaxed);
            add(&slot.excl_ns, excl + pending, Ordering::Release);
        } else {
            add(&slot.pending_excl_ns, excl, Ordering::Relaxed);
        }
        if let Some(parent) = stack.last_mut() {
            parent.children_ns += incl;
            add(&self.table.timers.slot(parent.timer).subrs, 1, Ordering::Relaxed);
        }
        if perf::wanted() != 0 {
            self.metrics_end(timer, depth, active == 0);
        }
    }

    /// The index of the counter `name`, from the thread's own map once the thread has seen the name.
    fn counter_index(&self, name: &str) -> Result<u32, crate::Error> {
        let hash = crate::event_id(name);
        let known = self.counters.borrow().get(&hash).copied();
        match known {
            Some(i) => Ok(i),
            None => {
                let i = registry().counter_index(name)?;
                self.counters.borrow_mut().insert(hash, i);
                Ok(i)
            }
        }
    }

    #[inline]
    fn count(&self, index: u32, value: f64) {
        let slot = self.table.counters.slot(index);
        let sum = f64::from_bits(slot.sum.load(Ordering::Relaxed)) + value;
        slot.sum.store(sum.to_bits(), Ordering::Relaxed);
    }
}

/// The profile module's begin: pushes the activity on the calling thread's stack. A thread being torn down
/// has no table left: its activities are not counted.
#[inline]
pub(crate) fn start(timer: u32, now: Instant, epoch: u64) {
    let _ = LOCAL.try_with(|l| {
        l.resync(epoch);
        l.start(timer, now)
    });
}

/// The profile module's end.
#[inline]
pub(crate) fn stop(timer: u32, now: Instant, epoch: u64) {
    let _ = LOCAL.try_with(|l| {
        l.resync(epoch);
        l.stop(timer, now)
    });
}

/// The profile module's counter event.
#[inline]
pub(crate) fn count(counter: u32, value: f64) {
    let _ = LOCAL.try_with(|l| l.count(counter, value));
}

#[inline]
fn add(a: &AtomicU64, v: u64, order: Ordering) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(v), order);
}

/// Hashes a key that is already a hash.
#[derive(Default, Clone, Copy)]
struct IdHash(u64);

impl std::hash::Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHash;
    fn build_hasher(&self) -> IdHash {
        IdHash(0)
    }
}

/// The names of the process's timers and counters, and every thread's table.
pub(crate) struct Registry {
    timers_by_name: Mutex<HashMap<String, &'static Timer>>,
    timers: Mutex<Vec<&'static Timer>>,
    timer_count: AtomicUsize,
    counters_by_name: Mutex<HashMap<String, u32>>,
    counter_names: Mutex<Vec<String>>,
    counter_count: AtomicUsize,
    threads: Mutex<Vec<Arc<ThreadTable>>>,
    /// The values of the threads that ended.
    retired: Mutex<Totals>,
    mismatched: AtomicU64,
}

pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        timers_by_name: Mutex::new(HashMap::new()),
        timers: Mutex::new(Vec::new()),
        timer_count: AtomicUsize::new(0),
        counters_by_name: Mutex::new(HashMap::new()),
        counter_names: Mutex::new(Vec::new()),
        counter_count: AtomicUsize::new(0),
        threads: Mutex::new(Vec::new()),
        retired: Mutex::new(Totals::default()),
        mismatched: AtomicU64::new(0),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    pub(crate) fn timer(&self, name: &str) -> Result<&'static Timer, crate::Error> {
        let mut by_name = lock(&self.timers_by_name);
        if let Some(t) = by_name.get(name) {
            return Ok(t);
        }
        let mut timers = lock(&self.timers);
        if timers.len() >= MAX_NAMES {
            return Err(crate::Error::TooManyNames { kind: "timers" });
        }
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            index: timers.len() as u32,
            id: crate::event_id(name),
            name: name.to_string(),
        }));
        timers.push(timer);
        by_name.insert(name.to_string(), timer);
        self.timer_count.store(timers.len(), Ordering::Release);
        Ok(timer)
    }

    pub(crate) fn counter_index(&self, name: &str) -> Result<u32, crate::Error> {
        let mut by_name = lock(&self.counters_by_name);
        if let Some(i) = by_name.get(name) {
            return Ok(*i);
        }
        let mut names = lock(&self.counter_names);
        if names.len() >= MAX_NAMES {
            return Err(crate::Error::TooManyNames { kind: "counters" });
        }
        let i = names.len() as u32;
        names.push(name.to_string());
        by_name.insert(name.to_string(), i);
        self.counter_count.store(names.len(), Ordering::Release);
        Ok(i)
    }

    /// (id, name) of the timers from index `timers_from` on, and of the counters from `counters_from` on, in
    /// index order, read under one lock.
    pub(crate) fn names_since(&self, timers_from: usize, counters_from: usize) -> (Vec<IdName>, Vec<IdName>) {
        let timers = lock(&self.timers);
        let counters = lock(&self.counter_names);
        let t = timers
            .iter()
            .skip(timers_from)
            .map(|t| (t.id, t.name.clone()))
            .collect();
        let c = counters
            .iter()
            .skip(counters_from)
            .map(|n| (crate::event_id(n), n.clone()))
            .collect();
        (t, c)
    }

    /// Timers (activities) named so far.
    pub(crate) fn timer_count(&self) -> usize {
        self.timer_count.load(Ordering::Acquire)
    }

    /// Counters named so far.
    pub(crate) fn counter_count(&self) -> usize {
        self.counter_count.load(Ordering::Acquire)
    }

    pub(crate) fn mismatched_stops(&self) -> u64 {
        self.mismatched.load(Ordering::Relaxed)
    }

    /// Sums every thread's values into `out`, by index: timers, then counters.
    pub(crate) fn totals(&self, out: &mut Totals) {
        let timers = self.timer_count.load(Ordering::Acquire);
        let counters = self.counter_count.load(Ordering::Acquire);
        out.timers.clear();
        out.timers.resize(timers, TimerTotals::default());
        out.counters.clear();
        out.counters.resize(counters, 0.0);
        out.metrics.clear();
        let threads = lock(&self.threads);
        for t in threads.iter() {
            add_table(t, timers, counters, out);
        }
        let retired = lock(&self.retired);
        for (total, r) in out.timers.iter_mut().zip(&retired.timers) {
            total.calls += r.calls;
            total.subrs += r.subrs;
            total.incl_ns += r.incl_ns;
            total.excl_ns += r.excl_ns;
        }
        for (total, r) in out.counters.iter_mut().zip(&retired.counters) {
            *total += r;
        }
        if !retired.metrics.is_empty() && out.metrics.len() < timers {
            out.metrics.resize(timers, MetricTotals::default());
        }
        for (total, r) in out.metrics.iter_mut().zip(&retired.metrics) {
            total.merge(r);
        }
    }
}

/// An event's or counter's id and name.
pub(crate) type IdName = (u64, String);

/// One timer's values summed over the threads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TimerTotals {
    pub calls: u64,
    pub subrs: u64,
    pub incl_ns: u64,
    pub excl_ns: u64,
}

/// One timer's per-event metrics over the threads: perf counts summed, values at entry the largest of the
/// threads' latest.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MetricTotals {
    pub incl: [u64; perf::COUNTERS],
    pub excl: [u64; perf::COUNTERS],
    pub heap: u64,
    pub depth: u64,
}

impl MetricTotals {
    fn add(&mut self, s: &MetricSlot) {
        for k in 0..perf::COUNTERS {
            // Exclusive first (acquire), as for time.
            self.excl[k] += s.excl[k].load(Ordering::Acquire);
            self.incl[k] += s.incl[k].load(Ordering::Relaxed);
        }
        self.heap = self.heap.max(s.heap.load(Ordering::Relaxed));
        self.depth = self.depth.max(s.depth.load(Ordering::Relaxed));
    }

    fn merge(&mut self, o: &MetricTotals) {
        for k in 0..perf::COUNTERS {
            self.incl[k] += o.incl[k];
            self.excl[k] += o.excl[k];
        }
        self.heap = self.heap.max(o.heap);
        self.depth = self.depth.max(o.depth);
    }

    /// The value of the per-event metric numbered `metric` (a `Metric` number of `event_metrics`).
    pub fn value(&self, metric: u32) -> f64 {
        use canopy_wire::event_metrics::{Side, of_metric};
        match of_metric(metric as i32) {
            Some((k, Side::Inclusive)) if k < perf::COUNTERS => self.incl[k] as f64,
            Some((k, Side::Exclusive)) if k < perf::COUNTERS => self.excl[k] as f64,
            Some((perf::HEAP, _)) => self.heap as f64,
            Some((perf::DEPTH, _)) => self.depth as f64,
            _ => 0.0,
        }
    }
}

/// Every timer's and counter's values summed over the threads, by index.
#[derive(Debug, Clone, Default)]
pub(crate) struct Totals {
    pub timers: Vec<TimerTotals>,
    pub counters: Vec<f64>,
    /// Per timer, its per-event metrics; empty while no thread has measured any.
    pub metrics: Vec<MetricTotals>,
}

/// Adds `value` to the counter `name` on the calling thread: the counter event, by the name's index.
pub(crate) fn counter(name: &str, value: f64) -> Result<(), crate::Error> {
    match LOCAL.try_with(|l| l.counter_index(name)) {
        Ok(index) => {
            crate::events::Counter(index?).add(value);
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
