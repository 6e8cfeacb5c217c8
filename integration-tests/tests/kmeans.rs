//! The kmeans filter end to end: simulated Uintah ranks on a real tree of agents and relays, clustered with
//! k = 3 on the exclusive time of their level-1 patch events, fall into exactly the scenario's three groups
//! (rank 0 regridding, ranks 1-8 on the large patches, the rest on none) in every round, each stored as the
//! round's result and tabulated in `clusters`.

use std::time::Duration;

use std::process::Command;

use canopy_integration_tests::{
    Select, TreeBuilder, TreeSandbox, assert_figure_drawn, bin_dir, browser_dom, reader,
};
use canopy_proto::filters::v1::KmeansResult;
use prost::Message;

/// Runs 64 uintah ranks over 4 agents under 2 relays with one kmeans stream of `params`; the tree (kept for its
/// store) and the results by round.
async fn uintah(params: &str) -> (TreeSandbox, Vec<KmeansResult>) {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 64,
        rounds: 6,
        period_ms: 20,
        scenario: "uintah".into(),
        streams: vec!["kmeans".into()],
        stream_params: vec![("kmeans".into(), params.into())],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("front-end finishes");
    let stored = reader(&tree.store);
    let rounds = stored.rounds(Select::all()).unwrap();
    assert_eq!(rounds.len(), 6, "{rounds:?}");
    assert!(rounds.iter().all(|r| r.is_full()), "{rounds:?}");
    // The store's tables say the same: three clusters a round, of 1, 8 and 55 ranks.
    let mut sizes: Vec<(u64, u64)> = stored
        .clusters(Select::all())
        .unwrap()
        .iter()
        .map(|c| (c.round, c.size))
        .collect();
    sizes.sort();
    let want: Vec<(u64, u64)> = (0..6).flat_map(|r| [(r, 1), (r, 8), (r, 55)]).collect();
    assert_eq!(sizes, want);
    let results = rounds
        .iter()
        .map(|r| {
            let bytes = stored
                .final_result(r.stream_id, r.round)
                .unwrap()
                .expect("a result");
            KmeansResult::decode(bytes.as_slice()).unwrap()
        })
        .collect();
    (tree, results)
}

fn canopy(args: &[&str]) -> String {
    let out = Command::new(bin_dir().join("canopy"))
        .args(args)
        .output()
        .expect("canopy runs");
    assert!(
        out.status.success(),
        "canopy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each cluster's ranks as "first-last" text, sorted.
fn groups(r: &KmeansResult) -> Vec<String> {
    let mut out: Vec<String> = r
        .clusters
        .iter()
        .map(|c| {
            c.ranks
                .iter()
                .map(|rr| format!("{}:{}-{}", rr.app, rr.first, rr.last))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kmeans_finds_uintahs_three_groups_through_relays() {
    // Exclusive time (the default metric) of the level-1 patch events.
    let (tree, results) = uintah(r#"{"k": 3, "scheme": "pattern", "pattern": "^Patch 1 ->"}"#).await;
    for (round, r) in results.iter().enumerate() {
        assert_eq!(
            groups(r),
            ["sim:0-0", "sim:1-8", "sim:9-63"],
            "round {round}: {r:?}"
        );
        assert_eq!((r.k, r.ranks, r.dims.len()), (3, 64, 16), "round {round}");
        assert!(r.converged && r.refit && r.iterations >= 2, "round {round}");
        assert_eq!(r.fits.len(), 1);
        let fit: f64 = r.clusters.iter().map(|c| c.sum_squares).sum();
        assert_eq!(r.fit, fit, "round {round}");
        for c in &r.clusters {
            // The representative is a member, and no member is further from the centroid than max_distance.
            let rep = c.representative.as_ref().unwrap();
            assert!(
                c.ranks.iter().any(|rr| (rr.first..=rr.last).contains(&rep.rank)),
                "round {round}: {c:?}"
            );
            assert!(c.rms <= c.max_distance, "round {round}: {c:?}");
        }
        assert!(
            r.names.iter().all(|n| n.starts_with("Patch 1 -> ")),
            "{:?}",
            r.names
        );
    }

    // canopy export writes the clusters table, canopy report draws the clusters section.
    let store = tree.store.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let csv_dir = dir.path().join("csv");
    canopy(&[
        "export",
        store,
        "--format",
        "csv",
        "--table",
        "clusters",
        "--out",
        csv_dir.to_str().unwrap(),
    ]);
    let mut csv = csv::Reader::from_path(csv_dir.join("clusters.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let mut rows: Vec<(String, String, String)> = csv
        .records()
        .map(Result::unwrap)
        .map(|r| {
            (
                r[col("round")].to_string(),
                r[col("ranks")].to_string(),
                r[col("size_ranks")].to_string(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(rows.len(), 18, "{rows:?}");
    assert_eq!(
        rows[..3],
        [
            ("0".to_string(), "sim:0".to_string(), "1".to_string()),
            ("0".to_string(), "sim:1-8".to_string(), "8".to_string()),
            ("0".to_string(), "sim:9-63".to_string(), "55".to_string()),
        ]
    );
    let page = dir.path().join("run.html");
    canopy(&["report", store, "-o", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("Clusters: kmeans") && html.contains("clusters:kmeans"),
        "no clusters section"
    );
    if let Some(dom) = browser_dom(&page) {
        let rounds = reader(std::path::Path::new(store))
            .rounds(Select::all())
            .unwrap()
            .iter()
            .map(|r| r.round)
            .max()
            .unwrap();
        assert_figure_drawn(&dom, "clusters:kmeans", rounds as usize + 1);
    }
}
