//! The simulated scenarios: deterministic, and shaped as their papers describe.

use super::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

fn cfg(scenario: Scenario, rank_offset: u32, ranks: u32, total_ranks: u32) -> SimConfig {
    SimConfig {
        scenario,
        ranks,
        events: 20,
        rank_offset,
        total_ranks,
        seed: 42,
        app: "app".into(),
        plants: Vec::new(),
    }
}

fn run(cfg: SimConfig, rounds: u64) -> Vec<Vec<RankProfile>> {
    let mut sim = Simulator::new(cfg);
    (0..rounds).map(|r| sim.round(r)).collect()
}

fn named<'a>(sim: &Simulator, p: &'a RankProfile, name: &str) -> &'a EventSample {
    let id = event_id(name);
    assert!(sim.names().iter().any(|(i, n)| *i == id && n == name));
    p.events.iter().find(|e| e.event_id == id).unwrap()
}

#[test]
fn same_config_gives_same_profiles() {
    for sc in Scenario::ALL {
        assert_eq!(run(cfg(sc, 0, 8, 0), 5), run(cfg(sc, 0, 8, 0), 5));
        let other = SimConfig {
            seed: 43,
            ..cfg(sc, 0, 8, 0)
        };
        assert_ne!(run(cfg(sc, 0, 8, 0), 5), run(other, 5));
    }
}

#[test]
fn a_rank_does_not_depend_on_the_other_ranks_simulated() {
    for sc in Scenario::ALL {
        let all = run(cfg(sc, 0, 16, 16), 6);
        // total_ranks 0 stands for rank_offset + ranks = 16.
        let upper = run(cfg(sc, 8, 8, 0), 6);
        for (a, u) in all.iter().zip(&upper) {
            assert_eq!(&a[8..], &u[..], "{sc}");
        }
    }
}

#[test]
fn skipped_rounds_are_accumulated_and_rewinding_restarts() {
    for sc in Scenario::ALL {
        let seq = run(cfg(sc, 0, 4, 16), 6);
        let mut sim = Simulator::new(cfg(sc, 0, 4, 16));
        sim.round(2);
        assert_eq!(sim.round(5), seq[5]);
        assert_eq!(sim.round(3), seq[3]);
        assert_eq!(sim.round(3), seq[3]);
    }
}

#[test]
fn totals_are_the_sum_of_per_round_values() {
    for sc in Scenario::ALL {
        let rounds = run(cfg(sc, 3, 5, 20), 30);
        let mut sums: HashMap<(u32, u64), (u64, u64, f64, f64)> = HashMap::new();
        let mut counters: HashMap<(u32, u64), f64> = HashMap::new();
        for profiles in &rounds {
            for p in profiles {
                for e in &p.events {
                    let s = sums.entry((p.rank, e.event_id)).or_default();
                    *s = (s.0 + e.calls, s.1 + e.subrs, s.2 + e.incl_us, s.3 + e.excl_us);
                    assert_eq!(
                        *s,
                        (e.calls_total, e.subrs_total, e.incl_total_us, e.excl_total_us)
                    );
                }
                for c in &p.counters {
                    let s = counters.entry((p.rank, c.counter_id)).or_default();
                    *s += c.value;
                    assert_eq!(*s, c.total);
                }
            }
        }
    }
}

#[test]
fn values_are_sane_and_nest() {
    for sc in Scenario::ALL {
        let sim = Simulator::new(cfg(sc, 0, 16, 64));
        let mut sim2 = Simulator::new(cfg(sc, 0, 16, 64));
        for round in 0..120 {
            for (st, p) in sim.ranks.iter().zip(sim2.round(round)) {
                assert_eq!(
                    (p.app.as_str(), p.rank, p.round, p.dump_unix_ns),
                    ("app", st.rank, round, 0)
                );
                let plan = &sim.plans[st.plan];
                assert_eq!(plan.len(), p.events.len());
                for (j, e) in p.events.iter().enumerate() {
                    assert!(e.calls >= 1, "{sc} {e:?}");
                    assert!(e.excl_us.is_finite() && e.incl_us.is_finite() && e.excl_us >= 0.0);
                    assert!(
                        e.excl_us <= e.incl_us && e.excl_total_us <= e.incl_total_us,
                        "{sc} {e:?}"
                    );
                    let children: Vec<_> = (0..plan.len()).filter(|&c| plan[c].parent == Some(j)).collect();
                    let incl: f64 = children.iter().map(|&c| p.events[c].incl_us).sum();
                    let calls: u64 = children.iter().map(|&c| p.events[c].calls).sum();
                    assert!(e.incl_us >= incl * (1.0 - 1e-12), "{sc} {e:?}");
                    assert_eq!(e.subrs, calls);
                }
                for c in &p.counters {
                    assert!(c.value.is_finite() && c.value >= 0.0);
                }
            }
        }
    }
}

