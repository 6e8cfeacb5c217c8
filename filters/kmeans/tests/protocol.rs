//! The kmeans filter's rounds driven one at a time through a root and its leaves: `refit_every` (refits from
//! the seeds one round in N, the others assign the ranks to the last refit's centroids in one pass), an early
//! convergence that jumps to the last pass, and the errors for bad parameters and malformed packets.

use canopy_filter_kmeans::{KmeansFilter, LAST_DOWN, LAST_UP};
use canopy_filter_proto::v1::{KmeansPacket, KmeansResult, KmeansRun};
use canopy_filter_sdk::{Filter, Level};
use canopy_filter_test::{Collect, encode_one};
use canopy_wire::v1::{EventSample, RankProfile};
use prost::Message;

/// A rank of app "a" with one exclusive time per event ("x", "y").
fn rank(rank: u32, x: f64, y: f64) -> Vec<u8> {
    encode_one(&RankProfile {
        app: "a".into(),
        rank,
        events: [("x", x), ("y", y)]
            .iter()
            .map(|(n, v)| EventSample {
                event_id: canopy_wire::event_id(n),
                excl_us: *v,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// A vector of the result (over its dims, sorted by id) as (x, y).
fn xy(r: &KmeansResult, v: &[f64]) -> [f64; 2] {
    let at = |n: &str| {
        r.dims
            .iter()
            .position(|d| *d == canopy_wire::event_id(n))
            .unwrap()
    };
    [v[at("x")], v[at("y")]]
}

/// A root over leaves, one round at a time: the result and the phases that went down.
struct Star {
    root: KmeansFilter,
    leaves: Vec<KmeansFilter>,
}

impl Star {
    fn new(params: &str, leaves: usize) -> Star {
        Star {
            root: KmeansFilter::create(params, Level::Root).unwrap(),
            leaves: (0..leaves)
                .map(|_| KmeansFilter::create(params, Level::Leaf).unwrap())
                .collect(),
        }
    }

    fn round(&mut self, round: u64, inputs: &[Vec<Vec<u8>>]) -> (KmeansResult, Vec<u32>) {
        let mut ups: Vec<Vec<u8>> = Vec::new();
        for (leaf, inputs) in self.leaves.iter_mut().zip(inputs) {
            let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let mut c = Collect::default();
            leaf.upstream(round, 0, &slices, &mut c).unwrap();
            assert_eq!(c.up.len(), 1);
            ups.push(c.up.remove(0).1);
        }
        let mut phase = 0;
        let mut downs = Vec::new();
        loop {
            let slices: Vec<&[u8]> = ups.iter().map(Vec::as_slice).collect();
            let mut c = Collect::default();
            self.root.upstream(round, phase, &slices, &mut c).unwrap();
            assert!(c.rejects.is_empty(), "{:?}", c.rejects);
            if let Some((p, bytes)) = c.up.pop() {
                assert_eq!(p, LAST_UP);
                let result = self.root.finalize(round, p, &bytes).unwrap();
                return (KmeansResult::decode(result.as_slice()).unwrap(), downs);
            }
            let (down, bytes) = c.down.pop().expect("the root sends the next pass down");
            downs.push(down);
            ups.clear();
            for leaf in &mut self.leaves {
                let mut c = Collect::default();
                leaf.downstream(round, down, &bytes, &mut c).unwrap();
                let (p, bytes) = c.up.pop().unwrap();
                assert_eq!(p, down + 1);
                phase = p;
                ups.push(bytes);
            }
        }
    }
}

/// Two groups: ranks 0-3 near (10, 10), ranks 4-7 near (100, 50), shifted by `shift` on x.
fn two_groups(shift: f64) -> Vec<Vec<Vec<u8>>> {
    let all: Vec<Vec<u8>> = (0..8u32)
        .map(|r| {
            let f = f64::from(r);
            if r < 4 {
                rank(r, 10.0 + f + shift, 10.0 - f)
            } else {
                rank(r, 100.0 + f + shift, 50.0 + f)
            }
        })
        .collect();
    vec![all[..3].to_vec(), all[3..].to_vec()]
}

#[test]
fn converging_early_jumps_to_the_last_pass() {
    let mut star = Star::new(r#"{"k": 2}"#, 2);
    let (r, downs) = star.round(0, &two_groups(0.0));
    // Iteration 1 moves the seeds onto the groups, iteration 2 changes nothing: then the last pass.
    assert_eq!(downs, [1, 3, LAST_DOWN]);
    assert_eq!((r.iterations, r.converged, r.refit), (2, true, true));
    let sizes: Vec<u64> = r.clusters.iter().map(|c| c.size).collect();
    assert_eq!(sizes, [4, 4]);
    assert_eq!(
        (r.clusters[0].ranks[0].first, r.clusters[0].ranks[0].last),
        (0, 3)
    );
    // Centroid 0 is the mean of ranks 0-3: x = 10 + 1.5, y = 10 - 1.5; nearest are ranks 1 and 2 (equal):
    // the lower rank represents.
    assert_eq!(xy(&r, &r.clusters[0].centroid), [11.5, 8.5]);
    assert_eq!(r.clusters[0].representative.as_ref().unwrap().rank, 1);
}

#[test]
fn refit_every_iterates_one_round_in_n_and_assigns_the_others() {
    let mut star = Star::new(r#"{"k": 2, "refit_every": 3}"#, 2);
    let (first, _) = star.round(0, &two_groups(0.0));
    assert!(first.refit);
    for round in 1..=2 {
        // Shifted data, assigned to round 0's centroids in one pass: the centroids stay those of round 0.
        let (r, downs) = star.round(round, &two_groups(5.0));
        assert_eq!(downs, [LAST_DOWN], "round {round}");
        assert!(!r.refit && !r.converged && r.iterations == 0, "round {round}");
        let c0: Vec<Vec<f64>> = r.clusters.iter().map(|c| c.centroid.clone()).collect();
        let want: Vec<Vec<f64>> = first.clusters.iter().map(|c| c.centroid.clone()).collect();
        assert_eq!(c0, want);
        // The fit is against those centroids: each rank is 5 further on x.
        assert!(r.fit > first.fit);
    }
    let (r, downs) = star.round(3, &two_groups(5.0));
    assert!(r.refit && r.converged);
    assert_eq!(downs.last(), Some(&LAST_DOWN));
    assert_eq!(xy(&r, &r.clusters[0].centroid), [16.5, 8.5]);
}

#[test]
fn max_iterations_zero_assigns_to_the_seeds() {
    let mut star = Star::new(r#"{"k": 2, "max_iterations": 0}"#, 2);
    let (r, downs) = star.round(0, &two_groups(0.0));
    assert_eq!(downs, [LAST_DOWN]);
    assert_eq!((r.iterations, r.converged), (0, false));
    // The box is x in [10, 107], y in [7, 57]: seeds at 1/4 and 3/4 of the diagonal.
    assert_eq!((xy(&r, &r.lo), xy(&r, &r.hi)), ([10.0, 7.0], [107.0, 57.0]));
    assert_eq!(xy(&r, &r.clusters[0].centroid), [34.25, 19.5]);
    assert_eq!(xy(&r, &r.clusters[1].centroid), [82.75, 44.5]);
}

#[test]
fn bad_parameters_fail_create_with_the_reason() {
    let err = |p: &str| KmeansFilter::create(p, Level::Leaf).unwrap_err();
    assert_eq!(err(r#"{"k": 0}"#), "k must be between 1 and 256, got 0");
    assert_eq!(
        err(r#"{"k": "auto", "k_max": 1}"#),
        "k_max must be between 2 and 16, got 1"
    );
    assert_eq!(
        err(r#"{"refit_every": -1}"#),
        "refit_every must be between 1 and 1000000, got -1"
    );
    assert_eq!(err("[3]"), "parameters must be a JSON object, got an array");
}

#[test]
fn malformed_packets_are_rejected_or_refused_by_name() {
    let mut root = KmeansFilter::create(r#"{"k": 2}"#, Level::Root).unwrap();
    let mut relay = KmeansFilter::create(r#"{"k": 2}"#, Level::Relay).unwrap();
    let mut leaf = KmeansFilter::create(r#"{"k": 2}"#, Level::Leaf).unwrap();
    let mut c = Collect::default();
    // A relay rejects a box it cannot merge, naming what is wrong, and merges the rest.
    let good = KmeansPacket {
        dims: vec![1],
        lo: vec![0.0],
        hi: vec![1.0],
        ranks: 1,
        ..Default::default()
    }
    .encode_to_vec();
    let backwards = KmeansPacket {
        dims: vec![1],
        lo: vec![2.0],
        hi: vec![1.0],
        ranks: 1,
        ..Default::default()
    }
    .encode_to_vec();
    relay
        .upstream(0, 0, &[&good, &backwards, b"\xff"], &mut c)
        .unwrap();
    assert_eq!(c.rejects.len(), 2);
    assert!(c.rejects.iter().any(|(i, why)| *i == 1
        && why == "input is not a canopy.filters.v1.KmeansPacket: dimension 0x0000000000000001 has the range [2, 1] (finite, lo <= hi)"));
    assert_eq!(KmeansPacket::decode(c.up[0].1.as_slice()).unwrap().ranks, 1);
    // A relay asked to merge an iteration of a round whose centroids never came down.
    assert_eq!(
        relay.upstream(7, 2, &[&good], &mut c).unwrap_err(),
        "round 7: phase 2 came up before the round's centroids went down through here"
    );
    // Down packets for another k, or with the wrong number of centroids, are refused.
    let down = |k: u32, n: usize| {
        KmeansPacket {
            dims: vec![1],
            runs: vec![KmeansRun {
                k,
                centroids: vec![0.5; n],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
    };
    leaf.upstream(0, 0, &[&rank(0, 1.0, 2.0)], &mut c).unwrap();
    assert_eq!(
        leaf.downstream(0, 1, &down(3, 3), &mut c).unwrap_err(),
        "round 0: the phase 1 packet is unusable: runs for k [3], this stream runs k [2]"
    );
    assert_eq!(
        leaf.downstream(0, 1, &down(2, 3), &mut c).unwrap_err(),
        "round 0: the phase 1 packet is unusable: k 2: 3 centroid values for 2 clusters of 1 dimensions"
    );
    assert!(
        leaf.downstream(0, 1, b"\xff", &mut c)
            .unwrap_err()
            .starts_with("round 0: the phase 1 packet is not a canopy.filters.v1.KmeansPacket: ")
    );
    assert_eq!(
        leaf.downstream(0, 2, &down(2, 2), &mut c).unwrap_err(),
        "kmeans at the Leaf level gets no phase 2 downstream"
    );
    // The root refuses phases out of order, and results from any phase but the last.
    assert_eq!(
        root.upstream(4, 2, &[], &mut c).unwrap_err(),
        "round 4: phase 2 came without the round's phase 0"
    );
    root.upstream(4, 0, &[&good], &mut c).unwrap();
    assert_eq!(
        root.upstream(4, 4, &[], &mut c).unwrap_err(),
        "round 4: phase 4 came up after 0 iterations (expected phase 2)"
    );
    assert_eq!(
        root.finalize(4, 2, &[]).unwrap_err(),
        format!("kmeans results come from phase {LAST_UP}, got phase 2")
    );
    assert_eq!(
        root.upstream(4, 1, &[], &mut c).unwrap_err(),
        "kmeans at the Root level gets no phase 1 upstream"
    );
}
