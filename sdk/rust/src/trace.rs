//! The trace module: each thread keeps its last events in a bounded ring (CANOPY_TRACE_EVENTS per thread,
//! 16,384 by default), made on the thread's first event. At each dump the rings are emptied: into the profile
//! when options name this rank in `trace_ranks`, else away, so a rank asked for detail ships the events since
//! its previous dump and no more. Events that a full ring overwrote are counted (`RankProfile.trace_lost`).

use std::time::Instant;

use canopy_wire::v1::TraceKind;

use crate::events::{Module, kind};
pub(crate) use crate::rings::Record;
use crate::rings::{Local, Rings};

/// Events a thread's ring holds unless CANOPY_TRACE_EVENTS says otherwise.
pub const DEFAULT_EVENTS: usize = 16_384;
/// The most CANOPY_TRACE_EVENTS may ask for.
pub const MAX_EVENTS: usize = 1 << 22;
/// The most trace events one dump ships (about 7 MB encoded, well inside a frame); the rest are counted as lost.
pub const MAX_PER_DUMP: usize = 1 << 18;

static RINGS: Rings = Rings::new(DEFAULT_EVENTS);

/// Sets the size of the rings threads make from now on.
pub(crate) fn set_capacity(events: usize) {
    RINGS.set_capacity(events.clamp(1, MAX_EVENTS));
}

thread_local! {
    static LOCAL: Local = RINGS.local();
}

#[inline]
fn record(now: Instant, kind: TraceKind, a: u32, bytes: u64) {
    let r = Record {
        at_ns: crate::rings::since_base(now),
        kind: kind as u8,
        a,
        bytes,
    };
    let _ = LOCAL.try_with(|l| l.push(r));
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

/// Empties every thread's ring: into `out` (thread, record), oldest first per thread, when `keep` (at most
/// `MAX_PER_DUMP`); returns the records overwritten since the last take, plus, when not kept, the records dropped
/// now.
pub(crate) fn take(keep: bool, out: &mut Vec<(u32, Record)>) -> u64 {
    RINGS.take(keep, MAX_PER_DUMP, out)
}

/// A record's time as nanoseconds since the Unix epoch.
pub(crate) fn unix_ns(r: &Record) -> u64 {
    crate::rings::unix_ns(r.at_ns)
}
