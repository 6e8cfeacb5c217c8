//! The stream's parameters: which vectors, which k (or k "auto"), how long to iterate and how often to refit.

use canopy_filter_common::select::Scheme;
use canopy_filter_common::{Params, Values};
use canopy_filter_proto::v1::Metric;

/// Iterations a round may take at most: each costs two phases, so the plugin declares
/// `2 * MAX_ITERATIONS + 3` phases (phase 0, the iterations, and the last pass down and up).
pub const MAX_ITERATIONS: u32 = 100;
/// The default bound on iterations.
pub const DEFAULT_MAX_ITERATIONS: u32 = 20;
/// The default k, as the paper's Fig. 3.
pub const DEFAULT_K: u32 = 3;
/// The largest k a stream may ask for.
pub const MAX_K: u32 = 256;
/// The largest k_max with k "auto" (every k from 1 to k_max runs side by side).
pub const MAX_K_AUTO: u32 = 16;
/// The default k_max with k "auto".
pub const DEFAULT_K_MAX: u32 = 8;
/// The default share of the total sum of squares (the fit of k = 1) that one more cluster must remove for k
/// "auto" to take it.
pub const DEFAULT_IMPROVEMENT: f64 = 0.1;

/// The parameters' keys.
pub const KEYS: [&str; 9] = [
    "k",
    "k_max",
    "improvement",
    "max_iterations",
    "refit_every",
    "metric",
    "values",
    "scheme",
    "pattern",
];

/// One stream's parsed parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// The k of every run, increasing: one, or 1..=k_max with k "auto".
    pub ks: Vec<u32>,
    /// With k "auto": the share of the fit of k = 1 that one more cluster must remove.
    pub improvement: Option<f64>,
    pub max_iterations: u32,
    pub refit_every: u32,
    pub metric: Metric,
    pub values: Values,
    pub scheme: Scheme,
}

impl Config {
    /// Params: `{"k": 1..=256 | "auto" (3), "k_max": 2..=16 (8, with "auto" only), "improvement": 0 < x < 1
    /// (0.1, with "auto" only), "max_iterations": 0..=100 (20), "refit_every": 1..=1000000 (1), "metric": as
    /// classify's (exclusive), "values": "round" | "cumulative", "scheme": "all" | "pattern", "pattern": regex}`.
    pub fn parse(text: &str) -> Result<Config, String> {
        let params = Params::parse(text, &KEYS)?;
        // k is a number, or the word "auto"; a number goes through the range check below.
        let auto = match params.string("k") {
            Ok(Some("auto")) => true,
            Ok(Some(s)) => {
                return Err(format!(
                    "k must be an integer between 1 and {MAX_K} or \"auto\", got \"{s}\""
                ));
            }
            _ => false,
        };
        let (ks, improvement) = if auto {
            let k_max = params.u32_between("k_max", DEFAULT_K_MAX, 2, MAX_K_AUTO)?;
            let improvement = params.fraction("improvement", DEFAULT_IMPROVEMENT)?;
            ((1..=k_max).collect(), Some(improvement))
        } else {
            for only in ["k_max", "improvement"] {
                if params.has(only) {
                    return Err(format!("{only} needs k \"auto\""));
                }
            }
            (vec![params.u32_between("k", DEFAULT_K, 1, MAX_K)?], None)
        };
        Ok(Config {
            ks,
            improvement,
            max_iterations: params.u32_between(
                "max_iterations",
                DEFAULT_MAX_ITERATIONS,
                0,
                MAX_ITERATIONS,
            )?,
            refit_every: params.u32_between("refit_every", 1, 1, 1_000_000)?,
            metric: params.metric()?,
            values: params.values()?,
            scheme: Scheme::from_params(&params, "scheme")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err()
    }

    #[test]
    fn defaults() {
        for text in ["", "{}"] {
            let c = Config::parse(text).unwrap();
            assert_eq!(c.ks, [3]);
            assert_eq!(c.improvement, None);
            assert_eq!((c.max_iterations, c.refit_every), (20, 1));
            assert_eq!((c.metric, c.values), (Metric::Exclusive, Values::Round));
            assert_eq!(c.scheme.describe(), "all");
        }
    }

    #[test]
    fn auto_runs_every_k_up_to_k_max() {
        let c = Config::parse(r#"{"k": "auto", "k_max": 4, "improvement": 0.25}"#).unwrap();
        assert_eq!((c.ks, c.improvement), (vec![1, 2, 3, 4], Some(0.25)));
        let c = Config::parse(r#"{"k": "auto"}"#).unwrap();
        assert_eq!((c.ks.len(), c.improvement), (8, Some(0.1)));
    }

    #[test]
    fn bad_parameters_are_named() {
        assert_eq!(err(r#"{"k": 0}"#), "k must be between 1 and 256, got 0");
        assert_eq!(
            err(r#"{"k": "many"}"#),
            "k must be an integer between 1 and 256 or \"auto\", got \"many\""
        );
        assert_eq!(
            err(r#"{"k": 2.5}"#),
            "k must be an integer between 1 and 256, got 2.5"
        );
        assert_eq!(err(r#"{"k_max": 4}"#), "k_max needs k \"auto\"");
        assert_eq!(
            err(r#"{"k": 3, "improvement": 0.2}"#),
            "improvement needs k \"auto\""
        );
        assert_eq!(
            err(r#"{"k": "auto", "k_max": 17}"#),
            "k_max must be between 2 and 16, got 17"
        );
        assert_eq!(
            err(r#"{"k": "auto", "improvement": 1}"#),
            "improvement must be a number between 0 and 1 (exclusive), got 1"
        );
        assert_eq!(
            err(r#"{"k": "auto", "improvement": "lots"}"#),
            "improvement must be a number between 0 and 1 (exclusive), got \"lots\""
        );
        assert_eq!(
            err(r#"{"max_iterations": 101}"#),
            "max_iterations must be between 0 and 100, got 101"
        );
        assert_eq!(
            err(r#"{"refit_every": 0}"#),
            "refit_every must be between 1 and 1000000, got 0"
        );
        assert_eq!(
            err(r#"{"scheme": "pattern"}"#),
            "scheme \"pattern\" needs a pattern"
        );
        assert!(err(r#"{"metric": "speed"}"#).starts_with("metric must be one of \"exclusive\""));
        assert_eq!(
            err(r#"{"kk": 3}"#),
            "unknown parameter \"kk\" (known: k, k_max, improvement, max_iterations, refit_every, metric, values, \
             scheme, pattern)"
        );
    }
}
