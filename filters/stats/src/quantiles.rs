//! The stats filter's quantile parameters: which quantiles, and the sketch they are read from.

use canopy_filter_common::Params;
use canopy_filter_common::sketch::{DEFAULT_ACCURACY, DEFAULT_MAX_BINS, Spec};

/// Every parameter the stats filter knows.
pub(crate) const KNOWN: [&str; 5] = ["values", "by_app", "quantiles", "relative_accuracy", "max_bins"];

/// The quantiles `"quantiles": true` asks for: p50, p90 and p99.
pub(crate) const DEFAULT_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// At most this many quantiles per row, so a result stays small.
const MAX_QUANTILES: usize = 32;

/// `quantiles` (`true` for p50, p90 and p99, or a list of numbers in [0, 1]; absent, `false` or empty: none),
/// `relative_accuracy` (in [0.0001, 0.5]) and `max_bins` (bins per sketch store, in [16, 65536]): the sorted
/// quantiles and their sketch's spec, or `None` when no quantile is asked for. Without quantiles `stats` is the
/// reduction MRNet's and ToM's statistics filters compute (count, mean, deviation, min, max), at their cost.
pub(crate) fn parse(params: &Params) -> Result<Option<(Vec<f64>, Spec)>, String> {
    let qs = if params.is_bool("quantiles") {
        match params.bool("quantiles", false)? {
            true => DEFAULT_QUANTILES.to_vec(),
            false => Vec::new(),
        }
    } else {
        params.f64_list("quantiles", &[], 0.0, 1.0, MAX_QUANTILES)?
    };
    let accuracy = params.f64_between("relative_accuracy", DEFAULT_ACCURACY, 0.0001, 0.5)?;
    let max_bins = params.u32_between("max_bins", DEFAULT_MAX_BINS, 16, 65536)?;
    if qs.is_empty() {
        return Ok(None);
    }
    Ok(Some((qs, Spec::new(accuracy, max_bins)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Option<(Vec<f64>, Spec)>, String> {
        parse(&Params::parse(text, &KNOWN)?)
    }

    #[test]
    fn defaults_and_choices() {
        assert_eq!(parsed("{}").unwrap(), None);
        assert_eq!(parsed(r#"{"quantiles": false}"#).unwrap(), None);
        let (qs, spec) = parsed(r#"{"quantiles": true}"#).unwrap().unwrap();
        assert_eq!(qs, DEFAULT_QUANTILES);
        assert_eq!((spec.accuracy(), spec.max_bins()), (0.01, 2048));
        let (qs, spec) =
            parsed(r#"{"quantiles": [0.99, 0, 0.5, 0.5, 1], "relative_accuracy": 0.05, "max_bins": 100}"#)
                .unwrap()
                .unwrap();
        assert_eq!(qs, vec![0.0, 0.5, 0.99, 1.0]);
        assert_eq!((spec.accuracy(), spec.max_bins()), (0.05, 100));
        assert_eq!(parsed(r#"{"quantiles": []}"#).unwrap(), None);
    }

    #[test]
    fn errors_name_the_parameter_and_the_value() {
        let err = |text: &str| parsed(text).unwrap_err();
        assert_eq!(
            err(r#"{"quantiles": [0.5, 1.5]}"#),
            "quantiles: each must be between 0 and 1, got 1.5"
        );
        assert_eq!(
            err(r#"{"quantiles": ["p50"]}"#),
            "quantiles: each must be a number between 0 and 1, got \"p50\""
        );
        assert_eq!(
            err(r#"{"quantiles": 0.5}"#),
            "quantiles must be a list of numbers between 0 and 1, got 0.5"
        );
        assert_eq!(
            err(r#"{"quantiles": "yes"}"#),
            "quantiles must be a list of numbers between 0 and 1, got \"yes\""
        );
        assert_eq!(
            err(&format!(r#"{{"quantiles": [{}]}}"#, vec!["0.5"; 33].join(","))),
            "quantiles may hold at most 32 numbers, got 33"
        );
        assert_eq!(
            err(r#"{"relative_accuracy": 0}"#),
            "relative_accuracy must be between 0.0001 and 0.5, got 0"
        );
        assert_eq!(
            err(r#"{"relative_accuracy": "1%"}"#),
            "relative_accuracy must be a number between 0.0001 and 0.5, got \"1%\""
        );
        assert_eq!(
            err(r#"{"max_bins": 8}"#),
            "max_bins must be between 16 and 65536, got 8"
        );
    }
}
