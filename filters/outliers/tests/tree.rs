//! The outliers filter over random trees equals scoring all ranks at once: every group's rank count, its top
//! ranks identical, their scores within 1e-9 relative and their weighing events, for both `within` modes,
//! weighted or not, by count or fraction, over each metric, all of them at once, and each event selection, each
//! round alone or over a window of rounds.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_filter_outliers::OutliersFilter;
use canopy_filter_outliers::score::ROUNDING;
use canopy_filter_proto::v1::{Metric, OutliersResult};
use canopy_filter_test::{Case, Rng, Tree};
use canopy_wire::v1::{CounterSample, EventSample, RankProfile};
use proptest::prelude::*;
use prost::Message;
use regex_lite::Regex;

const EVENTS: [&str; 6] = [
    "MPI_Allreduce()",
    "MPI_Send()",
    "main",
    "solve",
    "io",
    // Every rank that reports it spends the same time in it: it deviates nowhere and adds nothing.
    "constant",
];
const COUNTERS: [&str; 2] = ["bytes sent", "cache misses"];

const PATTERNS: [Option<&str>; 3] = [None, Some("^MPI_"), Some("o")];

fn names() -> Vec<(u64, String)> {
    EVENTS
        .iter()
        .chain(&COUNTERS)
        .map(|n| (canopy_wire::event_id(n), n.to_string()))
        .collect()
}

/// Profiles with continuous values, so that no two ranks tie unless their values are the same: each rank
/// reports a random subset of the events; a few ranks are slowed down.
fn profiles(rng: &mut Rng, ranks: usize, round: u64) -> Vec<RankProfile> {
    (0..ranks)
        .map(|slot| {
            let slow = if rng.chance(0.1) {
                1.0 + 4.0 * rng.unit()
            } else {
                1.0
            };
            let mut events = Vec::new();
            for (i, name) in EVENTS.iter().enumerate() {
                if rng.chance(0.75) {
                    let base = 10.0 * (i + 1) as f64;
                    let t = if *name == "constant" {
                        5.0
                    } else {
                        base * (1.0 + 0.3 * rng.unit()) * slow
                    };
                    events.push(EventSample {
                        event_id: canopy_wire::event_id(name),
                        calls: rng.between(1, 1000) as u64,
                        incl_us: t * (1.0 + rng.unit()),
                        excl_us: t,
                        ..Default::default()
                    });
                }
            }
            let mut counters = Vec::new();
            for n in COUNTERS {
                if rng.chance(0.6) {
                    counters.push(CounterSample {
                        counter_id: canopy_wire::event_id(n),
                        value: 1000.0 * rng.unit() - 200.0,
                        total: 0.0,
                    });
                }
            }
            RankProfile {
                app: if rng.chance(0.3) { "beta" } else { "alpha" }.into(),
                rank: slot as u32,
                round,
                events,
                counters,
                ..Default::default()
            }
        })
        .collect()
}

fn case(seed: u64, ranks: usize, rounds: usize) -> Case {
    let mut rng = Rng::new(seed);
    let tree = Tree::random(&mut rng, 4, 16, 200);
    let placement = tree.place(&mut rng, ranks);
    let profiles = (0..rounds).map(|r| profiles(&mut rng, ranks, r as u64)).collect();
    Case::new(tree, placement, profiles, names())
}

#[derive(Debug, Clone)]
struct Setup {
    metric: Metric,
    pattern: Option<&'static str>,
    by_class: bool,
    by_app: bool,
    weighted: bool,
    /// `k`, or with `fraction` the fraction.
    k: u32,
    fraction: Option<f64>,
    top_events: u32,
    window: u32,
    /// The window's statistic: "median" or "sum".
    window_stat: &'static str,
    /// The deviations within which a value adds nothing.
    margin: f64,
}

