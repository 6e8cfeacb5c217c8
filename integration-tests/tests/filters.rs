//! The standard filters end to end on real trees: the FLASH Allreduce anomaly at round 100 in stats and
//! histograms, and Uintah's three functional classes with a reduction factor that grows with the ranks.

use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::{TreeBuilder, query_i64};

fn per_round(store: &Path, sql: &str) -> Vec<(u64, f64)> {
    let conn =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = conn.prepare(sql).unwrap();
    st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, f64>(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn id(name: &str) -> i64 {
    canopy_proto::event_id(name) as i64
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
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    let store = tree.store.clone();
    assert_eq!(
        query_i64(&store, "SELECT COUNT(*) FROM rounds WHERE covered = 64"),
        2 * 105
    );
    let allreduce = id("MPI_Allreduce");

    // stats (stream 1): the mean exclusive Allreduce time of all 64 ranks, round by round.
    let means = per_round(
        &store,
        &format!(
            "SELECT round, mean FROM stats WHERE stream_id = 1 AND id = {allreduce} AND metric = 'exclusive' ORDER BY round"
        ),
    );
    assert_eq!(means.len(), 105);
    let at = |r: u64| means.iter().find(|(round, _)| *round == r).unwrap().1;
    assert!(
        at(100) >= 5.0 * at(99) && at(100) >= 5.0 * at(101),
        "99: {} 100: {} 101: {}",
        at(99),
        at(100),
        at(101)
    );
    let counts = query_i64(
        &store,
        &format!("SELECT MIN(count) FROM stats WHERE stream_id = 1 AND id = {allreduce}"),
    );
    assert_eq!(counts, 64);

    // histogram (stream 2): every round's bins hold all 64 ranks, and round 100's range sits far above.
    let sums = per_round(
        &store,
        &format!(
            "SELECT round, SUM(count) FROM histograms WHERE stream_id = 2 AND id = {allreduce} AND metric = 'exclusive' GROUP BY round ORDER BY round"
        ),
    );
    assert_eq!(sums.len(), 105);
    assert!(sums.iter().all(|(_, n)| *n == 64.0), "{sums:?}");
    let lows = per_round(
        &store,
        &format!(
            "SELECT round, MIN(lo) FROM histograms WHERE stream_id = 2 AND id = {allreduce} AND metric = 'exclusive' GROUP BY round"
        ),
    );
    let highs = per_round(
        &store,
        &format!(
            "SELECT round, MAX(hi) FROM histograms WHERE stream_id = 2 AND id = {allreduce} AND metric = 'exclusive' GROUP BY round"
        ),
    );
    let lo = |r: u64| lows.iter().find(|(x, _)| *x == r).unwrap().1;
    let hi = |r: u64| highs.iter().find(|(x, _)| *x == r).unwrap().1;
    assert!(
        lo(100) > hi(99) && lo(100) > hi(101),
        "round 100's whole histogram lies above its neighbours'"
    );
    assert_eq!(
        query_i64(
            &store,
            "SELECT COUNT(DISTINCT bin) FROM histograms WHERE stream_id = 2"
        ),
        10,
        "default bins"
    );
}

/// Runs the uintah scenario under classify with the "AMR L1 Patch Only" scheme; returns the store's path
/// and the tree (kept alive for the store's directory).
async fn uintah(ranks: u32) -> canopy_integration_tests::TreeSandbox {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks,
        rounds: 10,
        period_ms: 20,
        scenario: "uintah".into(),
        streams: vec!["classify".into()],
        stream_params: vec![(
            "classify".into(),
            r#"{"scheme": "pattern", "pattern": "^Patch 1 ->"}"#.into(),
        )],
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
    let small = uintah(64).await;
    let conn = rusqlite::Connection::open(&small.store).unwrap();
    let mut st = conn
        .prepare("SELECT round, ranks, size FROM classes ORDER BY round, ranks")
        .unwrap();
    let rows: Vec<(i64, String, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 3 * 10, "{rows:?}");
    for round in 0..10 {
        let classes: Vec<(&str, i64)> = rows
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
    let rf_small: f64 = conn
        .query_row("SELECT AVG(reduction_factor) FROM reductions", [], |r| r.get(0))
        .unwrap();
    let large = uintah(256).await;
    let conn = rusqlite::Connection::open(&large.store).unwrap();
    let rf_large: f64 = conn
        .query_row("SELECT AVG(reduction_factor) FROM reductions", [], |r| r.get(0))
        .unwrap();
    let classes: i64 = conn
        .query_row("SELECT MAX(classes) FROM reductions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(classes, 3);
    assert!(rf_small > 1.0, "reduction factor at 64 ranks: {rf_small}");
    assert!(
        rf_large > rf_small * 1.5,
        "reduction factor 64 ranks: {rf_small}, 256 ranks: {rf_large}"
    );
}
