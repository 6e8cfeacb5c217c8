//! One dump as the application thread copies it, for the background thread to encode and ship.

use std::sync::Arc;

use canopy_wire::v1::Utilization;

use crate::{measure, steps, trace};
use canopy_wire::options::Measure;

/// Why a dump carries no profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Profile,
    SampledOut,
    Stopped,
}

/// One dump, copied on the application thread and shipped by the background thread.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) round: u64,
    pub(crate) dump_unix_ns: u64,
    pub(crate) kind: Kind,
    /// (timer index, this round's share, totals since the start).
    pub(crate) timers: Vec<(u32, measure::TimerTotals, measure::TimerTotals)>,
    /// (counter index, this round's sum, total).
    pub(crate) counters: Vec<(u32, f64, f64)>,
    /// The per-event metrics reported (`Metric` numbers, as `RankProfile.event_metrics` lists them).
    pub(crate) event_metrics: Vec<u32>,
    /// For each entry of `timers`, in order: this round's value of each of `event_metrics`, then its total.
    pub(crate) metric_values: Vec<f64>,
    pub(crate) measure: Arc<Measure>,
    /// Which options `measure` is (they change at most once per dump).
    pub(crate) measure_gen: u64,
    /// (thread, event) of the trace since the previous dump, when this rank ships its trace.
    pub(crate) trace: Vec<(u32, trace::Record)>,
    /// Trace events recorded since the previous dump and not in `trace`.
    pub(crate) trace_lost: u64,
    /// The step marks since the previous dump, and those the bound left out.
    pub(crate) marks: Vec<steps::Mark>,
    pub(crate) marks_lost: u64,
    /// The utilization module's profile of the period, when `has_utilization`.
    pub(crate) utilization: Utilization,
    pub(crate) has_utilization: bool,
}

impl Snapshot {
    pub(crate) fn new() -> Snapshot {
        Snapshot {
            round: 0,
            dump_unix_ns: 0,
            kind: Kind::Profile,
            timers: Vec::with_capacity(128),
            counters: Vec::with_capacity(16),
            event_metrics: Vec::new(),
            metric_values: Vec::new(),
            measure: Arc::new(Measure::default()),
            measure_gen: 0,
            trace: Vec::new(),
            trace_lost: 0,
            marks: Vec::new(),
            marks_lost: 0,
            utilization: Utilization::default(),
            has_utilization: false,
        }
    }
}
