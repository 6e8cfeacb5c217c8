//! `canopy watch --json`: each update as one JSON object a line, with a top-level `"names"` object mapping
//! every event id the update holds (as proto3 JSON writes a 64-bit id: a decimal string) to its name.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// The fields whose values are event ids: a summary's or histogram's `id`, a class's `events`, a utilization
/// result's `activities`.
const ID_FIELDS: [&str; 3] = ["id", "events", "activities"];

fn collect(v: &Value, names: &HashMap<u64, String>, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if ID_FIELDS.contains(&k.as_str()) {
                    let ids: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        other => vec![other],
                    };
                    for id in ids {
                        let Some(text) = id.as_str() else { continue };
                        if let Some(name) = text.parse::<u64>().ok().and_then(|n| names.get(&n)) {
                            out.insert(text.to_string(), name.clone());
                        }
                    }
                } else {
                    collect(v, names, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect(v, names, out)),
        _ => {}
    }
}

/// The update's JSON with its `"names"`; JSON that does not parse is returned as it is.
pub fn with_names(json: &str, names: &HashMap<u64, String>) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(json) else {
        return json.to_string();
    };
    let mut found = BTreeMap::new();
    collect(&v, names, &mut found);
    if let Value::Object(map) = &mut v {
        map.insert(
            "names".into(),
            Value::Object(found.into_iter().map(|(k, n)| (k, Value::String(n))).collect()),
        );
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_id_of_an_update_gets_its_name() {
        let names: HashMap<u64, String> = [
            (17, "MPI_Allreduce".to_string()),
            (18446744073709551615, "compute".to_string()),
            (5, "unused".to_string()),
        ]
        .into();
        let json = r#"{"stream":"stats","round":"4","result":{"stats":[{"id":"17","metric":"METRIC_EXCLUSIVE"},
            {"id":"18446744073709551615"},{"id":"99"}],"classes":[{"events":["17","99"]}]}}"#;
        let out = with_names(json, &names);
        assert!(!out.contains('\n'));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["names"]["17"], "MPI_Allreduce");
        assert_eq!(v["names"]["18446744073709551615"], "compute");
        // Ids without a known name, and names of ids the update does not hold, are left out.
        assert_eq!(v["names"].as_object().unwrap().len(), 2, "{v}");
        assert_eq!(v["result"]["stats"][0]["metric"], "METRIC_EXCLUSIVE");
        assert_eq!(with_names("not json", &names), "not json");
    }
}
