//! The classify filter over random trees equals classifying all ranks at once: memberships exactly, and
//! within each class the summaries and brute-force histograms.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_filter_classify::ClassifyFilter;
use canopy_filter_proto::v1::{ClassResult, RankRange};
use canopy_filter_test::reference;
use canopy_filter_test::{Case, DataSpec};
use canopy_wire::v1::RankProfile;
use proptest::prelude::*;
use prost::Message;
use regex_lite::Regex;

const PATTERNS: [Option<&str>; 5] = [
    None,
    Some("^MPI_"),
    Some("^Patch 1 ->"),
    Some("^[0-9a-f]{16}$"),
    Some("e"),
];

/// The class of every rank, computed directly: (class id, first selected name) → member profiles.
fn classify<'a>(
    profiles: &'a [RankProfile],
    names: &HashMap<u64, String>,
    pattern: Option<&Regex>,
) -> BTreeMap<u64, (String, Vec<&'a RankProfile>)> {
    let mut classes: BTreeMap<u64, (String, Vec<&RankProfile>)> = BTreeMap::new();
    for p in profiles {
        let selected: BTreeSet<String> = p
            .events
            .iter()
            .map(|e| {
                names
                    .get(&e.event_id)
                    .cloned()
                    .unwrap_or_else(|| format!("{:016x}", e.event_id))
            })
            .filter(|n| pattern.is_none_or(|re| re.is_match(n)))
            .collect();
        let joined: Vec<&str> = selected.iter().map(String::as_str).collect();
        let id = canopy_wire::event_id(&joined.join("\n"));
        let first = selected.iter().next().cloned().unwrap_or_default();
        classes.entry(id).or_insert_with(|| (first, Vec::new())).1.push(p);
    }
    classes
}

/// Members as ranges, built directly: per app, sorted ranks split where they stop being consecutive.
fn ranges(members: &[&RankProfile]) -> Vec<RankRange> {
    let sorted: BTreeSet<(&str, u32)> = members.iter().map(|p| (p.app.as_str(), p.rank)).collect();
    let mut out: Vec<RankRange> = Vec::new();
    for (app, rank) in sorted {
        match out.last_mut() {
            Some(r) if r.app == app && r.last + 1 == rank => r.last = rank,
            _ => out.push(RankRange {
                app: app.to_string(),
                first: rank,
                last: rank,
            }),
        }
    }
    out
}

fn check(c: &Case, pattern: Option<&str>, bins: usize, seed: u64) -> Result<(), TestCaseError> {
    let params = match pattern {
        None => format!(r#"{{"bins": {bins}}}"#),
        Some(p) => format!(
            r#"{{"bins": {bins}, "scheme": "pattern", "pattern": "{}"}}"#,
            p.replace('\\', "\\\\")
        ),
    };
    let out = c
        .run::<ClassifyFilter>(&params, seed)
        .map_err(TestCaseError::fail)?;
    prop_assert!(out.rejects.is_empty());
    prop_assert_eq!(out.results.len(), c.profiles.len());
    let names: HashMap<u64, String> = c.names.iter().cloned().collect();
    let re = pattern.map(|p| Regex::new(p).unwrap());
    for r in 0..c.profiles.len() {
        let result = ClassResult::decode(out.results[&(r as u64, 2)].as_slice()).unwrap();
        let want = classify(&c.profiles[r], &names, re.as_ref());
        prop_assert_eq!(
            result.classes.iter().map(|k| k.class_id).collect::<Vec<_>>(),
            want.keys().copied().collect::<Vec<_>>(),
            "class ids ({})",
            c.tree.describe()
        );
        for class in &result.classes {
            let (example, members) = &want[&class.class_id];
            prop_assert_eq!(&class.ranks, &ranges(members));
            prop_assert_eq!(class.size as usize, members.len());
            prop_assert_eq!(&class.example_event, example);
            let samples = reference::samples(members.iter().copied(), false);
            let keys: Vec<_> = samples.keys().copied().collect();
            prop_assert_eq!(
                &class.stats.iter().map(|s| (s.id, s.metric)).collect::<Vec<_>>(),
                &keys
            );
            prop_assert_eq!(
                &class
                    .histograms
                    .iter()
                    .map(|h| (h.id, h.metric))
                    .collect::<Vec<_>>(),
                &keys
            );
            for (es, h) in class.stats.iter().zip(&class.histograms) {
                let what = format!(
                    "round {r} class {:016x} {:016x}/{}",
                    class.class_id, es.id, es.metric
                );
                let values = &samples[&(es.id, es.metric)];
                reference::check_summary(&what, es.summary.as_ref().unwrap(), values)
                    .map_err(TestCaseError::fail)?;
                reference::check_histogram(&what, h, values, bins).map_err(TestCaseError::fail)?;
            }
        }
        prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
        prop_assert_eq!(result.bins as usize, bins);
        prop_assert_eq!(
            result.scheme,
            pattern.map_or("all".to_string(), |p| format!("pattern:{p}"))
        );
        let mut bare = ClassResult::decode(out.results[&(r as u64, 2)].as_slice()).unwrap();
        bare.result_bytes = 0;
        bare.reduction_factor = 0.0;
        prop_assert_eq!(result.result_bytes, bare.encoded_len() as u64);
        prop_assert_eq!(
            result.reduction_factor,
            result.raw_bytes as f64 / result.result_bytes as f64
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_direct_classification(
        seed in any::<u64>(),
        ranks in 0usize..120,
        rounds in 1usize..4,
        bins in 1usize..=8,
        scheme in 0usize..PATTERNS.len(),
        forget_a_name in any::<bool>(),
    ) {
        let mut c = Case::random(seed, ranks, rounds, &DataSpec::default());
        if forget_a_name {
            // The leaves never learn this name: its hex id stands in for it, in the filter as in `classify`.
            c.names.retain(|(_, n)| n != "solve");
        }
        check(&c, PATTERNS[scheme], bins, seed ^ 0xc1a55)?;
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 0usize..80) {
        let c = Case::random(seed, ranks, 2, &DataSpec::default());
        let a = c.run::<ClassifyFilter>("{}", seed).unwrap().results;
        let b = c.run::<ClassifyFilter>("{}", seed.wrapping_add(1)).unwrap().results;
        prop_assert_eq!(a, b);
    }
}