impl Setup {
    fn params(&self) -> String {
        let metric = match self.metric {
            Metric::Calls => "calls",
            Metric::Inclusive => "inclusive",
            Metric::Counter => "counter",
            Metric::Unspecified => "all",
            _ => "exclusive",
        };
        let keep = match self.fraction {
            Some(f) => format!(r#""fraction": {f}"#),
            None => format!(r#""k": {}"#, self.k),
        };
        let events = match self.pattern {
            None => String::new(),
            Some(p) => format!(r#", "events": "pattern", "pattern": "{p}""#),
        };
        format!(
            r#"{{{keep}, "metric": "{metric}", "within": "{}", "weighted": {}, "top_events": {}, "by_app": {}, "window": {}, "window_stat": "{}", "margin": {}{events}}}"#,
            if self.by_class { "class" } else { "all" },
            self.weighted,
            self.top_events,
            self.by_app,
            self.window,
            self.window_stat,
            self.margin
        )
    }

    fn keep(&self, ranks: usize) -> usize {
        match self.fraction {
            // The fractions drawn make whole products exact or leave them clearly apart.
            Some(f) => ((f * ranks as f64) - 1e-9).ceil().max(0.0) as usize,
            None => self.k as usize,
        }
    }
}

/// One rank as the reference scores it.
#[derive(Debug, Clone)]
struct Scored {
    app: String,
    rank: u32,
    score: f64,
    /// ((id, metric), contribution) of every event that adds to the score; the metric is 0 when one is scored.
    all_events: Vec<((u64, i32), f64)>,
}

/// A rank's profile and its ((event id, metric), value) pairs, sorted by key.
type Member<'a> = (&'a RankProfile, Vec<((u64, i32), f64)>);

/// A rank's values of `metric` (every event's, or every counter's).
fn values_of(p: &RankProfile, metric: Metric) -> Vec<((u64, i32), f64)> {
    let m = metric as i32;
    match metric {
        Metric::Counter => p.counters.iter().map(|c| ((c.counter_id, m), c.value)).collect(),
        Metric::Calls => p
            .events
            .iter()
            .map(|e| ((e.event_id, m), e.calls as f64))
            .collect(),
        Metric::Inclusive => p.events.iter().map(|e| ((e.event_id, m), e.incl_us)).collect(),
        _ => p.events.iter().map(|e| ((e.event_id, m), e.excl_us)).collect(),
    }
}

/// A rank's values in the stream's metrics over the rounds of the window ending at round `r` that it reported
/// (`rounds[k]` is round k's profiles): per key, the median (an absent key counting 0 in a round) or the sum.
fn windowed(rounds: &[Vec<RankProfile>], r: usize, p: &RankProfile, setup: &Setup) -> Vec<((u64, i32), f64)> {
    let first = (r + 1).saturating_sub(setup.window as usize);
    let mut per_round: Vec<BTreeMap<(u64, i32), f64>> = Vec::new();
    for round in &rounds[first..=r] {
        let Some(q) = round
            .iter()
            .find(|q| (q.app.as_str(), q.rank) == (p.app.as_str(), p.rank))
        else {
            continue;
        };
        let values: Vec<((u64, i32), f64)> = match setup.metric {
            // "all": exclusive time, calls and counters.
            Metric::Unspecified => [Metric::Exclusive, Metric::Calls, Metric::Counter]
                .into_iter()
                .flat_map(|m| values_of(q, m))
                .collect(),
            m => values_of(q, m),
        };
        per_round.push(
            values
                .into_iter()
                .filter(|((id, _), _)| setup.selected(*id))
                .collect(),
        );
    }
    let keys: BTreeSet<(u64, i32)> = per_round.iter().flat_map(|m| m.keys().copied()).collect();
    keys.into_iter()
        .map(|key| {
            let mut vs: Vec<f64> = per_round
                .iter()
                .map(|m| m.get(&key).copied().unwrap_or(0.0))
                .collect();
            let v = if setup.window <= 1 {
                vs[0]
            } else if setup.window_stat == "sum" {
                per_round.iter().filter_map(|m| m.get(&key)).sum()
            } else {
                vs.sort_by(f64::total_cmp);
                let n = vs.len();
                if n % 2 == 1 {
                    vs[n / 2]
                } else {
                    vs[n / 2 - 1] / 2.0 + vs[n / 2] / 2.0
                }
            };
            (key, v)
        })
        .collect()
}

impl Setup {
    /// Whether the stream's event selection takes event `id`.
    fn selected(&self, id: u64) -> bool {
        let names: HashMap<u64, String> = names().into_iter().collect();
        let name = names.get(&id).cloned().unwrap_or_else(|| format!("{id:016x}"));
        self.pattern
            .is_none_or(|p| Regex::new(p).unwrap().is_match(&name))
    }
}

/// Every group of round `r` scored directly, over all its ranks at once: class id → (ranks, every rank in
/// order).
fn reference(rounds: &[Vec<RankProfile>], r: usize, setup: &Setup) -> BTreeMap<u64, (usize, Vec<Scored>)> {
    let profiles = &rounds[r];
    let names: HashMap<u64, String> = names().into_iter().collect();
    let re = setup.pattern.map(|p| Regex::new(p).unwrap());
    let name_of = |id: u64| names.get(&id).cloned().unwrap_or_else(|| format!("{id:016x}"));
    let selected = |id: u64| re.as_ref().is_none_or(|re| re.is_match(&name_of(id)));
    // Each rank's class and its (id, value) pairs of the metric.
    let mut groups: BTreeMap<u64, Vec<Member<'_>>> = BTreeMap::new();
    for p in profiles {
        // Per application, the application's name and a NUL lead what the class id hashes.
        let app = if setup.by_app {
            format!("{}\0", p.app)
        } else {
            String::new()
        };
        let class = if setup.by_class {
            let chosen: BTreeSet<String> = p
                .events
                .iter()
                .map(|e| e.event_id)
                .filter(|id| selected(*id))
                .map(name_of)
                .collect();
            canopy_wire::event_id(&format!(
                "{app}{}",
                chosen.into_iter().collect::<Vec<_>>().join("\n")
            ))
        } else if setup.by_app {
            canopy_wire::event_id(&app)
        } else {
            0
        };
        groups
            .entry(class)
            .or_default()
            .push((p, windowed(rounds, r, p, setup)));
    }
    groups
        .into_iter()
        .map(|(class, members)| {
            // Two passes per event: the mean, then the population deviation.
            let mut by_event: BTreeMap<(u64, i32), Vec<f64>> = BTreeMap::new();
            for (_, values) in &members {
                for (id, v) in values {
                    by_event.entry(*id).or_default().push(*v);
                }
            }
            let moments: BTreeMap<(u64, i32), (f64, f64)> = by_event
                .iter()
                .map(|(id, vs)| {
                    let n = vs.len() as f64;
                    let mean = vs.iter().sum::<f64>() / n;
                    let var = vs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
                    (*id, (mean, var.sqrt()))
                })
                .collect();
            // Each metric weighs its events within itself, over the events two ranks or more report.
            let total = |metric: i32| -> f64 {
                moments
                    .iter()
                    .filter(|(key, _)| by_event[key].len() >= 2)
                    .filter(|((_, m), _)| *m == metric)
                    .map(|(_, (mean, _))| mean.abs())
                    .sum()
            };
            let weight = |mean: f64, metric: i32| {
                let total = total(metric);
                if !setup.weighted {
                    1.0
                } else if total > 0.0 {
                    mean.abs() / total
                } else {
                    0.0
                }
            };
            let mut scored: Vec<Scored> = members
                .iter()
                .map(|(p, values)| {
                    let mut events: Vec<((u64, i32), f64)> = values
                        .iter()
                        .map(|(key, v)| {
                            let (mean, std) = moments[key];
                            // Within rounding of the mean is no deviation, as the filter counts it.
                            let deviation = (v - mean).abs();
                            let c = if std > 0.0 && deviation > ROUNDING * v.abs().max(mean.abs()) {
                                canopy_filter_outliers::score::beyond(deviation / std, setup.margin)
                                    * weight(mean, key.1)
                            } else {
                                0.0
                            };
                            let shown = if setup.metric == Metric::Unspecified {
                                key.1
                            } else {
                                0
                            };
                            ((key.0, shown), c)
                        })
                        .collect();
                    let score = events.iter().fold(0.0, |s, e| s + e.1);
                    events.retain(|e| e.1 > 0.0);
                    Scored {
                        app: p.app.clone(),
                        rank: p.rank,
                        score,
                        all_events: events,
                    }
                })
                .collect();
            scored.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then_with(|| a.app.cmp(&b.app))
                    .then(a.rank.cmp(&b.rank))
            });
            (class, (scored.len(), scored))
        })
        .collect()
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * got.abs().max(want.abs())
}

