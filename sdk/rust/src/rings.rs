//! Per-thread bounded rings of events, each made on its thread's first event: the trace module and the
//! utilization module each keep a set. A ring's own thread pushes; only a drain takes its lock besides, for the
//! time of a copy. Events a full ring overwrote are counted.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// One recorded event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// Nanoseconds since the rings' clock base ([`unix_ns`] turns it into wall time).
    pub at_ns: u64,
    pub kind: u8,
    /// The activity's index (begin, end) or the destination rank (send).
    pub a: u32,
    /// Bytes sent.
    pub bytes: u64,
}

/// A thread's ring.
#[derive(Debug)]
pub(crate) struct Ring {
    records: Box<[Record]>,
    /// Where the next record goes.
    next: usize,
    len: usize,
    /// Records overwritten since the ring was last emptied.
    lost: u64,
    thread: u32,
}

impl Ring {
    fn new(capacity: usize, thread: u32) -> Ring {
        Ring {
            records: vec![Record::default(); capacity.max(1)].into_boxed_slice(),
            next: 0,
            len: 0,
            lost: 0,
            thread,
        }
    }

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

    /// Moves the records out, oldest first, while `out` holds fewer than `max`; returns the records lost
    /// (overwritten before, or left out now).
    fn drain_into(&mut self, out: &mut Vec<(u32, Record)>, max: usize) -> u64 {
        let cap = self.records.len();
        let first = (self.next + cap - self.len) % cap;
        let room = max.saturating_sub(out.len()).min(self.len);
        for k in 0..room {
            out.push((self.thread, self.records[(first + k) % cap]));
        }
        let left_out = (self.len - room) as u64;
        self.len = 0;
        std::mem::take(&mut self.lost) + left_out
    }
}

/// The clock every ring's records are timed on: a monotonic base and the wall time it stands for.
struct Base {
    at: Instant,
    unix_ns: u64,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| Base {
        at: Instant::now(),
        unix_ns: crate::unix_ns(),
    })
}

/// A time of the monotonic clock as nanoseconds since the rings' base.
#[inline]
pub(crate) fn since_base(now: Instant) -> u64 {
    now.saturating_duration_since(base().at).as_nanos() as u64
}

/// A record's time as nanoseconds since the Unix epoch.
pub(crate) fn unix_ns(at_ns: u64) -> u64 {
    base().unix_ns.saturating_add(at_ns)
}

/// The wall time of now, on the rings' clock (monotonic from the base on).
pub(crate) fn now_unix_ns() -> u64 {
    unix_ns(since_base(Instant::now()))
}

/// One module's set of rings.
pub(crate) struct Rings {
    all: Mutex<Vec<Arc<Mutex<Ring>>>>,
    threads: AtomicU32,
    capacity: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Rings {
    pub(crate) const fn new(capacity: usize) -> Rings {
        Rings {
            all: Mutex::new(Vec::new()),
            threads: AtomicU32::new(0),
            capacity: AtomicUsize::new(capacity),
        }
    }

    /// Sets the size of the rings threads make from now on.
    pub(crate) fn set_capacity(&self, events: usize) {
        self.capacity.store(events.max(1), Ordering::Release);
    }

    /// A new thread's ring, numbered in the order threads first recorded.
    pub(crate) fn local(&'static self) -> Local {
        let cap = self.capacity.load(Ordering::Acquire);
        let ring = Arc::new(Mutex::new(Ring::new(
            cap,
            self.threads.fetch_add(1, Ordering::Relaxed),
        )));
        lock(&self.all).push(ring.clone());
        Local { ring }
    }

    /// Empties every thread's ring: into `out` (thread, record), oldest first per thread, up to `max` records in
    /// all, when `keep`; returns the records overwritten since the last take, plus those left out now.
    pub(crate) fn take(&self, keep: bool, max: usize, out: &mut Vec<(u32, Record)>) -> u64 {
        let all = lock(&self.all);
        let mut lost = 0;
        for ring in all.iter() {
            let mut r = lock(ring);
            if keep {
                lost += r.drain_into(out, max);
            } else {
                r.len = 0;
                r.lost = 0;
            }
        }
        drop(all);
        // Rings of threads that ended and are now empty leave the list.
        lock(&self.all).retain(|r| Arc::strong_count(r) > 1 || lock(r).len > 0);
        lost
    }
}

/// A thread's handle on its ring (in a `thread_local!`). A thread that ends leaves its ring in the set until a
/// drain has taken its records.
pub(crate) struct Local {
    ring: Arc<Mutex<Ring>>,
}

impl Local {
    #[inline]
    pub(crate) fn push(&self, r: Record) {
        lock(&self.ring).push(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_keeps_the_newest_records_and_counts_the_rest() {
        let mut ring = Ring::new(4, 7);
        for i in 0..6 {
            ring.push(Record {
                at_ns: i,
                ..Record::default()
            });
        }
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out, usize::MAX), 2);
        let times: Vec<u64> = out.iter().map(|(_, r)| r.at_ns).collect();
        assert_eq!(times, [2, 3, 4, 5]);
        assert!(out.iter().all(|(t, _)| *t == 7));
        out.clear();
        assert_eq!(ring.drain_into(&mut out, usize::MAX), 0);
        assert!(out.is_empty());
        // A drain that is full already takes no more: the ring's records count as lost.
        ring.push(Record::default());
        let mut full = vec![(0, Record::default()); 10];
        assert_eq!(ring.drain_into(&mut full, 10), 1);
        assert_eq!(full.len(), 10);
    }
}
