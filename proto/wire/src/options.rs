//! Measurement options (events to include or exclude, a metric subset, rank sampling): checked where they
//! enter the tree and applied to each rank's profile at its next dump.

/// The longest dump period options may set.
pub const MAX_PERIOD_MS: u64 = 3_600_000;

/// The measurement options a leaf applies to its ranks' profiles at each dump.
#[derive(Debug, Default)]
pub struct Measure {
    include: Vec<regex_lite::Regex>,
    exclude: Vec<regex_lite::Regex>,
    /// Bits as in `RankProfile.metrics`; 0: all.
    metrics: u32,
    sample_below: u32,
    /// The measurement modules named by the options (empty: each rank's own choice).
    modules: Vec<String>,
    /// The ranks that ship their trace (none when the options name none).
    trace_ranks: Option<crate::ranks::RankSet>,
    /// The per-event metrics the options name, as bits over `event_metrics::ALL` (`None`: each rank's own
    /// choice).
    counters: Option<u32>,
}

/// The measurement modules a rank can run, by the names options and CANOPY_MODULES give them.
pub const MODULES: [&str; 4] = ["profile", "trace", "utilization", "null"];

/// The metrics a rank reports of each event, as bits of `RankProfile.metrics` (0: all of them).
pub mod metric {
    /// Calls and subroutine calls, for the round and in total.
    pub const CALLS: u32 = 1;
    /// Inclusive time.
    pub const INCLUSIVE: u32 = 2;
    /// Exclusive time.
    pub const EXCLUSIVE: u32 = 4;
    /// The counters.
    pub const COUNTERS: u32 = 8;
    /// Every metric by the name users give it.
    pub const NAMES: [(&str, u32); 4] = [
        ("calls", CALLS),
        ("inclusive", INCLUSIVE),
        ("exclusive", EXCLUSIVE),
        ("counters", COUNTERS),
    ];

    /// The bit of a metric named by a user.
    pub fn bit(name: &str) -> Option<u32> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
    }

    /// Whether a profile that reports `metrics` has metric `bit` (0 reports all).
    pub fn reports(metrics: u32, bit: u32) -> bool {
        metrics == 0 || metrics & bit != 0
    }
}

/// Why measurement options cannot be used; the message names the bad pattern, metric or period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    Pattern {
        pattern: String,
        reason: String,
    },
    Metric(String),
    Period(u64),
    Module(String),
    TraceRanks(crate::ranks::RankSetError),
    /// An unknown per-event metric, with the message that names it.
    Counter(String),
}