/// Whether `got` is the first `keep` of `all` (sorted, largest value first, ties by key): the same length, the
/// same key at every position, and values within 1e-9 relative. Values that are equal in exact arithmetic
/// (two ranks of a class of two lie equally far from their mean) may differ in their last bits between two
/// ways of summing, so where `all` holds values that close, the keys among them may come in either order; any
/// other difference is a failure.
fn same_up_to_ties<K: PartialEq + Copy + std::fmt::Debug>(
    got: &[(K, f64)],
    all: &[(K, f64)],
    keep: usize,
) -> Result<(), String> {
    let n = keep.min(all.len());
    if got.len() != n {
        return Err(format!("{} kept, expected {n}", got.len()));
    }
    for (i, (key, value)) in got.iter().enumerate() {
        let (want_key, want_value) = all[i];
        if !close(*value, want_value) {
            return Err(format!(
                "at {i}: {key:?} with {value}, expected {want_key:?} with {want_value}"
            ));
        }
        if *key == want_key {
            continue;
        }
        // Another key is only right if it ties with this position's value.
        let own = all.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        if !own.is_some_and(|own| close(own, want_value)) {
            return Err(format!(
                "at {i}: {key:?} ({own:?}), expected {want_key:?} with {want_value}"
            ));
        }
        if got[..i].iter().any(|(k, _)| k == key) {
            return Err(format!("{key:?} twice"));
        }
    }
    Ok(())
}

