//! Filter parameters: a JSON object whose keys the filter lists, so a misspelt key is an error, not a silent default.

use canopy_filter_proto::v1::Metric;
use serde_json::{Map, Value};

use crate::metrics::Values;

/// The parsed parameters of one filter instance.
/// The `metric` parameter's words for the time metrics and counters, with the metric each names.
const METRICS: [(&str, Metric); 4] = [
    ("exclusive", Metric::Exclusive),
    ("inclusive", Metric::Inclusive),
    ("calls", Metric::Calls),
    ("counter", Metric::Counter),
];

#[derive(Debug, Clone, Default)]
pub struct Params {
    map: Map<String, Value>,
}

impl Params {
    /// Parses `text` (empty or blank for none) and refuses any key not in `known`.
    pub fn parse(text: &str, known: &[&str]) -> Result<Params, String> {
        if text.trim().is_empty() {
            return Ok(Params::default());
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("parameters are not valid JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err(format!("parameters must be a JSON object, got {}", kind(&value)));
        };
        // Sorted keys: the first unknown key reported does not depend on how the JSON was written.
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        if let Some(bad) = keys.into_iter().find(|k| !known.contains(&k.as_str())) {
            let known = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(format!("unknown parameter \"{bad}\" (known: {known})"));
        }
        Ok(Params { map })
    }

    /// Whether `key` was given.
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// An integer parameter in `lo..=hi`, `default` when absent.
    pub fn u32_between(&self, key: &str, default: u32, lo: u32, hi: u32) -> Result<u32, String> {
        let Some(value) = self.map.get(key) else {
            return Ok(default);
        };
        let out_of_range = || format!("{key} must be between {lo} and {hi}, got {value}");
        match value {
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    u32::try_from(i)
                        .ok()
                        .filter(|v| (lo..=hi).contains(v))
                        .ok_or_else(out_of_range)
                } else if n.as_u64().is_some() {
                    Err(out_of_range())
                } else {
                    Err(format!(
                        "{key} must be an integer between {lo} and {hi}, got {value}"
                    ))
                }
            }
            other => Err(format!(
                "{key} must be an integer between {lo} and {hi}, got {}",
                kind(other)
            )),
        }
    }

    /// A number parameter in `lo..=hi`, `default` when absent.
    pub fn f64_between(&self, key: &str, default: f64, lo: f64, hi: f64) -> Result<f64, String> {
        match self.map.get(key) {
            None => Ok(default),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| format!("{key} must be between {lo} and {hi}, got {n}")),
            Some(other) => Err(format!(
                "{key} must be a number between {lo} and {hi}, got {}",
                kind(other)
            )),
        }
    }

    /// A number parameter strictly between 0 and 1, `default` when absent.
    pub fn fraction(&self, key: &str, default: f64) -> Result<f64, String> {
        let Some(value) = self.map.get(key) else {
            return Ok(default);
        };
        match value.as_f64() {
            Some(x) if x > 0.0 && x < 1.0 => Ok(x),
            _ => Err(format!(
                "{key} must be a number between 0 and 1 (exclusive), got {}",
                kind(value)
            )),
        }
    }

    /// A list of numbers, each in `lo..=hi`, at most `max` of them, returned sorted without duplicates;
    /// `default` when absent.
    pub fn f64_list(
        &self,
        key: &str,
        default: &[f64],
        lo: f64,
        hi: f64,
        max: usize,
    ) -> Result<Vec<f64>, String> {
        let Some(value) = self.map.get(key) else {
            return Ok(default.to_vec());
        };
        let Value::Array(items) = value else {
            return Err(format!(
                "{key} must be a list of numbers between {lo} and {hi}, got {}",
                kind(value)
            ));
        };
        if items.len() > max {
            return Err(format!(
                "{key} may hold at most {max} numbers, got {}",
                items.len()
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Value::Number(n) => match n.as_f64().filter(|v| (lo..=hi).contains(v)) {
                    Some(v) => out.push(v),
                    None => return Err(format!("{key}: each must be between {lo} and {hi}, got {n}")),
                },
                other => {
                    return Err(format!(
                        "{key}: each must be a number between {lo} and {hi}, got {}",
                        kind(other)
                    ));
                }
            }
        }
        out.sort_by(f64::total_cmp);
        out.dedup();
        Ok(out)
    }

    /// A string parameter, `None` when absent.
    pub fn string(&self, key: &str) -> Result<Option<&str>, String> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(format!("{key} must be a string, got {}", kind(other))),
        }
    }

    /// A string parameter that must be one of `choices`; `default` when absent.
    pub fn choice<'a>(&'a self, key: &str, choices: &[&str], default: &'a str) -> Result<&'a str, String> {
        match self.string(key)? {
            None => Ok(default),
            Some(s) if choices.contains(&s) => Ok(s),
            Some(s) => {
                let quoted: Vec<String> = choices.iter().map(|c| format!("\"{c}\"")).collect();
                Err(format!("{key} must be one of {}, got \"{s}\"", quoted.join(", ")))
            }
        }
    }

    /// Whether a parameter is the JSON value `true` or `false` (rather than another kind).
    pub fn is_bool(&self, key: &str) -> bool {
        matches!(self.map.get(key), Some(Value::Bool(_)))
    }

    /// A boolean parameter, `default` when absent.
    pub fn bool(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.map.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(format!("{key} must be true or false, got {}", kind(other))),
        }
    }

    /// A number parameter, `None` when absent.
    pub fn number(&self, key: &str) -> Result<Option<f64>, String> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(format!("{key} must be a number, got {}", kind(other))),
        }
    }

    /// The `metric` parameter: the time metrics and counters, or a per-event metric ("page-faults" for its
    /// exclusive counts, "page-faults-inclusive", "heap"); `exclusive` when absent.
    pub fn metric(&self) -> Result<Metric, String> {
        let word = self.string("metric")?.unwrap_or("exclusive");
        METRICS
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, m)| *m)
            .or_else(|| canopy_wire::event_metrics::metric_named(word).and_then(|m| Metric::try_from(m).ok()))
            .ok_or_else(|| {
                format!(
                    "metric must be one of \"exclusive\", \"inclusive\", \"calls\", \"counter\" or a per-event \
                     metric (\"page-faults\", \"page-faults-inclusive\", \"heap\", ...: {}), got \"{word}\"",
                    canopy_wire::event_metrics::metric_words().join(", ")
                )
            })
    }

    /// The `values` parameter: `"round"` (the default) or `"cumulative"`.
    pub fn values(&self) -> Result<Values, String> {
        match self.choice("values", &["round", "cumulative"], "round")? {
            "cumulative" => Ok(Values::Cumulative),
            _ => Ok(Values::Round),
        }
    }
}

