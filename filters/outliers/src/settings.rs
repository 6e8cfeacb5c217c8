//! The stream's parameters: how many ranks to keep, how to score them, against whom, and over which numbers.

use canopy_filter_common::classes::Scheme;
use canopy_filter_common::{Params, Values};
use canopy_filter_proto::v1::Metric;

/// The default number of ranks kept per group.
pub const DEFAULT_K: u32 = 10;
/// The most ranks a group may keep, asked as `k` or as a `fraction`: the root must receive O(k), and a stream
/// that wants every rank's data asks passthrough.
pub const MAX_KEEP: u32 = 10_000;
/// The default number of events reported per kept rank.
pub const DEFAULT_TOP_EVENTS: u32 = 3;
/// The most events reported per kept rank.
pub const MAX_TOP_EVENTS: u32 = 64;

const KNOWN: [&str; 10] = [
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
];

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
    pub weighted: bool,
    /// Scores against the rank's functional class rather than every rank.
    pub by_class: bool,
    /// Scores each application's ranks apart (`by_app`, the default).
    pub by_app: bool,
    pub metric: Metric,
    pub values: Values,
    pub events: Scheme,
}

impl Settings {
    /// Params: `{"k": 1..=10000 (10) | "fraction": (0, 1], "top_events": 0..=64 (3), "weighted": false | true,
    /// "within": "all" | "class", "metric": "exclusive" | "inclusive" | "calls" | "counter" | a per-event metric,
    /// "events": "all" | "pattern", "pattern": "<regex>" (with events pattern only), "values": "round" |
    /// "cumulative", "by_app": true | false}`.
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
        Ok(Settings {
            keep,
            top_events: params.u32_between("top_events", DEFAULT_TOP_EVENTS, 0, MAX_TOP_EVENTS)?,
            weighted: params.bool("weighted", false)?,
            by_class: params.choice("within", &["all", "class"], "all")? == "class",
            by_app: params.bool("by_app", true)?,
            metric: params.metric()?,
            values: params.values()?,
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
        assert!(!s.weighted && !s.by_class && s.by_app);
        assert_eq!((s.metric, s.values), (Metric::Exclusive, Values::Round));
        assert_eq!(s.events.describe(), "all");
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
        assert!(err(r#"{"metric": "time"}"#).starts_with("metric must be one of \"exclusive\""));
        assert_eq!(
            err(r#"{"events": "pattern"}"#),
            "events \"pattern\" needs a pattern"
        );
        assert_eq!(err(r#"{"pattern": "^MPI_"}"#), "pattern needs events \"pattern\"");
        assert_eq!(
            err(r#"{"kk": 1}"#),
            "unknown parameter \"kk\" (known: k, fraction, top_events, weighted, within, metric, events, \
             pattern, values, by_app)"
        );
        assert!(err("[").starts_with("parameters are not valid JSON"));
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
