//! The utilization module (seed 000): the share of every 1 ms bin of wall time the rank spends in each
//! activity. On the application thread an activity switch (begin, end, idle begin, idle end) is one record
//! pushed into the thread's ring (CANOPY_UTILIZATION_EVENTS per thread, 65,536 by default): no binning there.
//! At the end of each period, on the SDK's period thread, [`Binner`] replays every thread's switches, credits
//! each stretch of time to the activity running innermost on that thread, and compresses the period into the
//! sparse `Utilization` the rank ships with its profile, records below the threshold (CANOPY_UTILIZATION_THRESHOLD
//! percent, 10 by default) folded into "other". With this module in force the rank's rounds are time rounds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use canopy_wire::utilization::{BIN_US, Bins};
use canopy_wire::v1::Utilization;

use crate::events::{Module, kind};
use crate::measure::registry;
use crate::rings::{self, Local, Record, Rings};

/// Switches a thread's ring holds unless CANOPY_UTILIZATION_EVENTS says otherwise: a second of activities at
/// 30 kHz.
pub const DEFAULT_EVENTS: usize = 1 << 16;
/// The most CANOPY_UTILIZATION_EVENTS may ask for.
pub const MAX_EVENTS: usize = 1 << 22;

static RINGS: Rings = Rings::new(DEFAULT_EVENTS);

thread_local! {
    static LOCAL: Local = RINGS.local();
}

/// Sets the size of the rings threads make from now on.
pub(crate) fn set_capacity(events: usize) {
    RINGS.set_capacity(events.clamp(1, MAX_EVENTS));
}

const BEGIN: u8 = 1;
const END: u8 = 2;
const IDLE_BEGIN: u8 = 3;
const IDLE_END: u8 = 4;
/// The stack entry of idle time (activities are timer indices).
const IDLE: u32 = u32::MAX;

#[inline]
fn record(now: Instant, kind: u8, a: u32) {
    let r = Record {
        at_ns: rings::since_base(now),
        kind,
        a,
        bytes: 0,
    };
    let _ = LOCAL.try_with(|l| l.push(r));
}

/// The utilization module.
pub(crate) struct UtilizationModule;

impl Module for UtilizationModule {
    fn name(&self) -> &'static str {
        "utilization"
    }

    fn wants(&self) -> u32 {
        kind::BEGIN | kind::END | kind::IDLE_BEGIN | kind::IDLE_END
    }

    #[inline]
    fn begin(&self, activity: u32, now: Instant) {
        record(now, BEGIN, activity);
    }

    #[inline]
    fn end(&self, activity: u32, now: Instant) {
        record(now, END, activity);
    }

    fn idle_begin(&self, now: Instant) {
        record(now, IDLE_BEGIN, IDLE);
    }

    fn idle_end(&self, now: Instant) {
        record(now, IDLE_END, IDLE);
    }

    fn enabled(&self) {
        // Switches from before the module was last off would replay stacks that no longer hold.
        RINGS.take(false, 0, &mut Vec::new());
        EPOCH.fetch_add(1, Ordering::AcqRel);
    }
}

/// How many times the module was switched on: the replay's stacks are of one switch-on.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// One thread as the replay left it.
#[derive(Debug, Default)]
struct Thread {
    stack: Vec<u32>,
    /// Wall time (Unix ns) up to which its time has been credited.
    credited: u64,
}

/// Turns the threads' switches into one period's profile; kept between periods.
#[derive(Debug, Default)]
pub(crate) struct Binner {
    bins: Bins,
    threads: HashMap<u32, Thread>,
    /// Switches after the end of the last period, replayed in the next.
    pending: Vec<(u32, Record)>,
    drained: Vec<(u32, Record)>,
    /// Event id of each timer index, as far as known.
    ids: Vec<u64>,
    idle: u64,
    /// The switch-on of the module the threads' stacks belong to.
    epoch: u64,
}

impl Binner {
    fn id(&mut self, activity: u32) -> u64 {
        if activity == IDLE {
            if self.idle == 0 {
                self.idle = canopy_wire::event_id("Idle");
            }
            return self.idle;
        }
        if activity as usize >= self.ids.len() {
            let (timers, _) = registry().names_since(self.ids.len(), usize::MAX);
            self.ids.extend(timers.into_iter().map(|(id, _)| id));
        }
        self.ids.get(activity as usize).copied().unwrap_or(0)
    }