fn check(c: &Case, setup: &Setup, seed: u64) -> Result<(), TestCaseError> {
    let out = c
        .run::<OutliersFilter>(&setup.params(), seed)
        .map_err(TestCaseError::fail)?;
    prop_assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    prop_assert_eq!(out.results.len(), c.profiles.len());
    for r in 0..c.profiles.len() {
        let result = OutliersResult::decode(out.results[&(r as u64, 2)].as_slice()).unwrap();
        let want = reference(&c.profiles, r, setup);
        prop_assert_eq!(
            result.groups.iter().map(|g| g.class_id).collect::<Vec<_>>(),
            want.keys().copied().collect::<Vec<_>>(),
            "groups ({})",
            c.tree.describe()
        );
        for g in &result.groups {
            let (ranks, top) = &want[&g.class_id];
            // Per application a group names its application, which every one of its ranks belongs to.
            if setup.by_app {
                prop_assert!(
                    top.iter().all(|o| o.app == g.app),
                    "group {:016x} is of {}",
                    g.class_id,
                    g.app
                );
            } else {
                prop_assert_eq!(&g.app, "");
            }
            prop_assert_eq!(g.ranks as usize, *ranks);
            prop_assert_eq!(g.keep as usize, setup.keep(*ranks));
            prop_assert!(g.summaries.is_none());
            let got: Vec<((&str, u32), f64)> = g
                .top
                .iter()
                .map(|o| ((o.app.as_str(), o.rank), o.score))
                .collect();
            let all: Vec<((&str, u32), f64)> =
                top.iter().map(|o| ((o.app.as_str(), o.rank), o.score)).collect();
            same_up_to_ties(&got, &all, setup.keep(*ranks)).map_err(|e| {
                TestCaseError::fail(format!(
                    "group {:016x} round {r}: {e} ({})",
                    g.class_id,
                    c.tree.describe()
                ))
            })?;
            for o in &g.top {
                let want = top
                    .iter()
                    .find(|w| (w.app.as_str(), w.rank) == (o.app.as_str(), o.rank))
                    .unwrap();
                let got: Vec<((u64, i32), f64)> = o
                    .events
                    .iter()
                    .map(|e| ((e.id, e.metric), e.contribution))
                    .collect();
                let mut all: Vec<((u64, i32), f64)> = want.all_events.clone();
                all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                same_up_to_ties(&got, &all, setup.top_events as usize)
                    .map_err(|e| TestCaseError::fail(format!("events of {}:{}: {e}", o.app, o.rank)))?;
            }
        }
        prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
        prop_assert_eq!(result.within, if setup.by_class { "class" } else { "all" });
        prop_assert_eq!(result.weighted, setup.weighted);
        prop_assert_eq!(result.metric, setup.metric as i32);
        let metrics = match setup.metric {
            Metric::Unspecified => vec![
                Metric::Calls as i32,
                Metric::Exclusive as i32,
                Metric::Counter as i32,
            ],
            m => vec![m as i32],
        };
        prop_assert_eq!(&result.metrics, &metrics);
    }
    Ok(())
}

