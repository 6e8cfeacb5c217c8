//! The classify filter over random trees equals classifying all ranks at once: memberships exactly, the ranges
//! (each event's min and max over every rank), within each class the brute-force histograms against them, and
//! the summaries when asked for; per application by default, over every application with `by_app: false`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_filter_classify::ClassifyFilter;
use canopy_filter_proto::v1::{ClassResult, Metric, RankRange};
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
    by_app: bool,
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
        let id = if by_app {
            canopy_wire::event_id(&format!("{}\0{}", p.app, joined.join("\n")))
        } else {
            canopy_wire::event_id(&joined.join("\n"))
        };
        let first = selected.iter().next().cloned().unwrap_or_default();
        classes.entry(id).or_insert_with(|| (first, Vec::new())).1.push(p);
    }
    classes
}

/// Members as ranges, built directly: per app, sorted ranks split where they stop being consecutive.
fn ranges_of(members: &[&RankProfile]) -> Vec<RankRange> {
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

/// The parameters of one run.
struct Setup {
    pattern: Option<&'static str>,
    bins: usize,
    metric: Metric,
    summaries: bool,
    cumulative: bool,
    by_app: bool,
}

impl Setup {
    fn params(&self) -> String {
        let word = match self.metric {
            Metric::Calls => "calls",
            Metric::Inclusive => "inclusive",
            Metric::Counter => "counter",
            _ => "exclusive",
        };
        let values = if self.cumulative { "cumulative" } else { "round" };
        let scheme = match self.pattern {
            None => String::new(),
            Some(p) => format!(
                r#", "scheme": "pattern", "pattern": "{}""#,
                p.replace('\\', "\\\\")
            ),
        };
        format!(
            r#"{{"bins": {}, "metric": "{word}", "summaries": {}, "values": "{values}", "by_app": {}{scheme}}}"#,
            self.bins, self.summaries, self.by_app
        )
    }
}

/// The finite values of `metric` over `profiles`, per id, straight from the profile fields.
fn values_of<'a>(
    profiles: impl IntoIterator<Item = &'a RankProfile>,
    setup: &Setup,
) -> BTreeMap<u64, Vec<reference::Sample>> {
    reference::samples(profiles, setup.cumulative)
        .into_iter()
        .filter(|((_, metric), _)| *metric == setup.metric as i32)
        .map(|((id, _), values)| {
            (
                id,
                values.into_iter().filter(|v| v.0.is_finite()).collect::<Vec<_>>(),
            )
        })
        .filter(|(_, values)| !values.is_empty())
        .collect()
}

/// Counts by brute force, by the documented formula, between a given lo and hi.
fn binned(values: &[reference::Sample], lo: f64, hi: f64, bins: usize) -> Vec<u64> {
    let mut counts = vec![0u64; bins];
    for v in values {
        let i = if lo == hi {
            0
        } else {
            ((v.0 - lo) / (hi - lo) * bins as f64).floor() as usize
        };
        counts[i.min(bins - 1)] += 1;
    }
    counts
}

