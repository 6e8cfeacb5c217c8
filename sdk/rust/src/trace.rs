//! The trace module: each thread keeps its last events in a bounded ring (CANOPY_TRACE_EVENTS per thread,
//! 16,384 by default), made on the thread's first event. At each dump the rings are emptied: into the profile
//! when options name this rank in `trace_ranks`, else away, so a rank asked for detail ships the events since
//! its previous dump and no more. Events that a full ring overwrote are counted (`RankProfile.trace_lost`).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use canopy_wire::v1::TraceKind;

use crate::events::{Module, kind};

/// Events a thread's ring holds unless CANOPY_TRACE_EVENTS says otherwise.
pub const DEFAULT_EVENTS: usize = 16_384;
/// The most CANOPY_TRACE_EVENTS may ask for.
pub const MAX_EVENTS: usize = 1 << 22;

/// One recorded event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// Nanoseconds since `Clock::base`.
    pub at_ns: u64,
    pub kind: u8,
    /// The activity's index (begin, end) or the destination rank (send).
    pub a: u32,
    /// Bytes sent.
    pub bytes: u64,
}

/// A thread's ring.
#[derive(Debug)]
struct Ring {
    records: Box<[Record]>,
    /// Where the next record goes.
    next: usize,
    len: usize,
    /// Records overwritten since the ring was last emptied.
    lost: u64,
    thread: u32,
}

impl Ring {
    #[inline]
    fn push(&mut self, r: Record) {
        let cap = self.records.len();
        self.records[self.next] = r;
        self.next = (self.next + 1) % cap;
        if self.len == cap {
            self.lost += 1;
        } else {
            self.len += 1;
        }
    }

    /// Moves the records out, oldest first.
    fn drain_into(&mut self, out: &mut Vec<(u32, Record)>) -> u64 {
        let cap = self.records.len();
        let first = (self.next + cap - self.len) % cap;
        for k in 0..self.len {
            out.push((self.thread, self.records[(first + k) % cap]));
        }
        self.len = 0;
        std::mem::take(&mut self.lost)
    }
}

/// Every thread's ring, and the clock the records are timed on.
struct Rings {
    all: Mutex<Vec<Arc<Mutex<Ring>>>>,
    threads: AtomicU32,
    capacity: AtomicUsize,
    base: Instant,
    base_unix_ns: u64,
}

fn rings() -> &'static Rings {
    static RINGS: OnceLock<Rings> = OnceLock::new();
    RINGS.get_or_init(|| Rings {
        all: Mutex::new(Vec::new()),
        threads: AtomicU32::new(0),
        capacity: AtomicUsize::new(DEFAULT_EVENTS),
        base: Instant::now(),
        base_unix_ns: crate::unix_ns(),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the size of the rings threads make from now on.
pub(crate) fn set_capacity(events: usize) {
    rings()
        .capacity
        .store(events.clamp(1, MAX_EVENTS), Ordering::Release);
}

/// A thread's handle on its ring. A thread that ends leaves its ring in the list until a dump has taken its
/// records.
struct Local {
    ring: Arc<Mutex<Ring>>,
}

impl Local {
    fn new() -> Local {
        let rings = rings();
        let cap = rings.capacity.load(Ordering::Acquire);
        let ring = Arc::new(Mutex::new(Ring {
            records: vec![Record::default(); cap].into_boxed_slice(),
            next: 0,
            len: 0,
            lost: 0,
            thread: rings.threads.fetch_add(1, Ordering::Relaxed),
        }));
        lock(&rings.all).push(ring.clone());
        Local { ring }
    }
}

thread_local! {
    static LOCAL: Local = Local::new();
}

#[inline]
fn record(now: Instant, kind: TraceKind, a: u32, bytes: u64) {
    let at_ns = now.saturating_duration_since(rings().base).as_nanos() as u64;
    let r = Record {
        at_ns,
        kind: kind as u8,
        a,
        bytes,
    };
    // Only a dump takes the ring's lock besides its own thread, for the time of a copy.
    let _ = LOCAL.try_with(|l| lock(&l.ring).push(r));
}

/// The trace module.
pub(crate) struct Trace;

impl Module for Trace {
    fn name(&self) -> &'static str {
        "trace"
    }

    fn wants(&self) -> u32 {
        kind::BEGIN | kind::END | kind::SEND | kind::IDLE_BEGIN | kind::IDLE_END
    }

    #[inline]
    fn begin(&self, activity: u32, now: Instant) {
        record(now, TraceKind::Begin, activity, 0);
    }

    #[inline]
    fn end(&self, activity: u32, now: Instant) {
        record(now, TraceKind::End, activity, 0);
    }

    fn send(&self, dest: u32, bytes: u64, now: Instant) {
        record(now, TraceKind::Send, dest, bytes);
    }

    fn idle_begin(&self, now: Instant) {
        record(now, TraceKind::IdleBegin, 0, 0);
    }

    fn idle_end(&self, now: Instant) {
        record(now, TraceKind::IdleEnd, 0, 0);
    }
}

/// Empties every thread's ring: into `out` (thread, record), oldest first per thread, when `keep`; returns
/// the records overwritten since the last take, plus, when not kept, the records dropped now.
pub(crate) fn take(keep: bool, out: &mut Vec<(u32, Record)>) -> u64 {
    let rings = rings();
    let all = lock(&rings.all);
    let mut lost = 0;
    for ring in all.iter() {
        let mut r = lock(ring);
        if keep {
            lost += r.drain_into(out);
        } else {
            r.len = 0;
            r.lost = 0;
        }
    }
    drop(all);
    // Rings of threads that ended and are now empty leave the list.
    lock(&rings.all).retain(|r| Arc::strong_count(r) > 1 || lock(r).len > 0);
    lost
}

/// A record's time as nanoseconds since the Unix epoch.
pub(crate) fn unix_ns(r: &Record) -> u64 {
    rings().base_unix_ns.saturating_add(r.at_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_keeps_the_newest_records_and_counts_the_rest() {
        let mut ring = Ring {
            records: vec![Record::default(); 4].into_boxed_slice(),
            next: 0,
            len: 0,
            lost: 0,
            thread: 7,
        };
        for i in 0..6 {
            ring.push(Record {
                at_ns: i,
                ..Record::default()
            });
        }
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out), 2);
        let times: Vec<u64> = out.iter().map(|(_, r)| r.at_ns).collect();
        assert_eq!(times, [2, 3, 4, 5]);
        assert!(out.iter().all(|(t, _)| *t == 7));
        out.clear();
        assert_eq!(ring.drain_into(&mut out), 0);
        assert!(out.is_empty());
    }
}
