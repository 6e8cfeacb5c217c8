//! The stream's parameters: how many ranks to keep, how to score them, against whom, and over which numbers.

use canopy_filter_common::classes::Scheme;
use canopy_filter_common::{Params, Values};
use canopy_filter_proto::v1::Metric;

use crate::window::{MAX_WINDOW, Statistic};

/// The default number of ranks kept per group.
pub const DEFAULT_K: u32 = 10;
/// The most ranks a group may keep, asked as `k` or as a `fraction`: the root must receive O(k), and a stream
/// that wants every rank's data asks passthrough.
pub const MAX_KEEP: u32 = 10_000;
/// The default number of events reported per kept rank.
pub const DEFAULT_TOP_EVENTS: u32 = 3;
/// The most events reported per kept rank.
pub const MAX_TOP_EVENTS: u32 = 64;
/// The default window of rounds a rank is scored over (with values per round): a rank the machine slowed in one
/// or two rounds of five (another job's burst, a preemption) keeps its median, while a rank slow in every round
/// stays out of it. On a node whose two cores also run bursts of other work, the planted slow ranks of the loaded
/// node's test are the top two in 25 to 36 rounds of 40 scored round by round, in 38 to 40 over windows of five.
pub const DEFAULT_WINDOW: u32 = 5;
/// The default margin: a value within one standard deviation of its event's mean adds nothing to its rank's
/// score, and one beyond adds only the excess. Every rank of a loaded machine, or of an application whose ranks
/// differ by their place in it (Uintah's boundary ranks send more bytes), strays by about one deviation here
/// and there; summed over events and metrics, such ordinary spread outranked ranks planted slow (0: seed 002's
/// score, every distance counted whole).
pub const DEFAULT_MARGIN: f64 = 1.0;
/// The largest margin a stream may ask.
pub const MAX_MARGIN: f64 = 100.0;

const KNOWN: [&str; 13] = [
    "k",
    "fraction",
    "top_events",
    "weighted",
    "within",
    "metric",
    "events",
    "pattern",
    "values",
    "by_app",
    "window",
    "window_stat",
    "margin",
];

/// The metrics a rank's score sums over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scored {
    /// Exclusive time, calls and counters, each event's distance weighted within its own metric when the stream
    /// is weighted: an imbalance shows whether it is in time or in calls (a rank sending more messages than the
    /// others in the same time), and no metric outweighs another by its unit.
    All,
    /// One metric alone.
    One(Metric),
}

/// The metrics `"all"` scores, in `Metric` order.
pub const ALL_METRICS: [Metric; 3] = [Metric::Calls, Metric::Exclusive, Metric::Counter];

impl Scored {
    /// The metrics scored, in `Metric` order.
    pub fn metrics(self) -> Vec<Metric> {
        match self {
            Scored::All => ALL_METRICS.to_vec(),
            Scored::One(m) => vec![m],
        }
    }

    /// Whether summaries of metric number `m` belong to the stream.
    pub fn admits(self, m: i32) -> bool {
        match self {
            Scored::All => ALL_METRICS.iter().any(|x| *x as i32 == m),
            Scored::One(x) => x as i32 == m,
        }
    }

    /// The single metric the result names; unspecified for several.
    pub fn single(self) -> Metric {
        match self {
            Scored::All => Metric::Unspecified,
            Scored::One(m) => m,
        }
    }
}

/// How many ranks a group keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keep {
    /// At most this many.
    Count(u32),
    /// This share of the group's ranks, rounded up (at most [`MAX_KEEP`]).
    Fraction(f64),
}

impl Keep {
    /// How many ranks a group of `ranks` keeps.
    pub fn of(self, ranks: u64) -> u32 {
        match self {
            Keep::Count(k) => k,
            Keep::Fraction(f) => {
                let x = f * ranks as f64;
                // 0.1 * 30 is 3.0000000000000004 in doubles: a product that is a whole number but for rounding
                // keeps that number, not one more.
                let near = x.round();
                let n = if (x - near).abs() <= 1e-9 * near.max(1.0) {
                    near
                } else {
                    x.ceil()
                };
                n.min(f64::from(MAX_KEEP)) as u32
            }
        }
    }
}

