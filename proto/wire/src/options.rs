//! Measurement options (events to include or exclude, a metric subset, rank sampling): checked where they
//! enter the tree and applied to each rank's profile at its next dump.

/// The longest dump period options may set.
pub const MAX_PERIOD_MS: u64 = 3_600_000;

/// The measurement options a leaf applies to its ranks' profiles at each dump. The options of one application
/// are `for_app(app)`: the global ones with that application's entry laid over them.
#[derive(Debug, Default, Clone)]
pub struct Measure {
    include: Vec<regex_lite::Regex>,
    exclude: Vec<regex_lite::Regex>,
    /// Bits as in `RankProfile.metrics`; 0: all.
    metrics: u32,
    sample_below: u32,
    /// No rank reports (an application's `sample_below: 0`).
    disabled: bool,
    /// The measurement modules named by the options (empty: each rank's own choice).
    modules: Vec<String>,
    /// The ranks that ship their trace (none when the options name none).
    trace_ranks: Option<crate::ranks::RankSet>,
    /// The per-event metrics the options name, as bits over `event_metrics::ALL` (`None`: each rank's own
    /// choice).
    counters: Option<u32>,
    /// Each application's own options, checked and compiled, by application name.
    apps: std::collections::BTreeMap<String, AppMeasure>,
}

/// One application's options (`AppOptions`): each field set replaces the global one for its ranks.
#[derive(Debug, Default, Clone)]
struct AppMeasure {
    include: Option<Vec<regex_lite::Regex>>,
    exclude: Option<Vec<regex_lite::Regex>>,
    metrics: Option<u32>,
    sample_below: Option<u32>,
}

/// The measurement modules a rank can run, by the names options and CANOPY_MODULES give them.
pub const MODULES: [&str; 4] = ["profile", "trace", "utilization", "null"];

/// Whether options make the rounds time rounds: `time_rounds` is set, or the utilization module is in force.
pub fn time_rounds(o: &crate::v1::Options) -> bool {
    o.time_rounds == Some(true) || o.modules.iter().any(|m| m == "utilization")
}

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
    /// An application's entry in `apps` has no name.
    AppUnnamed,
    /// Two entries of `apps` name the same application.
    AppTwice(String),
    /// Time rounds turned off while the utilization module, whose rounds are time rounds, is in force.
    TimeRoundsOff,
    /// What is wrong with an application's own options.
    App {
        app: String,
        error: Box<OptionsError>,
    },
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
            OptionsError::TimeRoundsOff => f.write_str(
                "time_rounds cannot be off while the utilization module is in force: its rounds are time rounds",
            ),
            OptionsError::AppUnnamed => f.write_str("apps: an entry has no app name"),
            OptionsError::AppTwice(a) => write!(f, "apps: application {a:?} has two entries"),
            OptionsError::App { app, error } => write!(f, "apps[{app:?}]: {error}"),
        }
    }
}

impl std::error::Error for OptionsError {}