fn check(c: &Case, setup: &Setup, seed: u64) -> Result<(), TestCaseError> {
    let out = c
        .run::<ClassifyFilter>(&setup.params(), seed)
        .map_err(TestCaseError::fail)?;
    prop_assert!(out.rejects.is_empty());
    prop_assert_eq!(out.results.len(), c.profiles.len());
    let names: HashMap<u64, String> = c.names.iter().cloned().collect();
    let re = setup.pattern.map(|p| Regex::new(p).unwrap());
    let bins = setup.bins;
    for r in 0..c.profiles.len() {
        let result = ClassResult::decode(out.results[&(r as u64, 2)].as_slice()).unwrap();
        let want = classify(&c.profiles[r], &names, re.as_ref(), setup.by_app);
        prop_assert_eq!(
            result.classes.iter().map(|k| k.class_id).collect::<Vec<_>>(),
            want.keys().copied().collect::<Vec<_>>(),
            "class ids ({})",
            c.tree.describe()
        );
        // One range per event over every rank of the round: its min and max.
        let everyone = values_of(&c.profiles[r], setup);
        let ranges = result.ranges.clone().unwrap_or_default();
        prop_assert_eq!(&ranges.id, &everyone.keys().copied().collect::<Vec<_>>());
        let mut range: HashMap<u64, (f64, f64)> = HashMap::new();
        for (i, (id, values)) in everyone.iter().enumerate() {
            let lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
            let hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
            prop_assert_eq!((ranges.lo[i], ranges.hi[i]), (lo, hi), "range of {:016x}", id);
            range.insert(*id, (lo, hi));
        }
        for class in &result.classes {
            let (example, members) = &want[&class.class_id];
            prop_assert_eq!(&class.ranks, &ranges_of(members));
            prop_assert_eq!(class.size as usize, members.len());
            prop_assert_eq!(&class.example_event, example);
            let values = values_of(members.iter().copied(), setup);
            prop_assert_eq!(&class.events, &values.keys().copied().collect::<Vec<_>>());
            let mut counts = Vec::new();
            for (id, vs) in &values {
                let (lo, hi) = range[id];
                counts.extend(binned(vs, lo, hi, bins));
            }
            prop_assert_eq!(&class.counts, &counts, "counts of class {:016x}", class.class_id);
            // As the store reads them.
            let histograms = result.histograms_of(class).map_err(TestCaseError::fail)?;
            prop_assert_eq!(histograms.len(), values.len());
            for (h, (id, vs)) in histograms.iter().zip(&values) {
                prop_assert_eq!((h.id, h.metric), (*id, setup.metric as i32));
                prop_assert_eq!((h.lo, h.hi), range[id]);
                prop_assert_eq!(&h.counts, &binned(vs, range[id].0, range[id].1, bins));
            }
            if setup.summaries {
                prop_assert_eq!(
                    class.stats.iter().map(|s| (s.id, s.metric)).collect::<Vec<_>>(),
                    values
                        .keys()
                        .map(|id| (*id, setup.metric as i32))
                        .collect::<Vec<_>>()
                );
                for (es, vs) in class.stats.iter().zip(values.values()) {
                    let what = format!("round {r} class {:016x} {:016x}", class.class_id, es.id);
                    reference::check_summary(&what, es.summary.as_ref().unwrap(), vs)
                        .map_err(TestCaseError::fail)?;
                }
            } else {
                prop_assert!(class.stats.is_empty());
            }
        }
        prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
        prop_assert_eq!(result.bins as usize, bins);
        prop_assert_eq!(result.metric, setup.metric as i32);
        prop_assert_eq!(
            result.scheme,
            setup
                .pattern
                .map_or("all".to_string(), |p| format!("pattern:{p}"))
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

const METRICS: [Metric; 4] = [
    Metric::Exclusive,
    Metric::Inclusive,
    Metric::Calls,
    Metric::Counter,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_direct_classification(
        seed in any::<u64>(),
        ranks in 0usize..120,
        rounds in 1usize..4,
        bins in 1usize..=8,
        scheme in 0usize..PATTERNS.len(),
        metric in 0usize..METRICS.len(),
        summaries in any::<bool>(),
        cumulative in any::<bool>(),
        forget_a_name in any::<bool>(),
        by_app in any::<bool>(),
    ) {
        let mut c = Case::random(seed, ranks, rounds, &DataSpec::default());
        if forget_a_name {
            // The leaves never learn this name: its hex id stands in for it, in the filter as in `classify`.
            c.names.retain(|(_, n)| n != "solve");
        }
        let setup = Setup {
            pattern: PATTERNS[scheme],
            bins,
            metric: METRICS[metric],
            summaries,
            cumulative,
            by_app,
        };
        check(&c, &setup, seed ^ 0xc1a55)?;
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 0usize..80, summaries in any::<bool>()) {
        let c = Case::random(seed, ranks, 2, &DataSpec::default());
        let params = format!(r#"{{"summaries": {summaries}}}"#);
        let a = c.run::<ClassifyFilter>(&params, seed).unwrap().results;
        let b = c.run::<ClassifyFilter>(&params, seed.wrapping_add(1)).unwrap().results;
        prop_assert_eq!(a, b);
    }
}
