//! The kmeans filter over random trees equals k-means over all ranks at once from the same seeds
//! (`reference::kmeans`): the same clusters (members, sizes, representatives), iterations and convergence, and
//! centroids, fits and spreads within 1e-9 relative; with k "auto", every k's fit and the k chosen.

use std::collections::BTreeSet;

use canopy_filter_kmeans::{KmeansFilter, LAST_UP};
use canopy_filter_proto::v1::{KmeansResult, RankRange};
use canopy_filter_test::{Case, Rng, Tree, reference};
use canopy_wire::v1::{EventSample, RankProfile};
use proptest::prelude::*;
use prost::Message;

const EVENTS: [&str; 6] = ["MPI_Send", "MPI_Wait", "compute", "io", "MPI_Reduce", "pack"];

/// Ranks drawn around `groups` random centres, each event with its own noise, some events missing (0 there).
fn profiles(rng: &mut Rng, ranks: usize, groups: usize, events: usize) -> Vec<RankProfile> {
    let centres: Vec<Vec<f64>> = (0..groups)
        .map(|_| (0..events).map(|_| rng.unit() * 1000.0).collect())
        .collect();
    (0..ranks)
        .map(|i| {
            let g = rng.below(groups);
            let app = if i % 3 == 0 { "b" } else { "a" };
            RankProfile {
                app: app.into(),
                rank: i as u32,
                events: (0..events)
                    .filter_map(|e| {
                        if rng.chance(0.1) {
                            return None;
                        }
                        let v = centres[g][e] + (rng.unit() - 0.5) * 50.0;
                        Some(EventSample {
                            event_id: canopy_wire::event_id(EVENTS[e]),
                            calls: 1,
                            incl_us: v + 1.0,
                            excl_us: v,
                            ..Default::default()
                        })
                    })
                    .collect(),
                ..Default::default()
            }
        })
        .collect()
}

