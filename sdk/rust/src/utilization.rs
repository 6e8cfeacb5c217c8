//! The utilization module (seed 000): the share of every 1 ms bin of wall time the rank spends in each
//! activity. On the application thread an activity switch (begin, end, idle begin, idle end) is one record
//! pushed into the thread's ring (CANOPY_UTILIZATION_EVENTS per thread, 65,536 by default): no binning there.
//! At the end of each period, on the SDK's period thread, [`Binner`] replays every thread's switches, credits
//! each stretch of time to the activity running innermost on that thread, and compresses the period into the
//! sparse `Utilization` the rank ships with its profile, records below the threshold (CANOPY_UTILIZATION_THRESHOLD
//! percent, 10 by default) folded into "other". With this module in force the rank's rounds are time rounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use canopy_wire::utilization::{BIN_US, Replay, Switch};
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

/// Turns the threads' switches into one period's profile; kept between periods.
#[derive(Debug, Default)]
pub(crate) struct Binner {
    replay: Replay,
    drained: Vec<(u32, Record)>,
    switches: Vec<Switch>,
    /// Event id of each timer index, as far as known.
    ids: Vec<u64>,
    idle: u64,
    /// The switch-on of the module the replay's stacks belong to.
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
        let epoch = EPOCH.load(Ordering::Acquire);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.replay.clear();
        }
        self.drained.clear();
        let lost = RINGS.take(true, usize::MAX, &mut self.drained);
        let mut switches = std::mem::take(&mut self.switches);
        for i in 0..self.drained.len() {
            let (thread, r) = self.drained[i];
            switches.push(Switch {
                thread,
                at_unix_ns: rings::unix_ns(r.at_ns),
                begin: matches!(r.kind, BEGIN | IDLE_BEGIN),
                activity: self.id(r.a),
            });
        }
        let bin_ns = u64::from(BIN_US) * 1000;
        self.replay
            .period(from, to, bin_ns, &mut switches, threshold, lost, out);
        self.switches = switches;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_wire::utilization::{check, records};

    #[test]
    fn a_thread_switches_reach_the_period_profile_with_their_event_ids() {
        let _turn = crate::events::tests::SWITCHING
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let work = crate::activity("utilization test work").unwrap();
        // With the profile module too: tests on other threads time their work meanwhile.
        crate::events::set_modules(
            crate::events::modules_named(&["profile".into(), "utilization".into()]).unwrap(),
        );
        let mut b = Binner::default();
        let from = rings::now_unix_ns();
        std::thread::spawn(move || {
            work.begin();
            crate::sleep(std::time::Duration::from_millis(3));
            work.end();
            crate::idle_begin();
            crate::sleep(std::time::Duration::from_millis(2));
            crate::idle_end();
        })
        .join()
        .unwrap();
        let to = rings::now_unix_ns();
        let mut u = Utilization::default();
        b.period(from, to, 0, &mut u);
        crate::events::set_modules(1);
        check(&u).unwrap();
        let work_id = canopy_wire::event_id("utilization test work");
        let idle_id = canopy_wire::event_id("Idle");
        // Other tests' threads may run activities meanwhile, and the bins are shared among the threads: in
        // whole bins of one thread, 3 ms of work and 2 of idle are at least 2 and 1 (the edges are partial).
        let bins_of = |id| {
            records(&u)
                .filter(|&(_, a, _)| a == id)
                .map(|(_, _, s)| f64::from(s) * f64::from(u.threads) / 250.0)
                .sum::<f64>()
        };
        assert!(bins_of(work_id) >= 2.0, "{u:?}");
        assert!(bins_of(idle_id) >= 1.0, "{u:?}");
        assert!(u.threads >= 1);
    }
}