#[test]
fn flash_allreduce_spikes_at_round_100_only() {
    let sim = Simulator::new(cfg(Scenario::Flash, 0, 64, 64));
    let rounds = run(cfg(Scenario::Flash, 0, 64, 64), 160);
    let allreduce = |round: usize, rank: usize| named(&sim, &rounds[round][rank], "MPI_Allreduce").incl_us;
    for rank in 0..64 {
        let spike = allreduce(100, rank);
        assert!(spike >= 5.0 * allreduce(99, rank) && spike >= 5.0 * allreduce(101, rank));
        let quiet: Vec<f64> = (0..160)
            .filter(|&r| r != 100)
            .map(|r| allreduce(r, rank))
            .collect();
        let min = quiet.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(quiet.iter().all(|&v| v < 2.5 * min), "rank {rank}");
    }
    // The baseline is spread over the ranks, not one value with a little noise.
    let at50: Vec<f64> = (0..64).map(|rank| allreduce(50, rank)).collect();
    let (lo, hi) = at50
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
    let bins: BTreeSet<u32> = at50
        .iter()
        .map(|v| ((v - lo) / (hi - lo) * 9.999) as u32)
        .collect();
    assert!(hi > 2.0 * lo && bins.len() >= 4, "{at50:?}");
    assert!(
        rounds[0][0]
            .counters
            .iter()
            .any(|c| c.counter_id == event_id("bytes_sent") && c.value > 0.0)
    );
}

#[test]
fn events_sets_the_count() {
    for (sc, events, want) in [
        (Scenario::Flash, 5, 5),
        (Scenario::Flash, 27, 27),
        (Scenario::Flash, 0, 0),
        (Scenario::Namd, 3, 4),
    ] {
        let mut sim = Simulator::new(SimConfig {
            events,
            ..cfg(sc, 0, 2, 2)
        });
        assert!(
            sim.round(0).iter().all(|p| p.events.len() == want),
            "{sc} {events}"
        );
    }
    let mut sim = Simulator::new(SimConfig {
        events: 27,
        ..cfg(Scenario::Flash, 0, 1, 1)
    });
    let p = &sim.round(0)[0];
    assert_eq!(p.events[0].event_id, event_id("main_loop"));
    assert_eq!(p.events[26].event_id, event_id("compute_6"));
    let mut sim = Simulator::new(SimConfig {
        events: 3,
        ..cfg(Scenario::Flash, 0, 1, 1)
    });
    assert_eq!(sim.round(0)[0].events[1].event_id, event_id("MPI_Allreduce"));
}

/// Groups ranks by the sorted names they report that pass `keep`.
fn classes(sc: Scenario, n: u32, round: u64, keep: impl Fn(&str) -> bool) -> Vec<Vec<u32>> {
    let mut sim = Simulator::new(cfg(sc, 0, n, n));
    let names: HashMap<u64, String> = sim.names().into_iter().collect();
    let profiles = sim.round(round);
    let mut groups: BTreeMap<Vec<&str>, Vec<u32>> = BTreeMap::new();
    for p in &profiles {
        let mut key: Vec<&str> = p
            .events
            .iter()
            .map(|e| names[&e.event_id].as_str())
            .filter(|n| keep(n))
            .collect();
        key.sort_unstable();
        groups.entry(key).or_default().push(p.rank);
    }
    let mut out: Vec<Vec<u32>> = groups.into_values().collect();
    out.sort();
    out
}

#[test]
fn uintah_level1_patches_give_three_classes() {
    for n in [64, 16] {
        for round in [0, 7] {
            let got = classes(Scenario::Uintah, n, round, |s| s.starts_with("Patch 1 -> "));
            assert_eq!(got, vec![vec![0], (1..=8).collect(), (9..n).collect()], "n={n}");
        }
    }
    let got = classes(Scenario::Uintah, 5, 0, |s| s.starts_with("Patch 1 -> "));
    assert_eq!(got, vec![vec![0], vec![1, 2, 3, 4]]);
}

