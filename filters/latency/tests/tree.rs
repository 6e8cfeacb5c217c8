//! The latency filter over random trees equals a brute-force pairing of every rank's marks at once: each step
//! with a start and a stop is reported once, with the earliest start, the latest stop, the mark counts and
//! per application the rank dumps that marked it and their transfer and compute time; steps with one end only
//! are never reported. Marks of a step come from 2 or 3 applications, started in one round and stopped in the
//! same round or a later one.

use std::collections::BTreeMap;

use canopy_filter_latency::LatencyFilter;
use canopy_filter_proto::v1::{LatencyResult, StepApp, StepLatency};
use canopy_filter_test::{Case, DataSpec, Rng};
use canopy_wire::v1::{RankProfile, StepMark};
use proptest::prelude::*;
use prost::Message;

const KEYS: [&str; 2] = ["exchange", "checkpoint"];
const APPS: [&str; 3] = ["analysis", "simulation", "viz"];

/// A random case whose ranks belong to `apps` applications, with marks of `steps` steps per key spread over
/// the ranks and rounds.
fn with_marks(seed: u64, ranks: usize, rounds: usize, apps: usize, steps: u64) -> Case {
    let c = Case::random(seed, ranks, rounds, &DataSpec::default());
    let mut rng = Rng::new(seed ^ 0x1a7e);
    let of_slot: Vec<&str> = (0..ranks).map(|_| APPS[rng.below(apps)]).collect();
    let mut profiles = c.profiles.clone();
    for round in &mut profiles {
        for (slot, p) in round.iter_mut().enumerate() {
            p.app = of_slot[slot].into();
            if rng.chance(0.1) {
                p.marks_lost = rng.between(1, 5) as u64;
            }
        }
    }
    if ranks > 0 {
        for key in KEYS {
            let key_id = canopy_wire::event_id(key);
            for step in 0..steps {
                let start_round = rng.below(rounds);
                let stop_round = start_round + rng.below(rounds - start_round);
                // Times from a narrow range, so ties between ranks happen.
                let base = 1_000_000 + step * 100;
                let ends = [
                    (false, start_round, rng.chance(0.9)),
                    (true, stop_round, rng.chance(0.8)),
                ];
                for (stop, round, present) in ends {
                    if !present {
                        continue;
                    }
                    for _ in 0..rng.between(1, 3) {
                        let slot = rng.below(ranks);
                        profiles[round][slot].marks.push(StepMark {
                            key_id,
                            step,
                            stop,
                            unix_ns: base + rng.below(4) as u64 + if stop { 50 } else { 0 },
                        });
                    }
                }
            }
        }
    }
    let mut names = c.names.clone();
    names.extend(KEYS.iter().map(|k| (canopy_wire::event_id(k), k.to_string())));
    Case::new(c.tree, c.placement, profiles, names)
}

/// A rank's (transfer, compute) in ns: exclusive times of the events whose names match the pattern (by
/// default the MPI_ ones among the test data's) and of the others.
fn split(p: &RankProfile, names: &BTreeMap<u64, String>, pattern: &regex_lite::Regex) -> (u64, u64) {
    let (mut t, mut c) = (0.0f64, 0.0f64);
    for e in &p.events {
        let us = if e.excl_us.is_finite() {
            e.excl_us.max(0.0)
        } else {
            0.0
        };
        if names.get(&e.event_id).is_some_and(|n| pattern.is_match(n)) {
            t += us;
        } else {
            c += us;
        }
    }
    ((t * 1000.0).round() as u64, (c * 1000.0).round() as u64)
}