/// How a JSON value is named in an error: its type, with the value when short.
fn kind(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("\"{s}\""),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_and_empty_object_give_defaults() {
        for text in ["", "  \n", "{}"] {
            let p = Params::parse(text, &["bins", "values"]).unwrap();
            assert_eq!(p.u32_between("bins", 10, 1, 10000).unwrap(), 10);
            assert_eq!(p.values().unwrap(), Values::Round);
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Params::parse(r#"{"bins": 3, "binz": 4}"#, &["bins", "values"]).unwrap_err();
        assert_eq!(e, "unknown parameter \"binz\" (known: bins, values)");
        let e = Params::parse(r#"{"x": 1}"#, &[]).unwrap_err();
        assert_eq!(e, "unknown parameter \"x\" (known: none)");
    }

    #[test]
    fn bad_json_and_non_objects_are_refused() {
        assert!(
            Params::parse("{", &[])
                .unwrap_err()
                .starts_with("parameters are not valid JSON: ")
        );
        assert_eq!(
            Params::parse("[1]", &[]).unwrap_err(),
            "parameters must be a JSON object, got an array"
        );
        assert_eq!(
            Params::parse("3", &[]).unwrap_err(),
            "parameters must be a JSON object, got 3"
        );
    }

    #[test]
    fn integers_are_range_checked() {
        let get = |text: &str| {
            Params::parse(text, &["bins"])
                .unwrap()
                .u32_between("bins", 10, 1, 10000)
        };
        assert_eq!(get(r#"{"bins": 7}"#).unwrap(), 7);
        assert_eq!(get(r#"{"bins": 10000}"#).unwrap(), 10000);
        assert_eq!(
            get(r#"{"bins": 0}"#).unwrap_err(),
            "bins must be between 1 and 10000, got 0"
        );
        assert_eq!(
            get(r#"{"bins": -2}"#).unwrap_err(),
            "bins must be between 1 and 10000, got -2"
        );
        assert_eq!(
            get(r#"{"bins": 10001}"#).unwrap_err(),
            "bins must be between 1 and 10000, got 10001"
        );
        assert_eq!(
            get(r#"{"bins": 18446744073709551615}"#).unwrap_err(),
            "bins must be between 1 and 10000, got 18446744073709551615"
        );
        assert_eq!(
            get(r#"{"bins": 2.5}"#).unwrap_err(),
            "bins must be an integer between 1 and 10000, got 2.5"
        );
        assert_eq!(
            get(r#"{"bins": "5"}"#).unwrap_err(),
            "bins must be an integer between 1 and 10000, got \"5\""
        );
        assert_eq!(
            get(r#"{"bins": null}"#).unwrap_err(),
            "bins must be an integer between 1 and 10000, got null"
        );
    }

    #[test]
    fn booleans() {
        let get = |text: &str| Params::parse(text, &["on"]).unwrap().bool("on", false);
        assert_eq!(get("{}"), Ok(false));
        assert_eq!(get(r#"{"on": true}"#), Ok(true));
        assert_eq!(get(r#"{"on": false}"#), Ok(false));
        assert_eq!(
            get(r#"{"on": 1}"#).unwrap_err(),
            "on must be true or false, got 1"
        );
        assert_eq!(
            get(r#"{"on": "yes"}"#).unwrap_err(),
            "on must be true or false, got \"yes\""
        );
    }

    #[test]
    fn numbers() {
        let get = |text: &str| Params::parse(text, &["f"]).unwrap().number("f");
        assert_eq!(get("{}"), Ok(None));
        assert_eq!(get(r#"{"f": 0.25}"#), Ok(Some(0.25)));
        assert_eq!(get(r#"{"f": 3}"#), Ok(Some(3.0)));
        assert_eq!(
            get(r#"{"f": "0.1"}"#).unwrap_err(),
            "f must be a number, got \"0.1\""
        );
    }

    #[test]
    fn values_choice() {
        let get = |text: &str| Params::parse(text, &["values"]).unwrap().values();
        assert_eq!(get(r#"{"values": "round"}"#).unwrap(), Values::Round);
        assert_eq!(get(r#"{"values": "cumulative"}"#).unwrap(), Values::Cumulative);
        assert_eq!(
            get(r#"{"values": "total"}"#).unwrap_err(),
            "values must be one of \"round\", \"cumulative\", got \"total\""
        );
        assert_eq!(
            get(r#"{"values": 1}"#).unwrap_err(),
            "values must be a string, got 1"
        );
    }
}