#[test]
fn uintah_mpi_and_default_classes() {
    assert_eq!(
        classes(Scenario::Uintah, 64, 3, |s| s.starts_with("MPI_")).len(),
        13
    );
    assert_eq!(classes(Scenario::Uintah, 64, 3, |_| true).len(), 64);
    assert_eq!(classes(Scenario::Flash, 64, 3, |_| true).len(), 1);
}

#[test]
fn names_cover_every_reported_id() {
    for sc in Scenario::ALL {
        for (offset, ranks) in [(0, 16), (9, 3)] {
            let mut sim = Simulator::new(SimConfig {
                events: 25,
                ..cfg(sc, offset, ranks, 64)
            });
            let names = sim.names();
            let ids: HashSet<u64> = names.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids.len(), names.len(), "{sc}: duplicate ids");
            assert!(names.iter().all(|(id, n)| *id == event_id(n)));
            let mut used = HashSet::new();
            for round in 0..3 {
                for p in sim.round(round) {
                    used.extend(p.events.iter().map(|e| e.event_id));
                    used.extend(p.counters.iter().map(|c| c.counter_id));
                    // A workflow step's key travels as a name too.
                    used.extend(p.marks.iter().map(|m| m.key_id));
                }
            }
            assert!(used.is_subset(&ids), "{sc}");
            // names() holds only what these ranks report.
            assert_eq!(used, ids, "{sc}");
        }
    }
}

#[test]
fn namd_idle_balances_busy() {
    let sim = Simulator::new(cfg(Scenario::Namd, 0, 64, 64));
    let idle_id = event_id("Idle");
    for (round, profiles) in run(cfg(Scenario::Namd, 0, 64, 64), 20).iter().enumerate() {
        let split: Vec<(f64, f64)> = profiles
            .iter()
            .map(|p| {
                let idle = named(&sim, p, "Idle").excl_us;
                let busy: f64 = p
                    .events
                    .iter()
                    .filter(|e| e.event_id != idle_id)
                    .map(|e| e.excl_us)
                    .sum();
                (busy, idle)
            })
            .collect();
        let spread = |v: Vec<f64>| {
            let hi = v.iter().copied().fold(0.0, f64::max);
            hi / v.iter().copied().fold(f64::INFINITY, f64::min)
        };
        assert!(
            spread(split.iter().map(|(b, _)| *b).collect()) > 1.2,
            "round {round}: no overload"
        );
        assert!(
            spread(split.iter().map(|(b, i)| b + i).collect()) < 1.01,
            "round {round}"
        );
        let busiest = (0..64)
            .max_by(|&a, &b| split[a].0.total_cmp(&split[b].0))
            .unwrap();
        let least_idle = (0..64)
            .min_by(|&a, &b| split[a].1.total_cmp(&split[b].1))
            .unwrap();
        assert_eq!(busiest, least_idle);
    }
}

#[test]
fn scenario_names_round_trip() {
    for sc in Scenario::ALL {
        assert_eq!(sc.to_string().parse::<Scenario>(), Ok(sc));
    }
    assert_eq!("NAMD".parse::<Scenario>(), Ok(Scenario::Namd));
    let err = "enzo".parse::<Scenario>().unwrap_err().to_string();
    assert!(
        ["enzo", "flash", "uintah", "namd"]
            .iter()
            .all(|n| err.contains(n)),
        "{err}"
    );
}

#[test]
fn a_keys_prefix_hashed_once_draws_what_the_whole_key_draws() {
    for key in [[1u64, 2, 3, 4, 5], [42, 1, 0, u64::MAX, 7], [0; 5]] {
        let mut whole = Keyed::of(&key);
        let mut split = Keyed::with(Keyed::prefix(&key[..4]), key[4]);
        for _ in 0..4 {
            assert_eq!(whole.next_u64(), split.next_u64());
        }
    }
}

