//! Which numbers a filter reduces: per event calls, inclusive and exclusive time, and per counter its value.

use canopy_filter_proto::v1::Metric;
use canopy_wire::event_metrics::{Side, of_metric};
use canopy_wire::v1::RankProfile;

/// Whether a profile that reports the metrics `mask` (`RankProfile.metrics`, 0: all) reports the per-event
/// metric numbered `metric`: a counter's inclusive values go with inclusive time, its exclusive ones with
/// exclusive time, values at entry always; a number that is no per-event metric never.
fn reports_event_metric(mask: u32, metric: u32) -> bool {
    let on = |bit: u32| mask == 0 || mask & (1 << bit) != 0;
    match of_metric(metric as i32) {
        Some((_, Side::Inclusive)) => on(1),
        Some((_, Side::Exclusive)) => on(2),
        Some((_, Side::AtEntry)) => true,
        None => false,
    }
}

/// What a statistic or histogram is about: the event's (or counter's) id and the metric (`Metric as i32`).
/// Ordered by id, then metric: the order of every repeated output.
pub type Key = (u64, i32);

/// Which of a profile's numbers to reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Values {
    /// This round's share: calls, incl_us, excl_us, a counter's value.
    #[default]
    Round,
    /// Since the rank started: calls_total, incl_total_us, excl_total_us, a counter's total.
    Cumulative,
}

impl Values {
    /// The name the `values` parameter uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Values::Round => "round",
            Values::Cumulative => "cumulative",
        }
    }
}

/// The samples one rank contributes: for each event it reports, `(id, CALLS, calls)`, `(id, INCLUSIVE, incl)`,
/// `(id, EXCLUSIVE, excl)`, then `(id, m, value)` for each per-event metric `m` the profile lists
/// (`event_metrics`, matched with the event's values by position); for each counter, `(counter_id, COUNTER,
/// value)`, in the profile's order.
///
/// A rank contributes only for the events and counters it reports, and only the metrics its profile says it
/// reports (`RankProfile.metrics`, when control narrowed them). A value that is not finite (NaN or infinite) is
/// left out: one would make the mean, the deviation and every histogram range meaningless.
pub fn extract(profile: &RankProfile, values: Values) -> Vec<(Key, f64)> {
    let mut out = Vec::with_capacity(profile.events.len() * 3 + profile.counters.len());
    let reports = |bit: u32| profile.metrics == 0 || profile.metrics & (1 << bit) != 0;
    for e in &profile.events {
        let (calls, incl, excl) = match values {
            Values::Round => (e.calls as f64, e.incl_us, e.excl_us),
            Values::Cumulative => (e.calls_total as f64, e.incl_total_us, e.excl_total_us),
        };
        if reports(0) {
            out.push(((e.event_id, Metric::Calls as i32), calls));
        }
        if reports(1) {
            out.push(((e.event_id, Metric::Inclusive as i32), incl));
        }
        if reports(2) {
            out.push(((e.event_id, Metric::Exclusive as i32), excl));
        }
        let values = match values {
            Values::Round => &e.metrics,
            Values::Cumulative => &e.metrics_total,
        };
        for (m, v) in profile.event_metrics.iter().zip(values) {
            if reports_event_metric(profile.metrics, *m) {
                out.push(((e.event_id, *m as i32), *v));
            }
        }
    }
    for c in profile.counters.iter().filter(|_| reports(3)) {
        let v = match values {
            Values::Round => c.value,
            Values::Cumulative => c.total,
        };
        out.push(((c.counter_id, Metric::Counter as i32), v));
    }
    out.retain(|(_, v)| v.is_finite());
    out
}

/// The values of one metric that a rank contributes, as `extract` gives them for that metric: `f(id, value)` for
/// each event the profile reports (each counter, for [`Metric::Counter`]), in the profile's order, unless the
/// profile says it does not report the metric or the value is not finite. [`Metric::Unspecified`] gives none.
pub fn each_value(profile: &RankProfile, values: Values, metric: Metric, mut f: impl FnMut(u64, f64)) {
    let bit = match metric {
        Metric::Unspecified => return,
        Metric::Calls => 0,
        Metric::Inclusive => 1,
        Metric::Exclusive => 2,
        Metric::Counter => 3,
        per_event => {
            let m = per_event as u32;
            let Some(k) = profile.event_metrics.iter().position(|x| *x == m) else {
                return;
            };
            if !reports_event_metric(profile.metrics, m) {
                return;
            }
            for e in &profile.events {
                let v = match values {
                    Values::Round => e.metrics.get(k),
                    Values::Cumulative => e.metrics_total.get(k),
                };
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    f(e.event_id, *v);
                }
            }
            return;
        }
    };
    if profile.metrics != 0 && profile.metrics & (1 << bit) == 0 {
        return;
    }
    let mut emit = |id: u64, v: f64| {
        if v.is_finite() {
            f(id, v)
        }
    };
    if metric == Metric::Counter {
        for c in &profile.counters {
            emit(
                c.counter_id,
                match values {
                    Values::Round => c.value,
                    Values::Cumulative => c.total,
                },
            );
        }
        return;
    }
    for e in &profile.events {
        let v = match (values, metric) {
            (Values::Round, Metric::Calls) => e.calls as f64,
            (Values::Round, Metric::Inclusive) => e.incl_us,
            (Values::Round, _) => e.excl_us,
            (Values::Cumulative, Metric::Calls) => e.calls_total as f64,
            (Values::Cumulative, Metric::Inclusive) => e.incl_total_us,
            (Values::Cumulative, _) => e.excl_total_us,
        };
        emit(e.event_id, v);
    }
}