/// The points the reference clusters: per rank, the exclusive time of each selected event over the union of
/// events seen, 0 where a rank lacks one.
fn points(profiles: &[RankProfile], pattern: Option<&str>) -> (Vec<u64>, Vec<Vec<f64>>) {
    let selected = |id: u64| {
        let name = EVENTS.iter().find(|n| canopy_wire::event_id(n) == id).unwrap();
        pattern.is_none_or(|p| name.starts_with(p))
    };
    let dims: Vec<u64> = profiles
        .iter()
        .flat_map(|p| p.events.iter().map(|e| e.event_id))
        .filter(|id| selected(*id))
        .collect::<BTreeSet<u64>>()
        .into_iter()
        .collect();
    let points = profiles
        .iter()
        .map(|p| {
            dims.iter()
                .map(|d| {
                    p.events
                        .iter()
                        .find(|e| e.event_id == *d)
                        .map_or(0.0, |e| e.excl_us)
                })
                .collect()
        })
        .collect();
    (dims, points)
}

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

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// One k's clusters in `r` equal the reference's over `profiles`.
fn same_clusters(
    r: &KmeansResult,
    profiles: &[RankProfile],
    points: &[Vec<f64>],
    k: usize,
    max_iterations: u32,
) -> Result<(), TestCaseError> {
    let want = reference::kmeans(points, k, max_iterations);
    prop_assert_eq!(r.k as usize, k);
    prop_assert_eq!((r.iterations, r.converged), (want.iterations, want.converged));
    prop_assert_eq!(r.clusters.len(), k);
    let mut fit = 0.0;
    for (c, cluster) in r.clusters.iter().enumerate() {
        let members: Vec<usize> = (0..profiles.len()).filter(|&i| want.assignment[i] == c).collect();
        let of: Vec<&RankProfile> = members.iter().map(|&i| &profiles[i]).collect();
        prop_assert_eq!(cluster.cluster as usize, c);
        prop_assert_eq!(&cluster.ranks, &ranges_of(&of), "cluster {}", c);
        prop_assert_eq!(cluster.size, members.len() as u64);
        let rep = members.iter().min_by(|&&a, &&b| {
            want.d2[a]
                .total_cmp(&want.d2[b])
                .then_with(|| (&profiles[a].app, profiles[a].rank).cmp(&(&profiles[b].app, profiles[b].rank)))
        });
        let got = cluster.representative.as_ref().map(|r| (r.app.clone(), r.rank));
        prop_assert_eq!(
            got,
            rep.map(|&i| (profiles[i].app.clone(), profiles[i].rank)),
            "cluster {}",
            c
        );
        for (a, b) in cluster.centroid.iter().zip(&want.centroids[c]) {
            prop_assert!(
                close(*a, *b),
                "cluster {c}: centroid {:?} vs {:?}",
                cluster.centroid,
                want.centroids[c]
            );
        }
        let sum: f64 = members.iter().map(|&i| want.d2[i]).sum();
        let max = members.iter().map(|&i| want.d2[i]).fold(0.0, f64::max);
        prop_assert!(
            close(cluster.sum_squares, sum),
            "{} vs {sum}",
            cluster.sum_squares
        );
        prop_assert!(close(cluster.max_distance, max.sqrt()));
        if !members.is_empty() {
            prop_assert!(close(cluster.rms, (sum / members.len() as f64).sqrt()));
        }
        fit += sum;
    }
    prop_assert!(close(r.fit, fit), "fit {} vs {fit}", r.fit);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_tree_clusters_as_kmeans_over_all_ranks(
        seed in any::<u64>(),
        ranks in 1usize..80,
        groups in 1usize..5,
        events in 1usize..6,
        k in 1usize..6,
        max_iterations in 0u32..30,
        mpi_only in any::<bool>(),
    ) {
        let mut rng = Rng::new(seed);
        let tree = Tree::random(&mut rng, 4, 8, 60);
        let placement = tree.place(&mut rng, ranks);
        let rounds: Vec<Vec<RankProfile>> = (0..2).map(|_| profiles(&mut rng, ranks, groups, events)).collect();
        let case = Case::new(tree, placement, rounds, Vec::new());
        let names: Vec<(u64, String)> = EVENTS.iter().map(|n| (canopy_wire::event_id(n), n.to_string())).collect();
        let case = Case { names, ..case };
        let pattern = mpi_only.then_some("MPI_");
        let scheme = if mpi_only { r#", "scheme": "pattern", "pattern": "^MPI_""# } else { "" };
        let params = format!(r#"{{"k": {k}, "max_iterations": {max_iterations}{scheme}}}"#);
        let out = case.run::<KmeansFilter>(&params, seed).map_err(TestCaseError::fail)?;
        prop_assert!(out.rejects.is_empty(), "{:?}", out.rejects);
        prop_assert_eq!(out.results.len(), 2);
        for (round, profiles) in case.profiles.iter().enumerate() {
            let bytes = &out.results[&(round as u64, LAST_UP)];
            let r = KmeansResult::decode(bytes.as_slice()).unwrap();
            let (dims, points) = points(profiles, pattern);
            prop_assert_eq!(&r.dims, &dims);
            prop_assert_eq!(r.ranks, ranks as u64);
            prop_assert!(r.refit);
            let names: Vec<String> = dims.iter().map(|d| EVENTS.iter().find(|n| canopy_wire::event_id(n) == *d).unwrap().to_string()).collect();
            prop_assert_eq!(&r.names, &names);
            same_clusters(&r, profiles, &points, k, max_iterations)?;
        }
    }

    #[test]
    fn auto_reports_every_k_and_chooses_where_the_fit_stops_improving(
        seed in any::<u64>(),
        ranks in 1usize..60,
        groups in 1usize..5,
        k_max in 2u32..7,
    ) {
        let mut rng = Rng::new(seed);
        let tree = Tree::random(&mut rng, 3, 6, 40);
        let placement = tree.place(&mut rng, ranks);
        let case = Case::new(tree, placement, vec![profiles(&mut rng, ranks, groups, 3)], Vec::new());
        let params = format!(r#"{{"k": "auto", "k_max": {k_max}, "improvement": 0.2}}"#);
        let out = case.run::<KmeansFilter>(&params, seed).map_err(TestCaseError::fail)?;
        let r = KmeansResult::decode(out.results[&(0, LAST_UP)].as_slice()).unwrap();
        let (_, points) = points(&case.profiles[0], None);
        prop_assert_eq!(r.fits.len(), k_max as usize);
        let mut fits = Vec::new();
        for (i, f) in r.fits.iter().enumerate() {
            let want = reference::kmeans(&points, i + 1, 20);
            let fit: f64 = want.d2.iter().sum();
            prop_assert_eq!(f.k as usize, i + 1);
            prop_assert!(close(f.fit, fit), "k {}: {} vs {fit}", i + 1, f.fit);
            prop_assert_eq!((f.iterations, f.converged), (want.iterations, want.converged));
            fits.push(fit);
        }
        // The smallest k that the next does not improve by 20% of k = 1's fit, else k_max.
        let chosen = (0..fits.len() - 1)
            .find(|&i| fits[0] <= 0.0 || fits[i] - fits[i + 1] < 0.2 * fits[0])
            .unwrap_or(fits.len() - 1);
        same_clusters(&r, &case.profiles[0], &points, chosen + 1, 20)?;
    }
}

/// Three groups far apart: k "auto" finds exactly three, whatever the tree.
#[test]
fn auto_finds_three_separated_groups() {
    for seed in 0..10 {
        let mut rng = Rng::new(seed);
        let tree = Tree::random(&mut rng, 3, 6, 40);
        let placement = tree.place(&mut rng, 48);
        let profiles: Vec<RankProfile> = (0..48u32)
            .map(|rank| {
                let g = f64::from(rank % 3);
                RankProfile {
                    app: "a".into(),
                    rank,
                    events: ["solve", "exchange"]
                        .iter()
                        .enumerate()
                        .map(|(e, n)| EventSample {
                            event_id: canopy_wire::event_id(n),
                            excl_us: 1000.0 * g * (e as f64 + 1.0) + rng.unit(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            })
            .collect();
        let case = Case::new(tree, placement, vec![profiles], Vec::new());
        let out = case
            .run::<KmeansFilter>(r#"{"k": "auto", "k_max": 6}"#, seed)
            .unwrap();
        let r = KmeansResult::decode(out.results[&(0, LAST_UP)].as_slice()).unwrap();
        assert_eq!(r.k, 3, "fits {:?}", r.fits);
        let sizes: Vec<u64> = r.clusters.iter().map(|c| c.size).collect();
        assert_eq!(sizes, [16, 16, 16]);
        for c in &r.clusters {
            let first = c.ranks[0].first % 3;
            assert!(
                c.ranks
                    .iter()
                    .all(|rr| rr.first == rr.last && rr.first % 3 == first)
            );
        }
    }
}
