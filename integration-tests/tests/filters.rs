//! The standard filters end to end on real trees: the FLASH Allreduce anomaly at round 100 in stats and
//! histograms, Uintah's three functional classes with a reduction factor that grows with the ranks, and
//! classify's reduction factor under the ToM paper's schemes (Fig. 7), and two applications' stats apart in one
//! tree.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use canopy_integration_tests::{HistogramRow, Select, TreeBuilder, reader};
use canopy_proto::filters::v1::Metric;

fn id(name: &str) -> u64 {
    canopy_proto::event_id(name)
}

/// Folds the bins of each round into one value (bins of several rounds, in round order).
fn per_round(bins: &[HistogramRow], fold: impl Fn(f64, &HistogramRow) -> f64, start: f64) -> Vec<(u64, f64)> {
    let mut rounds: BTreeMap<u64, f64> = BTreeMap::new();
    for b in bins {
        let v = rounds.entry(b.round).or_insert(start);
        *v = fold(*v, b);
    }
    rounds.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flash_shows_the_allreduce_slowdown_at_round_100_in_stats_and_histograms() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 64,
        rounds: 105,
        period_ms: 5,
        scenario: "flash".into(),
        streams: vec!["stats".into(), "histogram".into()],
        stream_params: vec![("stats".into(), r#"{"quantiles": true}"#.into())],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    let stored = reader(&tree.store);
    let rounds = stored.rounds(Select::all()).unwrap();
    assert_eq!(rounds.iter().filter(|r| r.covered == 64).count(), 2 * 105);
    let allreduce = id("MPI_Allreduce");

    // stats (stream 1): the mean exclusive Allreduce time of all 64 ranks, round by round.
    let stats: Vec<_> = stored
        .stats(Select::all().stream(1))
        .unwrap()
        .into_iter()
        .filter(|s| s.id == allreduce)
        .collect();
    let mut means: Vec<(u64, f64)> = stats
        .iter()
        .filter(|s| s.metric == Metric::Exclusive)
        .map(|s| (s.round, s.mean.unwrap()))
        .collect();
    means.sort_by_key(|(round, _)| *round);
    assert_eq!(means.len(), 105);
    let at = |r: u64| means.iter().find(|(round, _)| *round == r).unwrap().1;
    assert!(
        at(100) >= 5.0 * at(99) && at(100) >= 5.0 * at(101),
        "99: {} 100: {} 101: {}",
        at(99),
        at(100),
        at(101)
    );
    let counts = stats.iter().map(|s| s.count).min();
    assert_eq!(counts, Some(64));

    // Its quantiles (p50, p90 and p99 for `"quantiles": true`), stored beside each row: between the row's min and max, and
    // the median jumps at round 100 as the mean does.
    let quantiles: Vec<_> = stored
        .stats_quantiles(Select::all().stream(1))
        .unwrap()
        .into_iter()
        .filter(|q| q.id == allreduce && q.metric == Metric::Exclusive)
        .collect();
    assert_eq!(quantiles.len(), 3 * 105);
    for q in &quantiles {
        let row = stats
            .iter()
            .find(|s| s.round == q.round && s.metric == Metric::Exclusive)
            .unwrap();
        let v = q.value.unwrap();
        assert!(
            row.min.unwrap() <= v && v <= row.max.unwrap(),
            "round {} q {}: {v} outside [{:?}, {:?}]",
            q.round,
            q.q,
            row.min,
            row.max
        );
    }
    let p50 = |r: u64| {
        quantiles
            .iter()
            .find(|q| q.round == r && q.q == 0.5)
            .unwrap()
            .value
            .unwrap()
    };
    assert!(
        p50(100) >= 5.0 * p50(99) && p50(100) >= 5.0 * p50(101),
        "p50 99: {} 100: {} 101: {}",
        p50(99),
        p50(100),
        p50(101)
    );

    // histogram (stream 2): every round's bins hold all 64 ranks, and round 100's range sits far above.
    let all_bins = stored.histograms(Select::all().stream(2)).unwrap();
    let bins: Vec<HistogramRow> = all_bins
        .iter()
        .filter(|b| b.id == allreduce && b.metric == Metric::Exclusive)
        .cloned()
        .collect();
    let sums = per_round(&bins, |sum, b| sum + b.count as f64, 0.0);
    assert_eq!(sums.len(), 105);
    assert!(sums.iter().all(|(_, n)| *n == 64.0), "{sums:?}");
    let lows = per_round(&bins, |lo, b| lo.min(b.lo.unwrap()), f64::INFINITY);
    let highs = per_round(&bins, |hi, b| hi.max(b.hi.unwrap()), f64::NEG_INFINITY);
    let lo = |r: u64| lows.iter().find(|(x, _)| *x == r).unwrap().1;
    let hi = |r: u64| highs.iter().find(|(x, _)| *x == r).unwrap().1;
    assert!(
        lo(100) > hi(99) && lo(100) > hi(101),
        "round 100's whole histogram lies above its neighbours'"
    );
    assert_eq!(
        all_bins.iter().map(|b| b.bin).collect::<BTreeSet<u32>>().len(),
        10,
        "default bins"
    );
}

/// The "AMR L1 Patch Only" scheme of ToM's Fig. 7.
const L1_PATCHES: &str = r#"{"scheme": "pattern", "pattern": "^Patch 1 ->"}"#;

/// Runs the uintah scenario under classify with `params`; returns the tree (kept alive for the store's
/// directory).
/// A simulation on three agents (48 ranks) and an analysis on the fourth (16 ranks) feed one tree through two
/// relays: the stats stream stores a row per application, event and metric, each counting that application's
/// ranks alone, with its extremes held by that application's ranks; the histogram stream breaks down the same
/// way, each application binned between its own bounds; and each round's coverage is kept per application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_applications_in_one_tree_have_their_own_stats_rows() {
    let rounds = 6;
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 64,
        rounds,
        period_ms: 5,
        scenario: "flash".into(),
        streams: vec!["stats".into(), "histogram".into()],
        apps: ["sim", "sim", "sim", "analysis"].map(String::from).to_vec(),
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    let stored = reader(&tree.store);
    let covered = stored.rounds(Select::all()).unwrap();
    assert_eq!(
        covered.iter().filter(|r| r.covered == 64).count(),
        2 * rounds as usize
    );
    let allreduce = id("MPI_Allreduce");

    let stats = stored.stats(Select::all().stream(1)).unwrap();
    let apps: BTreeSet<Option<&str>> = stats.iter().map(|s| s.app.as_deref()).collect();
    assert_eq!(apps, [Some("analysis"), Some("sim")].into());
    // One row per (round, application, event, metric).
    let keys: BTreeSet<_> = stats
        .iter()
        .map(|s| (s.round, s.app.clone(), s.id, s.metric as i32))
        .collect();
    assert_eq!(keys.len(), stats.len());
    for s in &stats {
        assert_eq!(
            s.min_app, s.app,
            "round {} {:#x}: the minimum's holder",
            s.round, s.id
        );
        assert_eq!(
            s.max_app, s.app,
            "round {} {:#x}: the maximum's holder",
            s.round, s.id
        );
    }
    for (app, ranks) in [("sim", 48), ("analysis", 16)] {
        let counts: Vec<(u64, u64)> = stats
            .iter()
            .filter(|s| s.id == allreduce && s.metric == Metric::Exclusive && s.app.as_deref() == Some(app))
            .map(|s| (s.round, s.count))
            .collect();
        assert_eq!(
            counts,
            (0..rounds).map(|r| (r, ranks)).collect::<Vec<_>>(),
            "{app}: every round's Allreduce row counts its {ranks} ranks"
        );
        // No row of an application counts more ranks than it has.
        assert!(
            stats
                .iter()
                .filter(|s| s.app.as_deref() == Some(app))
                .all(|s| s.count <= ranks)
        );
    }

    // The histogram stream breaks down by application too: each application's summaries count its own ranks,
    // and each of its histograms holds them all, binned between that application's own bounds.
    let hist_stats = stored.stats(Select::all().stream(2)).unwrap();
    let bins = stored.histograms(Select::all().stream(2)).unwrap();
    for (app, ranks) in [("sim", 48u64), ("analysis", 16)] {
        let counts: Vec<u64> = hist_stats
            .iter()
            .filter(|s| s.id == allreduce && s.metric == Metric::Exclusive && s.app.as_deref() == Some(app))
            .map(|s| s.count)
            .collect();
        assert_eq!(counts, vec![ranks; rounds as usize], "{app}");
        for round in 0..rounds {
            let of: Vec<_> = bins
                .iter()
                .filter(|b| b.round == round && b.id == allreduce && b.metric == Metric::Exclusive)
                .filter(|b| b.app.as_deref() == Some(app))
                .collect();
            assert_eq!(
                of.iter().map(|b| b.count).sum::<u64>(),
                ranks,
                "{app} round {round}"
            );
            let row = hist_stats
                .iter()
                .find(|s| {
                    s.round == round
                        && s.id == allreduce
                        && s.metric == Metric::Exclusive
                        && s.app.as_deref() == Some(app)
                })
                .unwrap();
            let lo = of.iter().filter_map(|b| b.lo).fold(f64::INFINITY, f64::min);
            let hi = of.iter().filter_map(|b| b.hi).fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(
                (Some(lo), Some(hi)),
                (row.min, row.max),
                "{app} round {round}: its own bounds"
            );
        }
    }

    // Each round's coverage per application, through the relays: every application whole, in both streams.
    let per_app = stored.round_apps(Select::all()).unwrap();
    let whole: BTreeSet<(u32, u64, String, u32, u32)> = per_app
        .iter()
        .map(|r| (r.stream_id, r.round, r.app.clone(), r.covered, r.expected))
        .collect();
    let want: BTreeSet<(u32, u64, String, u32, u32)> = [1, 2]
        .into_iter()
        .flat_map(|stream| {
            (0..rounds).flat_map(move |round| {
                [("analysis", 16), ("sim", 48)].map(|(app, n)| (stream, round, app.to_string(), n, n))
            })
        })
        .collect();
    assert_eq!(whole, want);
}

async fn uintah(ranks: u32, params: &str) -> canopy_integration_tests::TreeSandbox {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks,
        rounds: 10,
        period_ms: 20,
        scenario: "uintah".into(),
        streams: vec!["classify".into()],
        stream_params: vec![("classify".into(), params.into())],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    tree
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uintah_amr_level_1_patches_give_three_classes_and_the_reduction_grows_with_ranks() {
    let small = uintah(64, L1_PATCHES).await;
    let stored = reader(&small.store);
    let mut rows: Vec<(u64, String, u64)> = stored
        .classes(Select::all())
        .unwrap()
        .into_iter()
        .map(|c| (c.round, c.ranks, c.size))
        .collect();
    rows.sort();
    assert_eq!(rows.len(), 3 * 10, "{rows:?}");
    for round in 0..10 {
        let classes: Vec<(&str, u64)> = rows
            .iter()
            .filter(|r| r.0 == round)
            .map(|r| (r.1.as_str(), r.2))
            .collect();
        assert_eq!(
            classes,
            vec![("sim:0", 1), ("sim:1-8", 8), ("sim:9-63", 55)],
            "round {round}"
        );
    }
    // The mean reduction factor over the rounds (SQL's AVG: rows without one do not count).
    let mean_factor = |rows: &[canopy_integration_tests::ReductionRow]| {
        let factors: Vec<f64> = rows.iter().filter_map(|r| r.reduction_factor).collect();
        factors.iter().sum::<f64>() / factors.len() as f64
    };
    let rf_small = mean_factor(&stored.reductions(Select::all()).unwrap());
    let large = uintah(256, L1_PATCHES).await;
    let reductions = reader(&large.store).reductions(Select::all()).unwrap();
    let rf_large = mean_factor(&reductions);
    let classes = reductions.iter().filter_map(|r| r.classes).max();
    assert_eq!(classes, Some(3));
    assert!(rf_small > 1.0, "reduction factor at 64 ranks: {rf_small}");
    assert!(
        rf_large > rf_small * 1.5,
        "reduction factor 64 ranks: {rf_small}, 256 ranks: {rf_large}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uintah_at_64_ranks_reduces_as_much_as_tom_fig_7_or_more() {
    // ToM at 64 ranks, 5 bins: AMR L1 patches 3 classes and RF about 12, MPI only 13 classes and RF 3, the
    // default scheme one class per rank and RF 0.98.
    for (params, classes, factor) in [
        (L1_PATCHES, 3, 12.0),
        (r#"{"scheme": "pattern", "pattern": "^MPI_"}"#, 13, 3.0),
        ("{}", 64, 0.98),
    ] {
        let tree = uintah(64, params).await;
        let stored = reader(&tree.store);
        let rounds = stored.rounds(Select::all()).unwrap();
        assert_eq!(rounds.len(), 10, "{params}");
        assert!(rounds.iter().all(|r| r.is_full()), "{params}: {rounds:?}");
        let reductions = stored.reductions(Select::all().late(false)).unwrap();
        assert_eq!(reductions.len(), 10, "{params}");
        for r in &reductions {
            assert_eq!(r.classes, Some(classes), "{params}: round {}", r.round);
            let rf = r.reduction_factor.unwrap();
            assert!(rf >= factor, "{params}: round {} reduction factor {rf}", r.round);
        }
        // Every class has a histogram of each event its members report: 5 bins each.
        let bins = stored.histograms(Select::all()).unwrap();
        assert!(!bins.is_empty() && bins.iter().all(|b| b.bin < 5 && b.metric == Metric::Exclusive));
    }
}

/// The utilization filter through real daemons: simulated namd ranks (entry methods and Idle) in time rounds of
/// 50 ms, over a tree of relays. Every round's result averages all 32 ranks over its 50 bins of 1 ms, names its
/// activities, and no bin's shares pass the whole bin; the entry methods and Idle are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namd_utilization_merges_every_rank_bin_by_bin_in_time_rounds() {
    use canopy_proto::filters::v1::UtilizationResult;
    use prost::Message;
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 32,
        rounds: 12,
        period_ms: 50,
        scenario: "namd".into(),
        streams: vec!["utilization".into()],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    let stored = reader(&tree.store);
    let rounds = stored.rounds(Select::all()).unwrap();
    assert_eq!(rounds.len(), 12, "{rounds:?}");
    let mut names = BTreeSet::new();
    for r in &rounds {
        assert_eq!((r.covered, r.expected), (32, 32), "{r:?}");
        let bytes = stored
            .final_result(r.stream_id, r.round)
            .unwrap()
            .expect("a result");
        let u = UtilizationResult::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            (u.profiles, u.without, u.bin_us),
            (32, 0, 1000),
            "round {}",
            r.round
        );
        assert_eq!(u.counts.len(), 50, "50 bins of 1 ms in 50 ms");
        assert!(u.ranks.iter().all(|&n| n == 32), "every rank covers every bin");
        let mut at = 0;
        for &c in &u.counts {
            let sum: u32 = u.share[at..at + c as usize].iter().sum();
            assert!(sum <= 250 + 2, "round {}: a bin sums to {sum}", r.round);
            at += c as usize;
        }
        assert_eq!(u.names.len(), u.activities.len());
        names.extend(u.names.iter().cloned());
    }
    assert!(names.contains("Idle"), "{names:?}");
    assert!(
        names.iter().any(|n| n != "Idle" && n != "other" && !n.is_empty()),
        "entry methods named: {names:?}"
    );
}