/// The parsed parameters of a stream.
#[derive(Debug, Clone)]
pub struct Settings {
    pub keep: Keep,
    pub top_events: u32,
    /// Weighs each event's distance by its share of its metric's total (the default): a large difference in the
    /// main event counts for more than noise in a tiny one.
    pub weighted: bool,
    /// Scores against the rank's functional class rather than every rank.
    pub by_class: bool,
    /// Scores each application's ranks apart (`by_app`, the default).
    pub by_app: bool,
    pub metric: Scored,
    pub values: Values,
    pub events: Scheme,
    /// Scores each rank on its values over this many rounds (1: each round alone).
    pub window: u32,
    /// What a rank's values over its window become: their median (the default) or their sum.
    pub window_stat: Statistic,
    /// The standard deviations within which a value adds nothing to its rank's score.
    pub margin: f64,
}

impl Settings {
    /// Params: `{"k": 1..=10000 (10) | "fraction": (0, 1], "top_events": 0..=64 (3), "weighted": true | false,
    /// "within": "all" | "class", "metric": "all" | "exclusive" | "inclusive" | "calls" | "counter" | a per-event
    /// metric,
    /// "events": "all" | "pattern", "pattern": "<regex>" (with events pattern only), "values": "round" |
    /// "cumulative", "by_app": true | false, "window": 1..=64 (5; 1 with cumulative values), "window_stat": "median" | "sum", "margin": 0..=100 (1)}`.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let params = Params::parse(text, &KNOWN)?;
        let keep = match (params.has("k"), params.number("fraction")?) {
            (true, Some(_)) => return Err("k and fraction exclude each other: give one".to_string()),
            (_, None) => Keep::Count(params.u32_between("k", DEFAULT_K, 1, MAX_KEEP)?),
            (false, Some(f)) if f > 0.0 && f <= 1.0 => Keep::Fraction(f),
            (false, Some(f)) => {
                return Err(format!("fraction must be above 0 and at most 1, got {f}"));
            }
        };
        let values = params.values()?;
        // Cumulative values are a window from the run's start already: alone they default to no window.
        let default_window = match values {
            Values::Round => DEFAULT_WINDOW,
            Values::Cumulative => 1,
        };
        let window = params.u32_between("window", default_window, 1, MAX_WINDOW)?;
        if window > 1 && values == Values::Cumulative {
            return Err(
                "a window of rounds takes each round's values: it needs values \"round\", not \"cumulative\""
                    .to_string(),
            );
        }
        let window_stat = match params.choice("window_stat", &["median", "sum"], "median")? {
            "sum" => Statistic::Sum,
            _ => Statistic::Median,
        };
        Ok(Settings {
            window,
            window_stat,
            margin: params.f64_between("margin", DEFAULT_MARGIN, 0.0, MAX_MARGIN)?,
            keep,
            top_events: params.u32_between("top_events", DEFAULT_TOP_EVENTS, 0, MAX_TOP_EVENTS)?,
            weighted: params.bool("weighted", true)?,
            by_class: params.choice("within", &["all", "class"], "all")? == "class",
            by_app: params.bool("by_app", true)?,
            metric: match params.string("metric")? {
                None | Some("all") => Scored::All,
                Some(_) => Scored::One(params.metric().map_err(|e| {
                    e.replacen("metric must be one of ", "metric must be \"all\" or one of ", 1)
                })?),
            },
            values,
            events: Scheme::from_params(&params, "events")?,
        })
    }

    /// The `within` word the result reports.
    pub fn within(&self) -> &'static str {
        if self.by_class { "class" } else { "all" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let s = Settings::parse("").unwrap();
        assert_eq!(s.keep, Keep::Count(10));
        assert_eq!(s.top_events, 3);
        assert!(s.weighted && !s.by_class && s.by_app);
        assert_eq!((s.metric, s.values), (Scored::All, Values::Round));
        let one = Settings::parse(r#"{"metric": "calls", "weighted": false}"#).unwrap();
        assert_eq!((one.metric, one.weighted), (Scored::One(Metric::Calls), false));
        assert_eq!(
            Settings::parse(r#"{"metric": "all"}"#).unwrap().metric,
            Scored::All
        );
        assert_eq!(s.events.describe(), "all");
        assert_eq!((s.window, s.window_stat), (DEFAULT_WINDOW, Statistic::Median));
        assert_eq!(s.margin, 1.0);
        assert_eq!(Settings::parse(r#"{"margin": 0}"#).unwrap().margin, 0.0);
        let cumulative = Settings::parse(r#"{"values": "cumulative"}"#).unwrap();
        assert_eq!(cumulative.window, 1);
    }

    #[test]
    fn bad_params_are_named() {
        let err = |p: &str| Settings::parse(p).unwrap_err();
        assert_eq!(err(r#"{"k": 0}"#), "k must be between 1 and 10000, got 0");
        assert_eq!(err(r#"{"k": 10001}"#), "k must be between 1 and 10000, got 10001");
        assert_eq!(
            err(r#"{"k": 3, "fraction": 0.1}"#),
            "k and fraction exclude each other: give one"
        );
        assert_eq!(
            err(r#"{"fraction": 0}"#),
            "fraction must be above 0 and at most 1, got 0"
        );
        assert_eq!(
            err(r#"{"fraction": 1.5}"#),
            "fraction must be above 0 and at most 1, got 1.5"
        );
        assert_eq!(
            err(r#"{"fraction": "10%"}"#),
            "fraction must be a number, got \"10%\""
        );
        assert_eq!(
            err(r#"{"top_events": 65}"#),
            "top_events must be between 0 and 64, got 65"
        );
        assert_eq!(
            err(r#"{"weighted": "yes"}"#),
            "weighted must be true or false, got \"yes\""
        );
        assert_eq!(
            err(r#"{"within": "node"}"#),
            "within must be one of \"all\", \"class\", got \"node\""
        );
        assert!(err(r#"{"metric": "time"}"#).starts_with("metric must be \"all\" or one of \"exclusive\""));
        assert_eq!(
            err(r#"{"events": "pattern"}"#),
            "events \"pattern\" needs a pattern"
        );
        assert_eq!(err(r#"{"pattern": "^MPI_"}"#), "pattern needs events \"pattern\"");
        assert_eq!(
            err(r#"{"kk": 1}"#),
            "unknown parameter \"kk\" (known: k, fraction, top_events, weighted, within, metric, events, \
             pattern, values, by_app, window, window_stat, margin)"
        );
        assert!(err("[").starts_with("parameters are not valid JSON"));
        assert_eq!(
            err(r#"{"window": 65}"#),
            "window must be between 1 and 64, got 65"
        );
        assert_eq!(
            err(r#"{"window": 4, "values": "cumulative"}"#),
            "a window of rounds takes each round's values: it needs values \"round\", not \"cumulative\""
        );
        assert_eq!(
            err(r#"{"margin": -1}"#),
            "margin must be between 0 and 100, got -1"
        );
        assert_eq!(
            err(r#"{"window": 4, "window_stat": "mean"}"#),
            "window_stat must be one of \"median\", \"sum\", got \"mean\""
        );
    }

    #[test]
    fn a_fraction_rounds_up_but_not_past_a_whole_product() {
        assert_eq!(Keep::Fraction(0.1).of(30), 3);
        assert_eq!(Keep::Fraction(0.1).of(31), 4);
        assert_eq!(Keep::Fraction(0.5).of(1), 1);
        assert_eq!(Keep::Fraction(0.01).of(1), 1);
        assert_eq!(Keep::Fraction(1.0).of(0), 0);
        assert_eq!(Keep::Fraction(1.0).of(1_000_000), MAX_KEEP);
        assert_eq!(Keep::Count(7).of(2), 7);
    }
}