/// Unspecified stands for "all".
const METRICS: [Metric; 5] = [
    Metric::Unspecified,
    Metric::Exclusive,
    Metric::Inclusive,
    Metric::Calls,
    Metric::Counter,
];
const FRACTIONS: [Option<f64>; 4] = [None, Some(0.1), Some(0.25), Some(1.0)];
/// Margins drawn: the paper's whole distances, the default, and a fraction.
const MARGINS: [f64; 3] = [0.0, 1.0, 0.5];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn tree_equals_scoring_all_ranks_at_once(
        seed in any::<u64>(),
        ranks in 0usize..150,
        rounds in 1usize..4,
        metric in 0usize..METRICS.len(),
        pattern in 0usize..PATTERNS.len(),
        by_class in any::<bool>(),
        by_app in any::<bool>(),
        weighted in any::<bool>(),
        k in 1u32..12,
        fraction in 0usize..FRACTIONS.len(),
        top_events in 0u32..5,
        window in 1u32..4,
        sum in any::<bool>(),
        margin in 0usize..MARGINS.len(),
    ) {
        let c = case(seed, ranks, rounds);
        let setup = Setup {
            metric: METRICS[metric],
            pattern: PATTERNS[pattern],
            by_class,
            by_app,
            weighted,
            k,
            fraction: FRACTIONS[fraction],
            top_events,
            window,
            window_stat: if sum { "sum" } else { "median" },
            margin: MARGINS[margin],
        };
        check(&c, &setup, seed ^ 0x0a7)?;
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 0usize..80, by_class in any::<bool>()) {
        let c = case(seed, ranks, 2);
        let params = format!(r#"{{"within": "{}", "weighted": true}}"#, if by_class { "class" } else { "all" });
        let a = c.run::<OutliersFilter>(&params, seed).unwrap().results;
        let b = c.run::<OutliersFilter>(&params, seed.wrapping_add(1)).unwrap().results;
        prop_assert_eq!(a, b);
    }
}

/// The standard filters' random data (zeros, shared values, 1e15 next to 1e-12) goes through without a
/// rejection, and every score is a finite, non-negative number in order.
#[test]
fn edge_values_are_scored_without_rejection() {
    for seed in 0..40 {
        let c = Case::random(seed, 60, 2, &canopy_filter_test::DataSpec::default());
        for params in [
            r#"{"k": 5}"#,
            r#"{"within": "class", "weighted": true, "fraction": 0.5}"#,
        ] {
            let out = c.run::<OutliersFilter>(params, seed).unwrap();
            assert!(out.rejects.is_empty(), "{:?}", out.rejects);
            for bytes in out.results.values() {
                let r = OutliersResult::decode(bytes.as_slice()).unwrap();
                for g in &r.groups {
                    assert!(g.top.len() <= g.keep as usize);
                    assert!(g.top.iter().all(|o| o.score.is_finite() && o.score >= 0.0));
                    assert!(g.top.windows(2).all(|w| w[0].score >= w[1].score));
                }
            }
        }
    }
}