/// The encoded rounds are the profiles of `Simulator::round` under `Measure::apply`, byte for byte: with no
/// options, with names left out, with a metric subset that drops the counters, and with rank sampling.
#[test]
fn encoded_rounds_are_the_profiles_under_the_options() {
    use canopy_proto::v1::{Options, ProfileBatch};
    use canopy_wire::options::Measure;
    use prost::Message;
    let options = [
        Options::default(),
        Options {
            include: vec!["^MPI_".into(), "Patch".into(), "bytes".into()],
            exclude: vec!["Barrier".into()],
            ..Default::default()
        },
        Options {
            metrics: vec!["exclusive".into(), "calls".into()],
            sample_below: 5,
            ..Default::default()
        },
    ];
    for sc in Scenario::ALL {
        for o in &options {
            let measure = Measure::from_options(o).unwrap();
            let mut reference = Simulator::new(cfg(sc, 2, 6, 16));
            let mut encoder = Simulator::new(cfg(sc, 2, 6, 16));
            let names: HashMap<u64, String> = reference.names().into_iter().collect();
            // Round 3 after 0 skips rounds 1 and 2; round 1 after 3 rewinds.
            for round in [0, 3, 4, 1] {
                let expected: Vec<(u32, Option<Vec<u8>>)> = reference
                    .round(round)
                    .into_iter()
                    .map(|mut p| {
                        p.dump_unix_ns = 77;
                        let rank = p.rank;
                        let batch = (!measure.samples_out(rank)).then(|| {
                            ProfileBatch {
                                profiles: vec![measure.apply(p, &names)],
                            }
                            .encode_to_vec()
                        });
                        (rank, batch)
                    })
                    .collect();
                let mut got = Vec::new();
                let reported = |id: u64| measure.reports(&names[&id]);
                let selection = Selection {
                    reported: &reported,
                    metrics: measure.metrics(),
                    sampled_out: &|rank| measure.samples_out(rank),
                    utilization: None,
                    step_unix_ns: 0,
                };
                encoder.encode_round(round, 77, &selection, |rank, batch| {
                    got.push((rank, batch.map(|b| b.to_vec())))
                });
                assert_eq!(got, expected, "{sc} {o:?} round {round}");
                assert!(got.iter().any(|(_, b)| b.is_some()));
            }
        }
    }
}

/// Planted ranks compute FACTOR times as long as the others, in every compute event and every round: an outlier
/// search knows what it must find.
#[test]
fn planted_ranks_compute_their_factor_times_as_long() {
    let mut c = cfg(Scenario::Flash, 0, 16, 16);
    c.plants = vec!["3,9:3".parse().unwrap(), "12-13:0.5".parse().unwrap()];
    let sim = Simulator::new(c.clone());
    let compute: BTreeSet<u64> = sim.plans[0]
        .iter()
        .filter(|s| matches!(s.kind, Kind::Compute))
        .map(|s| s.id)
        .collect();
    assert!(!compute.is_empty());
    for round in run(c, 5) {
        for id in &compute {
            let excl = |rank: u32| {
                round[rank as usize]
                    .events
                    .iter()
                    .find(|e| e.event_id == *id)
                    .map(|e| e.excl_us)
                    .unwrap()
            };
            let plain: Vec<f64> = (0..16)
                .filter(|r| ![3, 9, 12, 13].contains(r))
                .map(excl)
                .collect();
            let (lo, hi) = plain
                .iter()
                .fold((f64::MAX, 0.0f64), |(a, b), v| (a.min(*v), b.max(*v)));
            for slow in [3, 9] {
                // Speeds differ by 0.9..1.1 and rounds by 5% either way: 3x stays above every plain rank.
                assert!(excl(slow) > 2.0 * hi, "rank {slow}: {} against {hi}", excl(slow));
            }
            for fast in [12, 13] {
                assert!(excl(fast) < 0.7 * lo, "rank {fast}: {} against {lo}", excl(fast));
            }
        }
    }
}