impl Measure {
    /// Checks and compiles options; the error names the bad pattern or metric.
    pub fn from_options(o: &crate::v1::Options) -> Result<Measure, OptionsError> {
        let metrics = metric_bits(&o.metrics)?;
        if o.period_ms != 0 && !(1..=MAX_PERIOD_MS).contains(&o.period_ms) {
            return Err(OptionsError::Period(o.period_ms));
        }
        if let Some(m) = o.modules.iter().find(|m| !MODULES.contains(&m.as_str())) {
            return Err(OptionsError::Module(m.clone()));
        }
        if o.time_rounds == Some(false) && o.modules.iter().any(|m| m == "utilization") {
            return Err(OptionsError::TimeRoundsOff);
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
        let mut apps = std::collections::BTreeMap::new();
        for a in &o.apps {
            if a.app.is_empty() {
                return Err(OptionsError::AppUnnamed);
            }
            if apps.contains_key(&a.app) {
                return Err(OptionsError::AppTwice(a.app.clone()));
            }
            let own = AppMeasure::from_options(a).map_err(|error| OptionsError::App {
                app: a.app.clone(),
                error: Box::new(error),
            })?;
            apps.insert(a.app.clone(), own);
        }
        Ok(Measure {
            counters,
            include: compile_all(&o.include)?,
            exclude: compile_all(&o.exclude)?,
            metrics,
            sample_below: o.sample_below,
            disabled: false,
            modules: o.modules.clone(),
            trace_ranks,
            apps,
        })
    }

    /// The options the ranks of application `app` run: these, with the fields that application's entry sets
    /// laid over them (the same options when it has none).
    pub fn for_app(&self, app: &str) -> Measure {
        let mut m = Measure {
            apps: Default::default(),
            ..self.clone()
        };
        if let Some(own) = self.apps.get(app) {
            if let Some(include) = &own.include {
                m.include = include.clone();
            }
            if let Some(exclude) = &own.exclude {
                m.exclude = exclude.clone();
            }
            if let Some(metrics) = own.metrics {
                m.metrics = metrics;
            }
            if let Some(below) = own.sample_below {
                m.sample_below = below;
                m.disabled = below == 0;
            }
        }
        m
    }

    /// Whether the options leave out every rank (the application is disabled).
    pub fn disabled(&self) -> bool {
        self.disabled
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

    /// Whether rank sampling leaves this rank out (every rank, when the options disable the application). The
    /// options of one application are `for_app`'s: these global ones know no application.
    pub fn samples_out(&self, rank: u32) -> bool {
        self.disabled || (self.sample_below > 0 && rank >= self.sample_below)
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

impl AppMeasure {
    fn from_options(a: &crate::v1::AppOptions) -> Result<AppMeasure, OptionsError> {
        let set = |v: &Vec<String>| !v.is_empty();
        Ok(AppMeasure {
            include: set(&a.include).then(|| compile_all(&a.include)).transpose()?,
            exclude: set(&a.exclude).then(|| compile_all(&a.exclude)).transpose()?,
            metrics: set(&a.metrics).then(|| metric_bits(&a.metrics)).transpose()?,
            sample_below: a.sample_below,
        })
    }
}

/// Compiles patterns; the error names the bad one.
fn compile_all(patterns: &[String]) -> Result<Vec<regex_lite::Regex>, OptionsError> {
    patterns
        .iter()
        .map(|p| {
            regex_lite::Regex::new(p).map_err(|e| OptionsError::Pattern {
                pattern: p.clone(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The bits of the metrics named (0: none named, all reported); the error names an unknown one.
fn metric_bits(names: &[String]) -> Result<u32, OptionsError> {
    let mut bits = 0;
    for m in names {
        bits |= metric::bit(m).ok_or_else(|| OptionsError::Metric(m.clone()))?;
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{AppOptions, CounterSample, EventSample, Options, RankProfile};

    #[test]
    fn time_rounds_are_on_when_set_or_under_utilization_and_cannot_be_turned_off_there() {
        let with = |time_rounds: Option<bool>, modules: &[&str]| Options {
            time_rounds,
            modules: modules.iter().map(|m| m.to_string()).collect(),
            ..Default::default()
        };
        assert!(!time_rounds(&with(None, &[])));
        assert!(!time_rounds(&with(Some(false), &["profile"])));
        assert!(time_rounds(&with(Some(true), &[])));
        assert!(time_rounds(&with(None, &["profile", "utilization"])));
        assert!(Measure::from_options(&with(Some(true), &["profile"])).is_ok());
        assert!(Measure::from_options(&with(Some(true), &["utilization"])).is_ok());
        let e = Measure::from_options(&with(Some(false), &["profile", "utilization"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "time_rounds cannot be off while the utilization module is in force: its rounds are time rounds"
        );
    }

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

    fn app(name: &str) -> AppOptions {
        AppOptions {
            app: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_application_entry_replaces_the_fields_it_sets_for_that_application_alone() {
        let names: std::collections::HashMap<u64, String> = [
            (1, "MPI_Send".to_string()),
            (2, "io_write".to_string()),
            (3, "hydro".to_string()),
        ]
        .into();
        let o = Options {
            exclude: vec!["^io_".into()],
            metrics: vec!["calls".into()],
            sample_below: 4,
            apps: vec![
                AppOptions {
                    include: vec!["^MPI_".into()],
                    sample_below: Some(2),
                    ..app("sim")
                },
                AppOptions {
                    metrics: vec!["inclusive".into()],
                    ..app("analysis")
                },
            ],
            ..Default::default()
        };
        let m = Measure::from_options(&o).unwrap();
        let kept = |m: &Measure| {
            let p = RankProfile {
                events: (1..=3)
                    .map(|id| EventSample {
                        event_id: id,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let p = m.apply(p, &names);
            (p.events.iter().map(|e| e.event_id).collect::<Vec<_>>(), p.metrics)
        };
        // sim: its include and sampling, the global exclude and metrics it leaves unset.
        let sim = m.for_app("sim");
        assert_eq!(kept(&sim), (vec![1], metric::CALLS));
        assert!(!sim.samples_out(1) && sim.samples_out(2) && !sim.disabled());
        // analysis: its metrics, the global selection and sampling.
        let analysis = m.for_app("analysis");
        assert_eq!(kept(&analysis), (vec![1, 3], metric::INCLUSIVE));
        assert!(!analysis.samples_out(3) && analysis.samples_out(4));
        // An application with no entry, and the global options themselves, run the global options.
        for other in [m.for_app("viz"), m] {
            assert_eq!(kept(&other), (vec![1, 3], metric::CALLS));
            assert!(!other.samples_out(3) && other.samples_out(4));
        }
    }

    #[test]
    fn an_application_sampled_to_zero_is_disabled_while_a_global_zero_samples_every_rank() {
        let o = Options {
            apps: vec![AppOptions {
                sample_below: Some(0),
                ..app("analysis")
            }],
            ..Default::default()
        };
        let m = Measure::from_options(&o).unwrap();
        let analysis = m.for_app("analysis");
        assert!(analysis.disabled());
        assert!((0..100).all(|r| analysis.samples_out(r)));
        let sim = m.for_app("sim");
        assert!(!sim.disabled() && (0..100).all(|r| !sim.samples_out(r)));
        // An entry that leaves sample_below absent keeps the global sampling; one that sets it overrides a global
        // sampling either way.
        let o = Options {
            sample_below: 2,
            apps: vec![
                app("sim"),
                AppOptions {
                    sample_below: Some(8),
                    ..app("analysis")
                },
            ],
            ..Default::default()
        };
        let m = Measure::from_options(&o).unwrap();
        assert!(m.for_app("sim").samples_out(2));
        assert!(!m.for_app("analysis").samples_out(7) && m.for_app("analysis").samples_out(8));
    }

    #[test]
    fn bad_application_options_name_the_application_and_what_is_wrong() {
        let with = |a: AppOptions| {
            Measure::from_options(&Options {
                apps: vec![app("sim"), a],
                ..Default::default()
            })
            .unwrap_err()
            .to_string()
        };
        let e = with(AppOptions {
            include: vec!["(".into()],
            ..app("analysis")
        });
        assert!(e.starts_with("apps[\"analysis\"]: bad pattern \"(\""), "{e}");
        let e = with(AppOptions {
            exclude: vec!["[".into()],
            ..app("analysis")
        });
        assert!(e.starts_with("apps[\"analysis\"]: bad pattern \"[\""), "{e}");
        assert_eq!(
            with(AppOptions {
                metrics: vec!["speed".into()],
                ..app("analysis")
            }),
            "apps[\"analysis\"]: unknown metric \"speed\" (calls, inclusive, exclusive, counters)"
        );
        assert_eq!(with(app("")), "apps: an entry has no app name");
        assert_eq!(with(app("sim")), "apps: application \"sim\" has two entries");
    }

    mod merged {
        use super::*;
        use proptest::prelude::*;

        const PATTERNS: [&str; 5] = ["^MPI_", "Barrier", "io", "^h", "e$"];
        const NAMES: [&str; 6] = ["MPI_Send", "MPI_Barrier", "io_write", "hydro", "halo", "sweep"];
        const METRICS: [&str; 4] = ["calls", "inclusive", "exclusive", "counters"];
        const APPS: [&str; 3] = ["sim", "analysis", "viz"];

        fn some_of(pool: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
            prop::sample::subsequence(pool, 0..=2).prop_map(|v| v.iter().map(|s| s.to_string()).collect())
        }

        fn app_options() -> impl Strategy<Value = AppOptions> {
            (
                prop::sample::select(&APPS[..]),
                some_of(&PATTERNS),
                some_of(&PATTERNS),
                some_of(&METRICS),
                prop::option::of(0u32..6),
            )
                .prop_map(|(app, include, exclude, metrics, sample_below)| AppOptions {
                    app: app.into(),
                    include,
                    exclude,
                    metrics,
                    sample_below,
                })
        }

        fn options() -> impl Strategy<Value = Options> {
            (
                some_of(&PATTERNS),
                some_of(&PATTERNS),
                some_of(&METRICS),
                0u32..6,
                prop::collection::vec(app_options(), 0..3),
            )
                .prop_map(|(include, exclude, metrics, sample_below, mut apps)| {
                    apps.sort_by(|a, b| a.app.cmp(&b.app));
                    apps.dedup_by(|a, b| a.app == b.app);
                    Options {
                        include,
                        exclude,
                        metrics,
                        sample_below,
                        apps,
                        ..Default::default()
                    }
                })
        }

        proptest! {
            /// An application runs what global options written with its entry's fields in place of the global
            /// ones would run; an entry's sample_below 0 leaves every rank out.
            #[test]
            fn an_application_runs_the_global_options_with_its_entry_in_place(o in options()) {
                let m = Measure::from_options(&o).unwrap();
                for app in APPS {
                    let entry = o.apps.iter().find(|a| a.app == app);
                    let pick = |own: Option<&Vec<String>>, global: &Vec<String>| {
                        own.filter(|v| !v.is_empty()).unwrap_or(global).clone()
                    };
                    let by_hand = Options {
                        include: pick(entry.map(|e| &e.include), &o.include),
                        exclude: pick(entry.map(|e| &e.exclude), &o.exclude),
                        metrics: pick(entry.map(|e| &e.metrics), &o.metrics),
                        sample_below: entry.and_then(|e| e.sample_below).unwrap_or(o.sample_below),
                        ..Default::default()
                    };
                    let expected = Measure::from_options(&by_hand).unwrap();
                    let disabled = entry.and_then(|e| e.sample_below) == Some(0);
                    let got = m.for_app(app);
                    prop_assert_eq!(got.metrics(), expected.metrics(), "{}", app);
                    prop_assert_eq!(got.disabled(), disabled, "{}", app);
                    for name in NAMES {
                        prop_assert_eq!(got.reports(name), expected.reports(name), "{} {}", app, name);
                    }
                    for rank in 0..8 {
                        prop_assert_eq!(
                            got.samples_out(rank),
                            disabled || expected.samples_out(rank),
                            "{} rank {}", app, rank
                        );
                    }
                }
            }
        }
    }
}