    /// The profile of the period from `from` to `to` (Unix ns) in bins of 1 ms: every switch recorded until now
    /// is replayed; those after `to` wait for the next period.
    pub(crate) fn period(&mut self, from: u64, to: u64, threshold: u32, out: &mut Utilization) {
        let bin_ns = u64::from(BIN_US) * 1000;
        let bins = to.saturating_sub(from).div_ceil(bin_ns) as usize;
        self.bins.reset(from, bin_ns, bins);
        let epoch = EPOCH.load(Ordering::Acquire);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.pending.clear();
            self.threads.clear();
        }
        self.drained.clear();
        let lost = RINGS.take(true, usize::MAX, &mut self.drained);
        // Earlier switches first, each thread's in the order it recorded them.
        let mut all = std::mem::take(&mut self.pending);
        all.append(&mut self.drained);
        all.sort_by_key(|(thread, _)| *thread);
        let mut active = 0u32;
        let mut at = 0;
        while at < all.len() {
            let thread = all[at].0;
            let run = all[at..].iter().take_while(|(t, _)| *t == thread).count();
            let mut st = self.threads.remove(&thread).unwrap_or_default();
            let mut busy = !st.stack.is_empty();
            for &(_, r) in &all[at..at + run] {
                let t = rings::unix_ns(r.at_ns);
                if t >= to {
                    self.pending.push((thread, r));
                    continue;
                }
                busy = true;
                self.credit(&mut st, t);
                match (r.kind, st.stack.last()) {
                    (BEGIN | IDLE_BEGIN, _) => st.stack.push(r.a),
                    // An end that is not of the activity begun last is ignored, as the profile module does.
                    (END | IDLE_END, Some(top)) if *top == r.a => {
                        st.stack.pop();
                    }
                    _ => {}
                }
            }
            self.credit(&mut st, to);
            active += u32::from(busy);
            self.threads.insert(thread, st);
            at += run;
        }
        // Threads with nothing recorded this period: their innermost activity ran on all along.
        let mut idle_threads = Vec::new();
        for (&thread, st) in &self.threads {
            if st.credited < to && !st.stack.is_empty() {
                idle_threads.push(thread);
            }
        }
        for thread in idle_threads {
            if let Some(mut st) = self.threads.remove(&thread) {
                self.credit(&mut st, to);
                active += 1;
                self.threads.insert(thread, st);
            }
        }
        // Threads that ended with nothing running are not remembered.
        self.threads.retain(|_, st| !st.stack.is_empty());
        self.bins.compress(active.max(1), threshold, lost, out);
    }

    /// Credits a thread's time up to `t` to its innermost activity.
    fn credit(&mut self, st: &mut Thread, t: u64) {
        if let Some(&top) = st.stack.last()
            && t > st.credited
        {
            let id = self.id(top);
            self.bins.add(st.credited, t, id);
        }
        st.credited = st.credited.max(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_wire::utilization::{check, records};

    #[test]
    fn switches_replay_into_bins_with_the_innermost_activity_holding_the_time() {
        let mut b = Binner::default();
        let outer = registry().timer("utilization test outer").unwrap().index();
        let inner = registry().timer("utilization test inner").unwrap().index();
        let (outer_id, inner_id) = (b.id(outer), b.id(inner));
        let base = rings::unix_ns(0);
        let rec = |ms: f64, kind, a| {
            (
                9,
                Record {
                    at_ns: (ms * 1e6) as u64,
                    kind,
                    a,
                    bytes: 0,
                },
            )
        };
        // Outer from 0 to 3 ms, inner from 1 to 1.5 ms, idle from 3 ms to past the period.
        b.pending = vec![
            rec(0.0, BEGIN, outer),
            rec(1.0, BEGIN, inner),
            rec(1.5, END, inner),
            rec(3.0, END, outer),
            rec(3.0, IDLE_BEGIN, IDLE),
            rec(6.0, IDLE_END, IDLE),
        ];
        let mut u = Utilization::default();
        b.period(base, base + 4_000_000, 0, &mut u);
        check(&u).unwrap();
        let idle = canopy_wire::event_id("Idle");
        let mut got: Vec<_> = records(&u).collect();
        got.sort();
        let mut want = vec![
            (0, outer_id, 250),
            (1, outer_id, 125),
            (1, inner_id, 125),
            (2, outer_id, 250),
            (3, idle, 250),
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(
            b.pending.len(),
            1,
            "the idle end past the period waits for the next"
        );
        // The next period: idle until 6 ms, then nothing.
        b.period(base + 4_000_000, base + 8_000_000, 0, &mut u);
        let got: Vec<_> = records(&u).collect();
        assert_eq!(got, vec![(0, idle, 250), (1, idle, 250)]);
        assert!(
            b.threads.is_empty(),
            "a thread with nothing running is not remembered"
        );
    }
}