/// Where [`extract_view`] sends each value. A type of its own rather than a closure, so that its `value` can be
/// marked `#[inline(always)]`: the fold behind it runs for every value of every rank, and a closure called from
/// the reader's several places was kept out of line.
pub trait Sink {
    /// Takes one sample: its key and its value, which is finite.
    fn value(&mut self, key: Key, v: f64);
}

/// As `extract`, for a profile read by `stream`: hands each sample to `f`, in the same order.
pub fn extract_view(
    p: &crate::stream::ProfileView<'_>,
    buffers: &crate::stream::Buffers,
    values: Values,
    f: &mut impl Sink,
) {
    let reports = |bit: u32| p.metrics == 0 || p.metrics & (1 << bit) != 0;
    let (calls_on, incl_on, excl_on, counters_on) = (reports(0), reports(1), reports(2), reports(3));
    let mut emit = |key: Key, v: f64| {
        if v.is_finite() {
            f.value(key, v)
        }
    };
    for e in &buffers.events[p.events.clone()] {
        let (calls, incl, excl) = match values {
            Values::Round => (e.calls as f64, e.incl_us, e.excl_us),
            Values::Cumulative => (e.calls_total as f64, e.incl_total_us, e.excl_total_us),
        };
        if calls_on {
            emit((e.id, Metric::Calls as i32), calls);
        }
        if incl_on {
            emit((e.id, Metric::Inclusive as i32), incl);
        }
        if excl_on {
            emit((e.id, Metric::Exclusive as i32), excl);
        }
        let ms = &buffers.event_metrics[p.event_metrics.clone()];
        for (m, v) in ms
            .iter()
            .zip(e.metric_values(buffers, values == Values::Cumulative))
        {
            if reports_event_metric(p.metrics, *m) {
                emit((e.id, *m as i32), *v);
            }
        }
    }
    if counters_on {
        for c in &buffers.counters[p.counters.clone()] {
            let v = match values {
                Values::Round => c.value,
                Values::Cumulative => c.total,
            };
            emit((c.id, Metric::Counter as i32), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_mask_keeps_only_the_metrics_reported() {
        use canopy_wire::v1::{CounterSample, EventSample};
        let p = RankProfile {
            events: vec![EventSample {
                event_id: 1,
                calls: 2,
                incl_us: 3.0,
                excl_us: 4.0,
                ..Default::default()
            }],
            counters: vec![CounterSample {
                counter_id: 9,
                value: 5.0,
                total: 5.0,
            }],
            metrics: 0b0100,
            ..Default::default()
        };
        assert_eq!(
            extract(&p, Values::Round),
            vec![((1, Metric::Exclusive as i32), 4.0)]
        );
        let all = RankProfile { metrics: 0, ..p };
        assert_eq!(extract(&all, Values::Round).len(), 4);
    }
    use canopy_wire::v1::{CounterSample, EventSample};

    fn profile() -> RankProfile {
        RankProfile {
            app: "a".into(),
            rank: 3,
            events: vec![EventSample {
                event_id: 7,
                calls: 2,
                incl_us: 5.0,
                excl_us: 4.0,
                calls_total: 20,
                incl_total_us: 50.0,
                excl_total_us: f64::NAN,
                ..Default::default()
            }],
            counters: vec![CounterSample {
                counter_id: 9,
                value: 1.5,
                total: 15.0,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn each_value_gives_extract_for_one_metric() {
        let masked = RankProfile {
            metrics: 0b0110,
            ..profile()
        };
        for p in [profile(), masked] {
            for values in [Values::Round, Values::Cumulative] {
                for metric in [
                    Metric::Calls,
                    Metric::Inclusive,
                    Metric::Exclusive,
                    Metric::Counter,
                ] {
                    let mut got = Vec::new();
                    each_value(&p, values, metric, |id, v| got.push(((id, metric as i32), v)));
                    let want: Vec<(Key, f64)> = extract(&p, values)
                        .into_iter()
                        .filter(|(k, _)| k.1 == metric as i32)
                        .collect();
                    assert_eq!(got, want, "{values:?} {metric:?} mask {:#b}", p.metrics);
                }
            }
        }
        let mut none = 0;
        each_value(&profile(), Values::Round, Metric::Unspecified, |_, _| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn round_values() {
        assert_eq!(
            extract(&profile(), Values::Round),
            vec![((7, 1), 2.0), ((7, 2), 5.0), ((7, 3), 4.0), ((9, 4), 1.5)]
        );
    }

    #[test]
    fn cumulative_values_leave_out_non_finite() {
        assert_eq!(
            extract(&profile(), Values::Cumulative),
            vec![((7, 1), 20.0), ((7, 2), 50.0), ((9, 4), 15.0)]
        );
    }
}