/// The steps every rank's marks complete, computed over all of them at once.
fn brute_force(c: &Case, pattern: &regex_lite::Regex) -> BTreeMap<(u64, u64), StepLatency> {
    #[derive(Default)]
    struct Acc {
        start: Option<(u64, String, u32)>,
        stop: Option<(u64, String, u32)>,
        starts: u32,
        stops: u32,
        apps: BTreeMap<String, (u32, u64, u64)>,
    }
    let names: BTreeMap<u64, String> = c.names.iter().cloned().collect();
    let mut acc: BTreeMap<(u64, u64), Acc> = BTreeMap::new();
    for round in &c.profiles {
        for p in round {
            let (t, comp) = split(p, &names, pattern);
            let mut marked = std::collections::BTreeSet::new();
            for m in &p.marks {
                let a = acc.entry((m.key_id, m.step)).or_default();
                let at = (m.unix_ns, p.app.clone(), p.rank);
                if m.stop {
                    a.stops += 1;
                    if a.stop.as_ref().is_none_or(|s| at > *s) {
                        a.stop = Some(at);
                    }
                } else {
                    a.starts += 1;
                    if a.start.as_ref().is_none_or(|s| at < *s) {
                        a.start = Some(at);
                    }
                }
                if marked.insert((m.key_id, m.step)) {
                    let e = a.apps.entry(p.app.clone()).or_default();
                    *e = (e.0 + 1, e.1.saturating_add(t), e.2.saturating_add(comp));
                }
            }
        }
    }
    acc.into_iter()
        .filter_map(|((key_id, step), a)| {
            let (start, stop) = (a.start?, a.stop?);
            Some((
                (key_id, step),
                StepLatency {
                    key_id,
                    step,
                    latency_ns: stop.0.saturating_sub(start.0),
                    start_unix_ns: start.0,
                    start_app: start.1,
                    start_rank: start.2,
                    stop_unix_ns: stop.0,
                    stop_app: stop.1,
                    stop_rank: stop.2,
                    starts: a.starts,
                    stops: a.stops,
                    apps: a
                        .apps
                        .into_iter()
                        .map(|(app, (ranks, t, comp))| StepApp {
                            app,
                            ranks,
                            transfer_us: t as f64 / f64::from(ranks) / 1000.0,
                            compute_us: comp as f64 / f64::from(ranks) / 1000.0,
                        })
                        .collect(),
                },
            ))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_brute_force(
        seed in any::<u64>(),
        ranks in 0usize..80,
        rounds in 1usize..5,
        apps in 2usize..4,
        steps in 0u64..12,
        custom in any::<bool>(),
    ) {
        let c = with_marks(seed, ranks, rounds, apps, steps);
        let (params, pattern) = if custom {
            (r#"{"transfer": "^solve$|^main$"}"#.to_string(), "^solve$|^main$")
        } else {
            ("{}".to_string(), canopy_filter_latency::settings::DEFAULT_TRANSFER)
        };
        let pattern = regex_lite::Regex::new(pattern).unwrap();
        let out = c.run::<LatencyFilter>(&params, seed ^ 0x5eed).unwrap();
        prop_assert!(out.rejects.is_empty(), "{:?}", out.rejects);
        prop_assert_eq!(out.results.len(), rounds, "one result per round");
        let want = brute_force(&c, &pattern);
        let mut got: BTreeMap<(u64, u64), StepLatency> = BTreeMap::new();
        for r in 0..rounds {
            let result = LatencyResult::decode(out.results[&(r as u64, 0)].as_slice()).unwrap();
            prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
            let lost: u64 = c.profiles[r].iter().map(|p| p.marks_lost).sum();
            prop_assert_eq!(result.lost, lost);
            prop_assert_eq!(result.evicted, 0);
            let keys: Vec<(u64, u64)> = result.steps.iter().map(|s| (s.key_id, s.step)).collect();
            prop_assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted: {:?}", keys);
            for s in result.steps {
                // A step completes in the finalize of a round that carries one of its marks.
                let here = c.profiles[r].iter().any(|p| p.marks.iter().any(|m| (m.key_id, m.step) == (s.key_id, s.step)));
                prop_assert!(here, "step {} reported in round {r}, which has no mark of it", s.step);
                let k = (s.key_id, s.step);
                prop_assert!(got.insert(k, s).is_none(), "step {:?} reported twice", k);
            }
        }
        prop_assert_eq!(&got, &want, "{}", c.tree.describe());
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 1usize..60) {
        let c = with_marks(seed, ranks, 3, 3, 8);
        let a = c.run::<LatencyFilter>("{}", seed).unwrap();
        let b = c.run::<LatencyFilter>("{}", seed.wrapping_add(1)).unwrap();
        // Per round the packets are the same; which round completes a step may depend on the order in which
        // the root finalizes rounds, but the steps and their values do not.
        let all = |o: &canopy_filter_test::Outcome| {
            let mut steps: Vec<StepLatency> = o
                .results
                .values()
                .flat_map(|r| LatencyResult::decode(r.as_slice()).unwrap().steps)
                .collect();
            steps.sort_by_key(|s| (s.key_id, s.step));
            steps
        };
        prop_assert_eq!(all(&a), all(&b));
    }
}