impl std::fmt::Display for OptionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionsError::Pattern { pattern, reason } => write!(f, "bad pattern {pattern:?}: {reason}"),
            OptionsError::Metric(m) => {
                write!(f, "unknown metric {m:?} (calls, inclusive, exclusive, counters)")
            }
            OptionsError::Period(p) => {
                write!(f, "period_ms {p} is over the limit of {MAX_PERIOD_MS} (one hour)")
            }
            OptionsError::Module(m) => {
                write!(f, "unknown measurement module {m:?} ({})", MODULES.join(", "))
            }
            OptionsError::TraceRanks(e) => write!(f, "trace_ranks: {e}"),
            OptionsError::Counter(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for OptionsError {}

impl Measure {
    /// Checks and compiles options; the error names the bad pattern or metric.
    pub fn from_options(o: &crate::v1::Options) -> Result<Measure, OptionsError> {
        let compile = |p: &String| {
            regex_lite::Regex::new(p).map_err(|e| OptionsError::Pattern {
                pattern: p.clone(),
                reason: e.to_string(),
            })
        };
        let mut metrics = 0;
        for m in &o.metrics {
            metrics |= metric::bit(m).ok_or_else(|| OptionsError::Metric(m.clone()))?;
        }
        if o.period_ms != 0 && !(1..=MAX_PERIOD_MS).contains(&o.period_ms) {
            return Err(OptionsError::Period(o.period_ms));
        }
        if let Some(m) = o.modules.iter().find(|m| !MODULES.contains(&m.as_str())) {
            return Err(OptionsError::Module(m.clone()));
        }
        let trace_ranks = if o.trace_ranks.trim().is_empty() {
            None
        } else {
            Some(crate::ranks::RankSet::parse(&o.trace_ranks).map_err(OptionsError::TraceRanks)?)
        };
        let counters = if o.counters.iter().all(|c| c.trim().is_empty()) {
            None
        } else {
            Some(crate::event_metrics::parse(&o.counters).map_err(OptionsError::Counter)?)
        };
        Ok(Measure {
            counters,
            include: o.include.iter().map(compile).collect::<Result<_, _>>()?,
            exclude: o.exclude.iter().map(compile).collect::<Result<_, _>>()?,
            metrics,
            sample_below: o.sample_below,
            modules: o.modules.clone(),
            trace_ranks,
        })
    }

    /// The measurement modules the options name (empty: each rank keeps its own choice).
    pub fn modules(&self) -> &[String] {
        &self.modules
    }

    /// The per-event metrics the options name, as bits over `event_metrics::ALL` (`None`: each rank keeps its
    /// own choice).
    pub fn counters(&self) -> Option<u32> {
        self.counters
    }

    /// Whether this rank ships its event trace.
    pub fn traces(&self, rank: u32) -> bool {
        self.trace_ranks.as_ref().is_some_and(|s| s.contains(rank))
    }

    /// Whether the options report the event (or counter) of this name.
    pub fn reports(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|r| r.is_match(name)))
            && !self.exclude.iter().any(|r| r.is_match(name))
    }

    /// Whether the options leave out any event or counter by its name (include or exclude patterns).
    pub fn selects_names(&self) -> bool {
        !self.include.is_empty() || !self.exclude.is_empty()
    }

    /// The metrics reported, as bits of `RankProfile.metrics` (0: all).
    pub fn metrics(&self) -> u32 {
        self.metrics
    }

    /// Whether rank sampling leaves this rank out.
    pub fn samples_out(&self, rank: u32) -> bool {
        self.sample_below > 0 && rank >= self.sample_below
    }

    /// One rank's profile as the options say it is reported.
    pub fn apply(
        &self,
        mut p: crate::v1::RankProfile,
        names: &std::collections::HashMap<u64, String>,
    ) -> crate::v1::RankProfile {
        if self.selects_names() {
            let reported = |id: &u64| self.reports(names.get(id).map(String::as_str).unwrap_or(""));
            p.events.retain(|e| reported(&e.event_id));
            p.counters.retain(|c| reported(&c.counter_id));
        }
        p.metrics = self.metrics;
        if self.metrics != 0 && self.metrics & 8 == 0 {
            p.counters.clear();
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{CounterSample, EventSample, Options, RankProfile};

    #[test]
    fn options_filter_events_and_mark_metrics() {
        let names: std::collections::HashMap<u64, String> = [
            (1, "MPI_Send".to_string()),
            (2, "MPI_Barrier".to_string()),
            (3, "hydro".to_string()),
        ]
        .into();
        let o = Options {
            include: vec!["^MPI_".into()],
            exclude: vec!["Barrier".into()],
            metrics: vec!["exclusive".into()],
            ..Default::default()
        };
        let m = Measure::from_options(&o).unwrap();
        let p = RankProfile {
            events: (1..=3)
                .map(|id| EventSample {
                    event_id: id,
                    ..Default::default()
                })
                .collect(),
            counters: vec![CounterSample::default()],
            ..Default::default()
        };
        let p = m.apply(p, &names);
        assert_eq!(p.events.iter().map(|e| e.event_id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(p.metrics, 4);
        assert!(p.counters.is_empty());
    }

    #[test]
    fn counters_name_per_event_metrics_and_an_unknown_one_is_refused_by_name() {
        let with = |names: &[&str]| {
            Measure::from_options(&Options {
                counters: names.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            })
        };
        assert_eq!(with(&[]).unwrap().counters(), None);
        assert_eq!(
            with(&["page-faults", "depth"]).unwrap().counters(),
            Some(0b10_0000_0000_0010)
        );
        let e = with(&["page-fault"]).unwrap_err().to_string();
        assert!(
            e.starts_with("unknown counter \"page-fault\" (did you mean \"page-faults\"?"),
            "{e}"
        );
    }

    #[test]
    fn bad_options_name_what_is_wrong() {
        let bad = Options {
            include: vec!["(".into()],
            ..Default::default()
        };
        assert!(
            Measure::from_options(&bad)
                .unwrap_err()
                .to_string()
                .starts_with("bad pattern \"(\"")
        );
        let bad = Options {
            metrics: vec!["speed".into()],
            ..Default::default()
        };
        assert_eq!(
            Measure::from_options(&bad).unwrap_err().to_string(),
            "unknown metric \"speed\" (calls, inclusive, exclusive, counters)"
        );
        let bad = Options {
            modules: vec!["profile".into(), "tracer".into()],
            ..Default::default()
        };
        assert_eq!(
            Measure::from_options(&bad).unwrap_err().to_string(),
            "unknown measurement module \"tracer\" (profile, trace, utilization, null)"
        );
        let bad = Options {
            trace_ranks: "3-1".into(),
            ..Default::default()
        };
        assert_eq!(
            Measure::from_options(&bad).unwrap_err().to_string(),
            "trace_ranks: bad rank range \"3-1\": 3 is above 1"
        );
    }

    #[test]
    fn trace_ranks_name_the_ranks_that_ship_a_trace() {
        let none = Measure::from_options(&Options::default()).unwrap();
        assert!(!none.traces(0));
        let some = Measure::from_options(&Options {
            trace_ranks: "0,5-6".into(),
            modules: vec!["trace".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(some.traces(0) && some.traces(6) && !some.traces(1));
        assert_eq!(some.modules(), ["trace".to_string()]);
    }
}