#[test]
fn the_workflows_steps_take_the_transfer_and_the_drivers_time_exactly() {
    let component = |app: &str, ranks: u32| SimConfig {
        app: app.into(),
        ..cfg(Scenario::Workflow, 0, ranks, ranks)
    };
    let mut lammps = Simulator::new(component("lammps", 4));
    let mut bonds = Simulator::new(component("bonds", 2));
    let mut csym = Simulator::new(component("csym", 1));
    let key_id = event_id(workflow::KEY);
    assert!(
        lammps
            .names()
            .iter()
            .any(|(id, n)| *id == key_id && n == workflow::KEY)
    );
    let mut latencies = BTreeSet::new();
    for round in 0..30 {
        let (l, b, c) = (lammps.round(round), bonds.round(round), csym.round(round));
        // Only rank 0 of the simulation marks the start, and rank 0 of csym the stop; bonds marks nothing.
        assert_eq!(
            l[0].marks,
            [StepMark {
                key_id,
                step: round,
                stop: false,
                unix_ns: 0
            }]
        );
        assert!(l[1..].iter().chain(&b).all(|p| p.marks.is_empty()));
        let latency = workflow::latency_ns(42, round);
        assert_eq!(
            c[0].marks,
            [StepMark {
                key_id,
                step: round,
                stop: true,
                unix_ns: latency
            }]
        );
        // The latency is the transfer plus the drivers' times as the analyses' ranks report them, every rank alike.
        let driver = |profiles: &[RankProfile], sim: &Simulator, name: &str| {
            let times: BTreeSet<u64> = profiles
                .iter()
                .map(|p| named(sim, p, name).excl_us.to_bits())
                .collect();
            assert_eq!(times.len(), 1, "{name} differs between ranks");
            f64::from_bits(*times.first().unwrap())
        };
        let transfer = workflow::transfer_us(42, round);
        assert!((0.8 * workflow::TRANSFER_US..=1.2 * workflow::TRANSFER_US).contains(&transfer));
        let us = transfer
            + driver(&b, &bonds, "bonds_read_input")
            + driver(&c, &csym, "csym_read_input")
            + driver(&c, &csym, "csym_compute_send");
        assert_eq!(latency, (us * 1000.0).round() as u64);
        latencies.insert(latency);
        // The simulation's ranks report its own events, not the analyses'.
        assert!(named(&lammps, &l[0], "Pair::compute").excl_us > 0.0);
        assert!(l[0].events.len() == 20 && b[0].events.len() == 4 && c[0].events.len() == 4);
    }
    // The latency moves from step to step.
    assert!(latencies.len() >= 29);
}

#[test]
fn an_encoded_workflow_round_carries_the_step_marks_at_the_windows_start() {
    use prost::Message as _;
    let mut sim = Simulator::new(SimConfig {
        app: "csym".into(),
        ..cfg(Scenario::Workflow, 0, 1, 1)
    });
    let selection = Selection {
        reported: &|_| true,
        metrics: 0,
        sampled_out: &|_| false,
        utilization: None,
        step_unix_ns: 5_000_000_000,
    };
    let mut batches = Vec::new();
    sim.encode_round(7, 5_020_000_000, &selection, |_, b| batches.push(b.unwrap()));
    let batch = canopy_proto::v1::ProfileBatch::decode(batches[0].as_ref()).unwrap();
    assert_eq!(
        batch.profiles[0].marks,
        [StepMark {
            key_id: event_id(workflow::KEY),
            step: 7,
            stop: true,
            unix_ns: 5_000_000_000 + workflow::latency_ns(42, 7)
        }]
    );
}

#[test]
fn a_rounds_batches_share_their_allocations_and_each_decodes_to_its_rank() {
    use prost::Message as _;
    let ranks = 40;
    let mut sim = Simulator::new(cfg(Scenario::Flash, 0, ranks, ranks));
    let selection = Selection {
        reported: &|_| true,
        metrics: 0,
        sampled_out: &|rank| rank == 3,
        utilization: None,
        step_unix_ns: 0,
    };
    let mut got = Vec::new();
    sim.encode_round(2, 9, &selection, |rank, b| got.push((rank, b)));
    assert_eq!(got.len(), ranks as usize);
    assert!(got[3].1.is_none(), "rank 3 is sampled out");
    let batches: Vec<(u32, bytes::Bytes)> = got.into_iter().filter_map(|(r, b)| Some((r, b?))).collect();
    // Each batch decodes to its own rank's profile of the round.
    for (rank, b) in &batches {
        let batch = canopy_proto::v1::ProfileBatch::decode(b.as_ref()).unwrap();
        assert_eq!((batch.profiles[0].rank, batch.profiles[0].round), (*rank, 2));
    }
    // A batch follows the one before in memory unless a new chunk began: a chunk holds several ranks, so the
    // round costs far fewer allocations than ranks.
    let per_chunk = CHUNK_BYTES / batches[0].1.len();
    assert!(per_chunk >= 4, "a chunk holds {per_chunk} batches");
    let adjacent = batches
        .windows(2)
        .filter(|w| w[0].1.as_ptr().wrapping_add(w[0].1.len()) == w[1].1.as_ptr())
        .count();
    let chunks = batches.len() - adjacent;
    assert!(
        chunks <= batches.len().div_ceil(per_chunk - 1),
        "{chunks} chunks for {} batches of {} bytes",
        batches.len(),
        batches[0].1.len()
    );
}
